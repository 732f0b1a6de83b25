"""Build the model without its weights, then materialise each parameter's local shard only.

A rank never holds the whole model. The model is constructed with every parameter on the
``meta`` device (:func:`build_skeleton`; buffers, which are small and often computed by the
constructor, such as a causal mask or rotary frequencies, keep their constructed host values),
exported on meta tensors, and each parameter is then given its initial value on the host one
module at a time (:func:`materialize`); the caller keeps its rank's shard and drops the rest, so
the host's transient peak is one module's parameters, not the model.

The initial values follow one scheme, whatever the plan or device count (the 1-process reference
run, :meth:`TrainSpec.build_model`, uses it too, so parity holds):

* modules are visited in post-order (children before their parent, as ``nn.Module.apply`` and
  HuggingFace's ``initialize_weights`` do); module ``m`` at path ``p`` runs
  ``m.reset_parameters()`` if it has one, then ``owner._init_weights(m)`` where ``owner`` is the
  nearest module at or above ``m`` defining ``_init_weights(module)`` (HuggingFace models,
  nanoGPT-style roots), under a generator seeded from ``(spec seed, p)``;
* during that call every parameter of ``m``'s subtree is a fresh host tensor (``torch.empty``:
  address space only, no pages touched until written); a dispatch mode records which storages the
  call writes, and only those are handed to the caller (a later writer, a parent, overrides);
* a parameter no init writes keeps the value its constructor gave it, captured at registration
  for modules without ``reset_parameters`` (``nn.Parameter(torch.ones(d))`` and the like).

Limits (documented in docs/user-guide.md): a constructor's own initialisation outside
``reset_parameters`` / ``_init_weights`` (a loop over ``named_parameters`` after construction)
is not reproduced, nor an init that reads another module's parameter or writes part of a
descendant's; name the exact weights in the job's ``model.checkpoint`` instead.

Example:
    >>> from tensoropt.executor.job.data import InputSpec
    >>> from tensoropt.executor.job.spec import TrainSpec
    >>> spec = TrainSpec("torch.nn:Linear", (InputSpec((2,)),), 4, {"in_features": 2, "out_features": 3})
    >>> skeleton = build_skeleton(spec)
    >>> skeleton.module.weight.device.type
    'meta'
    >>> got = {}
    >>> materialize(skeleton, lambda keys, value: got.update({keys[0]: value}))
    >>> sorted(got), tuple(got["weight"].shape)
    (['bias', 'weight'], (3, 2))
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

Keep = Callable[[list[str], torch.Tensor], None]
"""``keep(keys, host_value)``: every state-dict key of one parameter (tied keys together) and its
full initial value on the host; the caller keeps what it needs (its shard) and drops the rest."""


@dataclass
class Skeleton:
    """A constructed model whose parameters are on ``meta``.

    Attributes:
        module: the model; parameters on meta, buffers with their constructed host values.
        seed: the spec's seed (each module's init generator is derived from it and its path).
        captured: storage id of a meta parameter -> its constructor value (modules without
            ``reset_parameters`` only).
    """

    module: nn.Module
    seed: int = 0
    captured: dict[int, torch.Tensor] = field(default_factory=dict)

    def buffers(self) -> dict[str, torch.Tensor]:
        """State-dict key -> host value of every buffer (non-persistent ones included)."""
        return dict(self.module.named_buffers(remove_duplicate=False))


@contextlib.contextmanager
def params_on_meta(captured: dict[int, torch.Tensor]) -> Iterator[None]:
    """Inside, every parameter a module registers moves to ``meta`` (buffers stay where built).

    A parameter registered by a module without ``reset_parameters`` leaves its constructed value
    in ``captured`` (keyed by the meta parameter's storage id), since no init could recreate it.

    Example:
        >>> kept = {}
        >>> with params_on_meta(kept):
        ...     lin = nn.Linear(2, 2)
        >>> lin.weight.device.type, kept
        ('meta', {})
    """
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is None or param.is_meta:
            return
        meta = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
        if not callable(getattr(module, "reset_parameters", None)):
            captured[_storage_id(meta)] = param.detach()
        module._parameters[name] = meta

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = original


def build_skeleton(spec) -> Skeleton:
    """Construct ``spec``'s model with its parameters on meta (nothing of their size allocated).

    Args:
        spec: a :class:`tensoropt.executor.job.spec.TrainSpec` (its ``construct_model`` is called with
            the global generator seeded from ``spec.seed``, for constructor-made values).

    Example:
        >>> from tensoropt.executor.job.data import InputSpec
        >>> from tensoropt.executor.job.spec import TrainSpec
        >>> spec = TrainSpec("torch.nn:Linear", (InputSpec((2,)),), 4, {"in_features": 2, "out_features": 3})
        >>> build_skeleton(spec).module.weight.is_meta
        True
    """
    captured: dict[int, torch.Tensor] = {}
    with torch.random.fork_rng(devices=[]), params_on_meta(captured):
        torch.default_generator.manual_seed(spec.seed)
        module = spec.construct_model()
    for p in module.parameters():
        if not p.is_meta:
            raise ValueError(f"model {spec.model!r}: parameter of shape {tuple(p.shape)} was not created "
                             "through nn.Module.register_parameter; build parameters as nn.Parameter "
                             "attributes")
    return Skeleton(module, spec.seed, captured)


def module_seed(seed: int, path: str) -> int:
    """The init generator's seed of the module at ``path`` (stable across runs and platforms).

    Example:
        >>> module_seed(0, "body.0") == module_seed(0, "body.0") != module_seed(1, "body.0")
        True
    """
    digest = hashlib.sha256(f"{seed}/{path}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % (2**63)


def materialize(skeleton: Skeleton, keep: Keep) -> None:
    """Give every parameter its initial value, one module at a time, calling ``keep`` as written.

    ``keep(keys, value)`` may be called again for a parameter a later init (a parent's) rewrites:
    the last call holds its initial value. Every parameter gets at least one call.

    Args:
        skeleton: from :func:`build_skeleton` (its meta parameters stay in place).
        keep: receives each parameter's state-dict keys and its full host value.

    Raises:
        ValueError: a parameter that no init writes and whose constructor value was not kept.

    Example:
        >>> from tensoropt.executor.job.data import InputSpec
        >>> from tensoropt.executor.job.spec import TrainSpec
        >>> spec = TrainSpec("torch.nn:Linear", (InputSpec((2,)),), 4, {"in_features": 2, "out_features": 1})
        >>> a, b = {}, {}
        >>> materialize(build_skeleton(spec), lambda k, v: a.update({k[0]: v}))
        >>> materialize(build_skeleton(spec), lambda k, v: b.update({k[0]: v}))
        >>> bool((a["weight"] == b["weight"]).all())
        True
    """
    root = skeleton.module
    keys_of: dict[int, list[str]] = {}
    for key, p in root.named_parameters(remove_duplicate=False):
        keys_of.setdefault(_storage_id(p), []).append(key)
    done: set[int] = set()
    for path, module in _post_order(root):
        init = _init_call(root, path, module)
        if init is None:
            continue
        for sid, value in _run_init(module, init, module_seed(skeleton.seed, path)):
            keep(keys_of[sid], value)
            done.add(sid)
            skeleton.captured.pop(sid, None)
    for sid, keys in keys_of.items():
        if sid in done:
            continue
        if sid not in skeleton.captured:
            raise ValueError(
                f"parameter {keys[0]!r}: no reset_parameters() or _init_weights() writes it, so its initial "
                "value cannot be made shard by shard; give its module a reset_parameters() or name the "
                "weights in the job's model.checkpoint"
            )
        keep(keys, skeleton.captured[sid].clone())


def full_model(skeleton: Skeleton) -> nn.Module:
    """The skeleton's module with every parameter materialised in full on the host (the reference).

    Example:
        >>> from tensoropt.executor.job.data import InputSpec
        >>> from tensoropt.executor.job.spec import TrainSpec
        >>> spec = TrainSpec("torch.nn:Linear", (InputSpec((2,)),), 4, {"in_features": 2, "out_features": 1})
        >>> full_model(build_skeleton(spec)).weight.is_meta
        False
    """
    root = skeleton.module
    values: dict[str, torch.Tensor] = {}
    materialize(skeleton, lambda keys, value: values.update(dict.fromkeys(keys, value)))
    real: dict[int, nn.Parameter] = {}
    for key, p in root.named_parameters(remove_duplicate=False):
        real.setdefault(_storage_id(p), nn.Parameter(values[key], requires_grad=p.requires_grad))
    for _, module, name, p in list(_param_slots(root)):
        module._parameters[name] = real[_storage_id(p)]
    return root


@contextlib.contextmanager
def buffers_on_meta(module: nn.Module) -> Iterator[None]:
    """Inside, every buffer of ``module`` is a meta tensor (for exporting on meta inputs).

    Example:
        >>> bn = nn.BatchNorm1d(2)
        >>> with buffers_on_meta(bn):
        ...     bn.running_mean.is_meta
        True
        >>> bn.running_mean.is_meta
        False
    """
    saved = []
    for m in module.modules():
        for name, b in m._buffers.items():
            if b is not None:
                saved.append((m, name, b))
                m._buffers[name] = b.to("meta")
    try:
        yield
    finally:
        for m, name, b in saved:
            m._buffers[name] = b


def _storage_id(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _post_order(root: nn.Module, path: str = "", seen: set | None = None) -> Iterator[tuple[str, nn.Module]]:
    """(path, module) children before parents, each module once (the first path it is reached by)."""
    seen = set() if seen is None else seen
    if id(root) in seen:
        return
    seen.add(id(root))
    for name, child in root.named_children():
        yield from _post_order(child, f"{path}.{name}" if path else name, seen)
    yield path, root


def _init_call(root: nn.Module, path: str, module: nn.Module) -> Callable[[], None] | None:
    """The module's init: its reset_parameters, then the nearest ``_init_weights(module)`` above it."""
    calls = []
    reset = getattr(module, "reset_parameters", None)
    if callable(reset):
        calls.append(reset)
    owner = _init_owner(root, path)
    if owner is not None:
        calls.append(lambda: owner._init_weights(module))
    if not calls:
        return None
    return lambda: [c() for c in calls]


def _init_owner(root: nn.Module, path: str) -> nn.Module | None:
    """The deepest module on the path from ``root`` to ``path`` with a one-argument ``_init_weights``."""
    chain = [root]
    for part in path.split(".") if path else []:
        chain.append(getattr(chain[-1], part))
    for m in reversed(chain):
        fn = getattr(m, "_init_weights", None)
        if not callable(fn):
            continue
        try:
            takes_module = len(inspect.signature(fn).parameters) == 1  # bound: (module)
        except (TypeError, ValueError):
            continue
        if takes_module:
            return m
    return None


def _param_slots(module: nn.Module) -> Iterator[tuple[str, nn.Module, str, nn.Parameter]]:
    """(module path, module, attribute name, parameter) of every parameter slot, tied slots included."""
    for path, m in module.named_modules(remove_duplicate=False):
        for name, p in m._parameters.items():
            if p is not None:
                yield path, m, name, p


def _run_init(module: nn.Module, init: Callable[[], None], seed: int) -> list[tuple[int, torch.Tensor]]:
    """Run ``init`` with the subtree's parameters as fresh host tensors; (meta storage id, value) written."""
    slots = list(_param_slots(module))
    fresh: dict[int, torch.Tensor] = {}
    for _, m, name, p in slots:
        sid = _storage_id(p)
        if sid not in fresh:
            fresh[sid] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype), requires_grad=p.requires_grad)
        m._parameters[name] = fresh[sid]
    writes = _Writes()
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad(), writes:
            torch.default_generator.manual_seed(seed)
            init()
        written = []
        for _, m, name, p in slots:
            now = m._parameters[name]
            sid = _storage_id(p)
            if now is not fresh[sid] and now is not None and not now.is_meta:  # the init replaced it
                written.append((sid, now.detach()))
            elif _storage_id(fresh[sid]) in writes.storages:
                written.append((sid, fresh[sid].detach()))
        return list(dict(written).items())
    finally:
        for _, m, name, p in slots:
            m._parameters[name] = p


class _Writes(TorchDispatchMode):
    """Records the storages that in-place and out= ops write."""

    def __init__(self):
        super().__init__()
        self.storages: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for i, arg in enumerate(func._schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                t = args[i] if i < len(args) else kwargs.get(arg.name)
                if isinstance(t, torch.Tensor):
                    self.storages.add(_storage_id(t))
        return func(*args, **kwargs)
