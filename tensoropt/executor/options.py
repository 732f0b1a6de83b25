"""Memory options of a plan's nodes in the executor: ``recompute`` and ``zero3``.

See :mod:`tensoropt.configspace.options` for what they mean and
:mod:`estimators.options` for what they cost.

* ``recompute``: the node's op runs under ``torch.utils.checkpoint`` (non-reentrant), on its
  operands already laid out: autograd keeps the operands (every tensor argument, at top level,
  so the storage-counting measurement sees them) instead of what the op would save, and runs the
  op again in backward. The partial-sum reduction after the op stays outside.
* ``zero3``: the node's parameters are stored in the configuration's ``params`` layout (sharded
  over the gradient-sync axes; the trainer distributes them so), laid out to the compute layout
  (:func:`tensoropt.configspace.options.compute_params`: an all-gather, whose backward
  reduce-scatters the gradient to the stored shard) right before the op, and not kept: a
  saved-tensor hook replaces every saved view of a gathered parameter by a recipe that gathers it
  again in backward. Other saved tensors go to the hooks that were active (the trainer's
  measurement).

Example:
    >>> out, bias = run_node(interpreter, node, config)  # doctest: +SKIP
"""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

from tensoropt.configspace.configuration import Configuration
from tensoropt.configspace.options import base_configuration
from tensoropt.executor.memory import local
from tensoropt.executor.program import arg_nodes


def _storage(t: torch.Tensor) -> int:
    return local(t).untyped_storage().data_ptr()


class RegatherHooks:
    """Saved-tensor hooks that keep a gathered parameter as (stored shard, recipe), not its data.

    Args:
        gathered: (stored parameter, gathered value) pairs of one node.

    Example:
        >>> with RegatherHooks([]):  # no parameters: every tensor goes to the outer hooks
        ...     y = (torch.ones(2, requires_grad=True) * 2).sum()
    """

    def __init__(self, gathered: list[tuple[torch.Tensor, torch.Tensor]]):
        self.by_storage = {_storage(g): (stored, g) for stored, g in gathered}
        self._outer = None
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def __enter__(self) -> RegatherHooks:
        self._outer = torch._C._autograd._top_saved_tensors_default_hooks(False)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)

    def _pack(self, t: torch.Tensor):
        hit = self.by_storage.get(_storage(t)) if isinstance(t, torch.Tensor) else None
        if hit is None:
            return ("outer", self._outer[0](t)) if self._outer else ("plain", t)
        stored, g = hit
        lt = local(t)
        view = (tuple(lt.size()), tuple(lt.stride()), lt.storage_offset())
        spec = (t.device_mesh, tuple(t.placements), tuple(t.shape), tuple(t.stride())) \
            if isinstance(t, DTensor) else None
        return ("regather", stored, tuple(g.placements), view, spec)

    def _unpack(self, packed):
        kind = packed[0]
        if kind == "plain":
            return packed[1]
        if kind == "outer":
            return self._outer[1](packed[1])
        _, stored, placements, (size, stride, offset), spec = packed
        with torch.no_grad():
            full = stored.detach().redistribute(stored.device_mesh, placements)
            lt = local(full).as_strided(size, stride, offset)
            if spec is None:
                return lt
            mesh, view_placements, shape, global_stride = spec
            return DTensor.from_local(lt, mesh, view_placements, run_check=False, shape=shape,
                                      stride=global_stride)


def _checkpointed(compute, n: fx.Node, args, kwargs):
    """``compute(n, args, kwargs)`` under non-reentrant checkpoint, tensors passed at top level."""
    leaves, tree = pytree.tree_flatten((args, kwargs))
    biases = []

    def fn(*values):
        a, k = pytree.tree_unflatten(list(values), tree)
        out, bias = compute(n, a, k)
        if not biases:
            biases.append(bias)
        return out

    out = checkpoint(fn, *leaves, use_reentrant=False)
    return out, biases[0]


def _gathered(interp, n: fx.Node, before: set) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(stored, gathered) parameters of ``n``'s zero3 layout; their memo entries are dropped."""
    stored = set()
    for a, o in zip(arg_nodes(n), interp.operands.get(n.name, [])):
        if o["role"] == "param":
            root = interp._chain(a)[1]
            stored.add(id(interp.env[root]))
    pairs = []
    sources = set(stored)
    for key in [k for k in interp._memo if k not in before]:
        src, moved = interp._memo[key]
        if id(src) in sources:
            if key[0] == "redistribute" and id(src) in stored:
                pairs.append((src, moved))
            sources.add(id(moved))
            del interp._memo[key]
    return pairs


def run_node(interp, n: fx.Node, config: Configuration):
    """Lay out and run ``n`` under a configuration with memory options; returns (raw output, bias).

    Example:
        >>> out, bias = run_node(interpreter, node, config)  # doctest: +SKIP
    """
    base = base_configuration(config)
    before = set(interp._memo)
    args, kwargs = interp._lay_out_operands(n, base)
    gathered = _gathered(interp, n, before) if "zero3" in config.options else []
    hooks = RegatherHooks(gathered) if gathered else None
    if hooks is not None:
        hooks.__enter__()
    try:
        if "recompute" in config.options:
            return _checkpointed(interp._compute, n, args, kwargs)
        return interp._compute(n, args, kwargs)
    finally:
        if hooks is not None:
            hooks.__exit__(None, None, None)
