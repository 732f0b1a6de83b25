"""The fallback for ops with no parallel rule: run the op on local tensors, wrap the result.

Capture gives an op it has no rule for the kind ``opaque`` (``tensoropt.capture.ops.op_kind``);
the configuration space offers it ``replicate`` and, where shape-safe and sample-local, ``batch``
only. DTensor may have no sharding strategy for such an op (forward or backward), so the executor
does not hand it to DTensor: the interpreter has already laid each operand out as the configuration
says (all replicated, or batch-split on dim 0), and :func:`run_local` runs the op on the local
tensors and wraps each tensor result as a DTensor with the configuration's output layout. Autograd
runs through the local op; the gradients of replicated operands of a batch-split op are partial
sums over the batch axes (each rank saw its own samples), as DTensor would give them.

The cost model prices such a node as what it is: the op's compute on each device's operands (the
whole tensor when replicated), with the redistributions to and from its layouts on the edges.
"""

from __future__ import annotations

import torch
import torch.fx as fx
from torch.distributed.tensor import DeviceMesh, DTensor, Partial, Replicate, Shard

from tensoropt.capture.ops import op_kind
from tensoropt.capture.views import VIEW_OPS
from tensoropt.configspace.configuration import Configuration
from tensoropt.executor.job.program import op_name
from tensoropt.executor.ops.placements import normalise, to_placements

LOCAL_KINDS = ("opaque", "broadcast")
"""Kinds run here: ``opaque`` (no rule), and ``broadcast`` (``broadcast_tensors``), whose local result
on operands laid out as its configuration says (aligned by broadcasting: a size-1 dim stays whole
where the output splits it) is each element's shard in the output's layout, for any split."""


class FallbackError(RuntimeError):
    """The fallback cannot wrap an op's result in the configuration's layout."""


def fallback_nodes(graph: fx.Graph) -> set[str]:
    """Names of the call_function nodes whose op capture knows no rule for (kind ``opaque``; views,
    which capture folds into edges, are not among them).

    Example:
        >>> g = fx.Graph(); x = g.placeholder("x")
        >>> _ = g.call_function(torch.ops.aten.cumsum.default, (x, 1))
        >>> _ = g.call_function(torch.ops.aten.relu.default, (x,))
        >>> sorted(fallback_nodes(g))
        ['cumsum_default']
    """
    return {n.name for n in graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
            and op_name(n) not in VIEW_OPS and op_kind(op_name(n)) in LOCAL_KINDS}


def _grad_placements(x: DTensor, out_placements) -> list:
    """Placements of the gradient of ``x``'s local tensor: partial on the axes where the output is
    split but ``x`` is replicated (a parameter beside a batch-split op), else ``x``'s own."""
    return [Partial() if isinstance(o, Shard) and isinstance(p, Replicate) else p
            for p, o in zip(x.placements, out_placements)]


def run_local(node_name: str, op, args: tuple, kwargs: dict, config: Configuration, mesh: DeviceMesh):
    """Run ``op`` on the local tensors of its laid-out operands; outputs get ``config.output``.

    Args:
        node_name: for error messages. op: the aten op. args, kwargs: its arguments, every tensor a
            DTensor laid out as ``config`` says. config: the node's configuration (replicate or
            batch). mesh: the device mesh.

    Returns:
        The op's result with each tensor wrapped as a DTensor (a tuple or list stays one).

    Example:
        >>> # not run here: needs a process group's mesh
        >>> run_local("cumsum", torch.ops.aten.cumsum.default, (x, 1), {}, cfg, mesh)  # doctest: +SKIP
    """
    out_layout = tuple(config.output)
    out_placements = to_placements(normalise(out_layout, 1)) if out_layout else ()

    def local(a):
        if isinstance(a, DTensor):
            return a.to_local(grad_placements=_grad_placements(a, out_placements))
        if isinstance(a, (list, tuple)):
            return type(a)(local(x) for x in a)
        return a

    local_args, local_kwargs = _fresh_written(op, local(tuple(args)),
                                              {k: local(v) for k, v in kwargs.items()})
    result = op(*local_args, **local_kwargs)
    first = result[0] if isinstance(result, (tuple, list)) else result
    rows = first.shape[0] if isinstance(first, torch.Tensor) and first.dim() else None

    def wrap(t):
        if not isinstance(t, torch.Tensor):
            return t
        placements = to_placements(normalise(out_layout, t.dim()))
        split = any(isinstance(p, Shard) for p in placements)
        if split and (t.dim() == 0 or t.shape[0] != rows):
            raise FallbackError(
                f"node {node_name!r} ({op}): an output of shape {tuple(t.shape)} has no batch dim 0 to "
                f"carry the configuration {config.label!r}; re-plan with this op replicated")
        return DTensor.from_local(t, mesh, placements, run_check=False)

    if isinstance(result, (tuple, list)):
        return type(result)(wrap(t) for t in result)
    return wrap(result)


def _fresh_written(op, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``args``/``kwargs`` with a copy of each tensor an in-place ``op`` writes to (its schema's
    written arguments: ``self`` of ``div_``).

    A local tensor is a view made by DTensor's ``to_local``, which autograd forbids writing in place
    (Mixtral's router: ``routing_weights /= routing_weights.sum(-1, keepdim=True)``, an
    ``aten.div_`` the fallback runs). The op then writes the copy and returns it; the graph reads
    the mutated value through the op's own output node, as the trace recorded it.

    Example:
        >>> x = torch.ones(2)
        >>> (y,), _ = _fresh_written(torch.ops.aten.div_.Tensor, (x,), {})
        >>> y is x, torch.equal(y, x)
        (False, True)
        >>> _fresh_written(torch.ops.aten.div.Tensor, (x,), {})[0][0] is x  # not in place: as it is
        True
    """
    written = [(i, a.name) for i, a in enumerate(op._schema.arguments)
               if a.alias_info is not None and a.alias_info.is_write]
    if not written:
        return args, kwargs
    args, kwargs = list(args), dict(kwargs)
    for i, name in written:
        if i < len(args) and isinstance(args[i], torch.Tensor):
            args[i] = args[i].clone()
        elif isinstance(kwargs.get(name), torch.Tensor):
            kwargs[name] = kwargs[name].clone()
    return tuple(args), kwargs
