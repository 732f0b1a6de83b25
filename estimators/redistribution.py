"""Redistribution of one tensor between two layouts, forward and backward (torch-free).

A layout is one placement per mesh axis ("R", "S(d)", "P"). Per axis (shared/guide/COSTS.md):

    from -> to         forward                     backward (on the gradient)
    S -> R             all-gather                  what the gradient needs (see below)
    P -> R             all-reduce                  nothing
    P -> S             reduce-scatter              all-gather
    S(i) -> S(j)       all-to-all of n/p / device  all-to-all
    R -> S             local slice, free           all-gather
    same               free                        free

Backward is computed, not looked up: the gradient arrives in the consumer's layout, with
``"P"`` on the axes where the consumer replicated this operand but split its own iteration
space (a column-parallel linear's input gradient is a partial sum), and is redistributed back
to the producer's layout. So S -> R costs a reduce-scatter backward when the consumer split
the axis, and nothing when the consumer is replicated there; R -> R costs an all-reduce
backward when the consumer split the axis (Megatron's "f" operator).

Axes are visited in this order: free slices first (they shrink the tensor), then all-to-alls,
reduce-scatters, and last the all-gathers / all-reduces; each step's size is the local size of
the tensor at that point, so earlier transitions change later costs.
"""

from __future__ import annotations

import functools

from estimators.collectives import CommModel
from estimators.configuration import Layout
from estimators.configuration import local_shape as _local_shape
from estimators.configuration import shard_dim as _shard_dim
from estimators.memory import numel

shard_dim = functools.lru_cache(maxsize=4096)(_shard_dim)
"""Memoised ``configuration.shard_dim`` (placements repeat millions of times on large meshes)."""
local_shape = functools.lru_cache(maxsize=262144)(_local_shape)
"""Memoised ``configuration.local_shape`` (its arguments are tuples)."""

_ORDER = {"slice": 0, "all_to_all": 1, "reduce_scatter": 2, "all_gather": 3, "all_reduce": 3}


def transition(src: str, dst: str) -> str | None:
    """The collective (or ``"slice"``) that turns placement ``src`` into ``dst`` on one axis.

    Example:
        >>> transition("S(0)", "R"), transition("P", "S(1)"), transition("R", "R")
        ('all_gather', 'reduce_scatter', None)
    """
    if src == dst:
        return None
    if src == "P":
        return "all_reduce" if dst == "R" else "reduce_scatter"
    if dst == "P":
        # Replicate/Shard -> Partial: keep the value on one rank, zeros elsewhere; local.
        return "slice"
    if src == "R":
        return "slice"
    return "all_gather" if dst == "R" else "all_to_all"


@functools.lru_cache(maxsize=65536)
def redistribution_steps(
    shape: tuple[int, ...], itemsize: int, src: Layout, dst: Layout, mesh_shape: tuple[int, ...]
) -> list[tuple[str, float, int]]:
    """The collectives turning layout ``src`` into ``dst``: ``[(collective, nbytes, axis), ...]``.

    ``nbytes`` follows :mod:`estimators.collectives` (all-gather: output bytes of the group;
    all-to-all: bytes per device). Free slices are omitted.

    Example:
        >>> redistribution_steps((8, 8), 4, ("S(0)", "S(0)"), ("R", "R"), (2, 2))
        [('all_gather', 128, 0), ('all_gather', 256, 1)]
    """
    if len(src) != len(mesh_shape) or len(dst) != len(mesh_shape):
        raise ValueError(f"layouts {src} -> {dst} do not match mesh {mesh_shape}")
    for layout in (src, dst):
        for p in layout:
            d = shard_dim(p)
            if p not in ("R", "P") and (d is None or d >= len(shape)):
                raise ValueError(f"placement {p!r} invalid for a tensor of shape {shape}")
    todo = sorted((_ORDER[t], a, t) for a in range(len(mesh_shape)) if (t := transition(src[a], dst[a])))
    cur = list(src)
    steps = []
    for _, axis, kind in todo:
        if kind != "slice":
            group_layout = tuple(cur[:axis] + ["R"] + cur[axis + 1 :])
            group_bytes = numel(local_shape(tuple(shape), group_layout, tuple(mesh_shape))) * itemsize
            nbytes = group_bytes / mesh_shape[axis] if kind == "all_to_all" else group_bytes
            steps.append((kind, nbytes, axis))
        cur[axis] = dst[axis]
    return steps


def redistribution_time_s(
    comm: CommModel, shape: tuple[int, ...], itemsize: int, src: Layout, dst: Layout, blocking: bool = True
) -> float:
    """Seconds to redistribute a tensor from ``src`` to ``dst`` (one direction): each collective a
    blocking one (:meth:`CommModel.blocking_time_s`: the consumer waits for it, with its sync point),
    or with ``blocking=False`` one that runs beside the step's other work (its fit, :meth:`CommModel.time_s`).

    Example:
        >>> from estimators.profiles import load_cluster
        >>> from tensoropt.configspace.configuration import Mesh
        >>> cm = CommModel(load_cluster("h100x8"), Mesh((2,), ("gpu",)))
        >>> redistribution_time_s(cm, (4, 4), 4, ("S(0)",), ("S(0)",))
        0.0
    """
    key = (tuple(shape), itemsize, tuple(src), tuple(dst), blocking)
    if key in comm.memo:
        return comm.memo[key]
    price = comm.blocking_time_s if blocking else comm.time_s
    comm.memo[key] = total = sum(
        (
            price(kind, nbytes, (axis,))
            for kind, nbytes, axis in redistribution_steps(
                tuple(shape), itemsize, tuple(src), tuple(dst), comm.mesh.shape
            )
        ),
        0.0,
    )
    return total


def gradient_layout(dst: Layout, consumer_split_axes: set[int] | frozenset[int]) -> Layout:
    """Layout of the gradient a consumer returns for an operand it read in layout ``dst``.

    ``"P"`` on every axis where the operand is replicated but the consumer splits its
    iteration space there (the gradient is a partial sum over that axis).

    Example:
        >>> gradient_layout(("R", "S(0)"), {0, 1})
        ('P', 'S(0)')
    """
    return tuple("P" if p == "R" and a in consumer_split_axes else p for a, p in enumerate(dst))


def edge_time_s(
    comm: CommModel,
    shape: tuple[int, ...],
    itemsize: int,
    src: Layout,
    dst: Layout,
    consumer_split_axes: set[int] | frozenset[int],
    needs_grad: bool,
    gradient_waited: bool = True,
) -> tuple[float, float]:
    """(forward, backward) seconds to move a tensor from producer layout ``src`` to consumer ``dst``.

    Args:
        comm: collective cost model of the mesh.
        shape: full (global) shape of the tensor.
        itemsize: bytes per element.
        src: producer's output layout.
        dst: layout the consumer computes with.
        consumer_split_axes: mesh axes on which the consumer splits any parallel dim.
        needs_grad: whether a gradient flows back along this tensor.
        gradient_waited: whether the producer's backward waits for the gradient's redistribution at
            once (False where only the producer's parameter gradients read it, at the end of
            backward: an embedding's; its collectives are then priced at their fit, no sync point).

    Example:
        >>> from estimators.profiles import load_cluster
        >>> from tensoropt.configspace.configuration import Mesh
        >>> cm = CommModel(load_cluster("h100x8"), Mesh((2,), ("gpu",)))
        >>> fwd, bwd = edge_time_s(cm, (64, 64), 4, ("R",), ("R",), {0}, True)  # Megatron f
        >>> fwd == 0.0 and bwd > 0.0
        True
    """
    fwd = redistribution_time_s(comm, shape, itemsize, src, dst)
    bwd = 0.0
    if needs_grad:
        bwd = redistribution_time_s(comm, shape, itemsize, gradient_layout(dst, consumer_split_axes), src,
                                    blocking=gradient_waited)
    return fwd, bwd


def through_view(
    layout: Layout, dim_map: list[int | None] | None, rank: int | None = None
) -> tuple[Layout, Layout]:
    """Carry a producer's layout through the views between it and a consumer operand.

    Returns ``(gathered, translated)``: ``gathered`` is the producer layout with every shard on
    a dim the views mix (``dim_map[d] is None``) replaced by ``"R"`` (an all-gather must happen
    before the view); ``translated`` is ``gathered`` in the operand's dims.

    Example:
        >>> through_view(("S(0)", "S(1)"), [0, None])
        (('S(0)', 'R'), ('S(0)', 'R'))
        >>> through_view(("S(1)",), [1, 0])
        (('S(1)',), ('S(0)',))
    """
    if dim_map is None:
        dim_map = list(range(rank if rank is not None else 1 + max((shard_dim(p) or 0) for p in layout)))
    gathered, translated = [], []
    for p in layout:
        d = shard_dim(p)
        if d is None:
            gathered.append(p)
            translated.append(p)
        elif d >= len(dim_map) or dim_map[d] is None:
            gathered.append("R")
            translated.append("R")
        else:
            gathered.append(p)
            translated.append(f"S({dim_map[d]})")
    return tuple(gathered), tuple(translated)
