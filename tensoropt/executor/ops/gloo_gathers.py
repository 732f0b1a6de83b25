"""A replayed program's all-gathers on the CPU, run through gloo's plain all-gather.

torch 2.13's gloo backend runs the functional ``_c10d_functional.all_gather_into_tensor`` as
``allgather_into_tensor_coalesced``. With a few dozen of them in flight at once (a ZeRO-3 step issues
one per parameter, a recomputed block gathers them again) the process's heap is corrupted and it
aborts: ``malloc(): unaligned tcache chunk detected``, SIGABRT. Measured here on 2 processes with
70 gathers in flight and their waits in order: 7 launches of 10 aborted within 100 steps (2 to 22
in flight ran clean). The same gathers through ``dist.all_gather_into_tensor(..., async_op=True)``
(gloo's ``_allgather_base``) ran clean in 11 launches of 11; functional all-reduces,
reduce-scatters and all-to-alls ran clean at 70 in flight too.
``tests/executor/test_gloo_gathers.py`` keeps the reproducer.

:func:`plain_gathers` rewrites a copy of the program: each CPU all-gather becomes
:func:`start_all_gather` (which starts the plain asynchronous all-gather and returns it in flight)
and its wait :func:`finish_all_gather`; nothing else changes, the traced program (what the stats
and the memory model read) keeps its functional collectives. Programs for CUDA tensors (NCCL) and
programs Inductor compiles (it wants functional collectives) are left as they are.

Example:
    >>> gm = torch.fx.symbolic_trace(torch.nn.ReLU())
    >>> plain_gathers(gm) is gm  # no all-gather: the program itself
    True
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
import torch.fx as fx

_GATHER = torch.ops._c10d_functional.all_gather_into_tensor.default
_WAIT = torch.ops._c10d_functional.wait_tensor.default


@dataclasses.dataclass
class GatherInFlight:
    """An all-gather started by :func:`start_all_gather`: its output and its work."""

    output: torch.Tensor
    work: dist.Work | None


def start_all_gather(local: torch.Tensor, group_size: int, group_name: str) -> GatherInFlight:
    """Start gathering ``local`` (concatenated along dim 0 over the group) without waiting.

    Example:
        >>> pending = start_all_gather(x, 2, "0")  # needs a process group  # doctest: +SKIP
        >>> finish_all_gather(pending).shape[0] == 2 * x.shape[0]  # doctest: +SKIP
        True
    """
    from torch.distributed.distributed_c10d import _resolve_process_group

    output = local.new_empty((local.shape[0] * group_size, *local.shape[1:]))
    # torch 2.13 deprecates the old name (a FutureWarning in every run); older torch has only it
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    work = gather(output, local.contiguous(), group=_resolve_process_group(group_name), async_op=True)
    return GatherInFlight(output, work)


def finish_all_gather(pending: GatherInFlight) -> torch.Tensor:
    """Wait for a gather :func:`start_all_gather` started; returns its output.

    Example:
        >>> finish_all_gather(GatherInFlight(torch.ones(2), None))
        tensor([1., 1.])
    """
    if pending.work is not None:
        pending.work.wait()
        pending.work = None
    return pending.output


def _on_cpu(node: fx.Node) -> bool:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return val.device.type == "cpu"
    source = node.args[0]
    val = source.meta.get("val") if isinstance(source, fx.Node) else None
    return isinstance(val, torch.Tensor) and val.device.type == "cpu"


def plain_gathers(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` whose CPU all-gathers run through gloo's plain all-gather (or ``gm`` itself
    when it has none). Parameters, buffers and folded constants are shared with ``gm``, not copied.

    Example:
        >>> g = fx.Graph(); x = g.placeholder("x")
        >>> w = g.call_function(_WAIT, (g.call_function(_GATHER, (x, 2, "0")),)); _ = g.output(w)
        >>> gm = fx.GraphModule(torch.nn.Module(), g)
        >>> gm.graph.find_nodes(op="call_function", target=_GATHER)[0].meta["val"] = torch.empty(4)
        >>> [n.target.__name__ for n in plain_gathers(gm).graph.nodes if n.op == "call_function"]
        ['start_all_gather', 'finish_all_gather']
    """
    gathers = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is _GATHER and _on_cpu(n)
               and n.users and all(u.op == "call_function" and u.target is _WAIT for u in n.users)]
    if not gathers:
        return gm
    targets = {n: start_all_gather for n in gathers}
    targets.update({user: finish_all_gather for n in gathers for user in n.users})
    return retargeted_copy(gm, targets)


def retargeted_copy(gm: fx.GraphModule, targets: dict[fx.Node, object]) -> fx.GraphModule:
    """A copy of ``gm`` in which each node of ``targets`` calls its new target (same arguments); ``gm``
    is left as it is. Parameters, buffers and folded constants are shared with ``gm``, not copied.

    Example:
        >>> gm = torch.fx.symbolic_trace(lambda x: torch.relu(x))
        >>> relu = next(n for n in gm.graph.nodes if n.op == "call_function")
        >>> retargeted_copy(gm, {relu: torch.neg})(torch.ones(1)).tolist(), gm(torch.ones(1)).tolist()
        ([-1.0], [1.0])
    """
    graph = fx.Graph()
    graph._codegen = gm.graph._codegen  # how the program takes its inputs and returns its outputs
    remap: dict[fx.Node, fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, remap))
    for n, target in targets.items():
        remap[n].target = target
    graph.lint()
    return fx.GraphModule(gm, graph)
