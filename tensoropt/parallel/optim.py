"""Stock ``torch.optim`` optimizers over a parallel model's parameters, stepped on local shards.

The user builds any optimizer over ``pm.parameters()`` (DTensors) and calls ``opt.step()``.
tensoropt registers torch's *global* optimizer step hooks once (``register_optimizer_step_pre_hook``
/ ``..._post_hook``); for an optimizer that holds parallel-model parameters:

* ``SGD`` (with or without momentum), ``Adam`` and ``AdamW`` (any param groups, weight decay,
  betas, amsgrad) are stepped in the pre-hook by :func:`tensoropt.executor.state.local_optim.step_local`
  (torch's fused or foreach kernels on the local tensors behind the DTensors; state created by
  the optimizer's own ``_init_group``, kept as DTensors, so checkpoints reshard it); the gradients
  are then hidden from the optimizer's own ``step`` (which finds nothing to do) and given back in
  the post-hook. This is ``tensoropt run``'s optimizer step. Steps the DTensor interpreter runs
  (``mode="interpret"``, and the measured step of ``tensoropt run``) are the reference: there the
  optimizer steps the DTensors itself.
* any other optimizer steps through DTensor dispatch: correct, slower (a one-line note, once).
* after either, ZeRO-1/2 shard parameters are all-gathered into the parameters the step reads.
* in ``fp16-mixed`` the gradients are first unscaled; where one is not finite on some rank the
  step is skipped (every gradient hidden from it) and the loss scale halves, as ``GradScaler`` does.

An optimizer holding parallel-model parameters *and* other tensors, or the model's original
parameters (built before :func:`tensoropt.parallelize` replaced them), is refused at its first
``step()``, before anything changes (:class:`ForeignParameters`).

Example:
    >>> w = torch.nn.Parameter(torch.ones(1))
    >>> opt = torch.optim.SGD([w], lr=0.5); w.grad = torch.ones(1)
    >>> opt.step(); w.tolist()  # no parallel model's parameter: the hooks leave it alone
    [0.5]
"""

from __future__ import annotations

import sys
import weakref

import torch

from tensoropt.executor.state.local_optim import step_local

FAST = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)
"""Optimizer classes stepped on local shards (exactly these classes: a subclass may change step)."""


class ForeignParameters(ValueError):
    """An optimizer holds tensors that are not the parallel model's parameters."""


_OWNED: dict[int, tuple[weakref.ref, weakref.ref]] = {}
"""id(parameter) -> (the parameter, its runtime), weakly: every parallel model's parameters."""
_REPLACED: dict[int, tuple[weakref.ref, str]] = {}
"""id(original parameter) -> (it, its key): the model's parameters before parallelize replaced them."""
_HOOKS: list = []
_NOTED: set[str] = set()


def register(runtime, params: dict[str, torch.Tensor], originals: dict[str, torch.Tensor]) -> None:
    """Record a parallel model's parameters (``params``: name -> installed parameter) and the
    ``originals`` they replaced; install the global hooks the first time.

    Example:
        >>> # not run here: tensoropt.parallelize calls it
        >>> register(runtime, dict(pm.named_parameters()), originals)  # doctest: +SKIP
    """
    ref = weakref.ref(runtime)
    for p in params.values():
        _OWNED[id(p)] = (weakref.ref(p), ref)
    for key, p in originals.items():
        if not any(p is q for q in params.values()):
            _REPLACED[id(p)] = (weakref.ref(p), key)
    if not _HOOKS:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        _HOOKS.append(register_optimizer_step_pre_hook(_pre_hook))
        _HOOKS.append(register_optimizer_step_post_hook(_post_hook))


def _lookup(table: dict, p: torch.Tensor):
    entry = table.get(id(p))
    if entry is None or entry[0]() is not p:
        return None
    return entry[1]


def runtimes_of(optimizer: torch.optim.Optimizer) -> list:
    """The runtimes whose parameters ``optimizer`` holds (empty: not a parallel model's optimizer).

    Raises:
        ForeignParameters: it holds a parallel model's parameters together with other tensors, or
            the original parameters a parallel model replaced.

    Example:
        >>> runtimes_of(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1))
        []
    """
    found, foreign, replaced = {}, None, None
    for g, group in enumerate(optimizer.param_groups):
        for i, p in enumerate(group["params"]):
            ref = _lookup(_OWNED, p)
            if ref is not None and ref() is not None:
                found[id(ref())] = ref()
                continue
            key = _lookup(_REPLACED, p)
            if key is not None and replaced is None:
                replaced = (g, i, key)
            elif foreign is None:
                foreign = (g, i, tuple(p.shape))
    name = type(optimizer).__name__
    if replaced is not None:
        g, i, key = replaced
        raise ForeignParameters(
            f"{name}: param group {g} holds the model's original parameter {key!r} (#{i}), which "
            "tensoropt.parallelize replaced; build the optimizer after parallelize, over pm.parameters()")
    if found and foreign is not None:
        g, i, shape = foreign
        raise ForeignParameters(
            f"{name}: param group {g} holds a tensor of shape {list(shape)} (#{i}) that is not a parameter "
            "of the parallel model; build the optimizer over pm.parameters() / pm.named_parameters() only")
    return list(found.values())


def _cached_runtimes(optimizer) -> list:
    count = sum(len(g["params"]) for g in optimizer.param_groups)
    cached = optimizer.__dict__.get("_tensoropt_runtimes")
    if cached is None or cached[0] != count:
        cached = (count, runtimes_of(optimizer))
        optimizer.__dict__["_tensoropt_runtimes"] = cached
    return cached[1]


def _pre_hook(optimizer, args, kwargs):
    runtimes = _cached_runtimes(optimizer)
    if not runtimes:
        return None
    for runtime in runtimes:
        runtime.check_synchronised()
    finite = all([runtime.unscale() for runtime in runtimes])  # fp16-mixed (a collective each)
    optimizer.__dict__["_tensoropt_skipped"] = not finite
    args = args[1:] if args and args[0] is optimizer else args  # torch passes (self, *args)
    # the interpreter's steps (interpret mode, the measured step of `tensoropt run`) are the reference:
    # the optimizer steps its DTensors itself there
    local = (type(optimizer) in FAST and not args and not kwargs
             and not any(rt.interpret_steps for rt in runtimes))
    if not finite or local:
        if finite:
            step_local(optimizer)
        hidden = []
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    hidden.append((p, p.grad))
                    p.grad = None
        optimizer.__dict__["_tensoropt_hidden"] = hidden
    elif type(optimizer) not in FAST:
        name = type(optimizer).__name__
        if name not in _NOTED:
            _NOTED.add(name)
            print(f"[tensoropt] note: {name} steps through DTensor dispatch (correct, slower); SGD, Adam and "
                  "AdamW step the local shards directly", file=sys.stderr, flush=True)
    return None


def _post_hook(optimizer, args, kwargs):
    runtimes = optimizer.__dict__.get("_tensoropt_runtimes", (0, []))[1]
    for p, grad in optimizer.__dict__.pop("_tensoropt_hidden", []):
        p.grad = grad
    for runtime in runtimes:
        runtime.unscaled = None  # the next step's gradients hold the loss scale again
    if optimizer.__dict__.pop("_tensoropt_skipped", False):  # fp16-mixed: a gradient overflowed
        return
    for runtime in runtimes:
        runtime.after_optimizer_step()
