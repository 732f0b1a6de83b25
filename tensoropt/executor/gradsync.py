"""Gradient synchronisation: bring each gradient to its parameter's placement.

A parameter replicated on a mesh axis over which its gradient is a partial sum (the plan's
``grad_sync_axes``: data parallelism's all-reduce) gets its gradient all-reduced. Gradients
that differ from their parameter only by Partial(sum) -> Replicate on one axis are flattened
into buckets and all-reduced together (one collective per bucket, as DDP does); anything else
goes through DTensor's redistribute.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Partial, Replicate

BUCKET_BYTES = 25 * 2**20
"""Largest flattened bucket (DDP's default bucket size)."""


def _single_partial_axis(p: DTensor) -> int | None:
    """The one mesh axis where ``p.grad`` is Partial(sum) and ``p`` Replicate, all else equal."""
    axis = None
    for i, (g, w) in enumerate(zip(p.grad.placements, p.placements)):
        if g == w:
            continue
        if isinstance(g, Partial) and g.reduce_op == "sum" and isinstance(w, Replicate) and axis is None:
            axis = i
        else:
            return None
    return axis


def sync_gradients(params: Iterable[torch.Tensor]) -> int:
    """All-reduce partial gradients in place of ``params``' ``.grad``; returns the collectives issued.

    Example:
        >>> sync_gradients([torch.zeros(2, requires_grad=True)])  # plain tensors: nothing to do
        0
    """
    buckets: dict[tuple, list[DTensor]] = {}
    collectives = 0
    for p in params:
        if not isinstance(p, DTensor) or p.grad is None or p.grad.placements == p.placements:
            continue
        axis = _single_partial_axis(p)
        if axis is None:
            p.grad = p.grad.redistribute(p.device_mesh, p.placements)
            collectives += 1
            continue
        buckets.setdefault((id(p.device_mesh), axis, p.grad.dtype, p.grad.device), []).append(p)
    for (_, axis, _, _), members in buckets.items():
        start = 0
        while start < len(members):
            chunk, size = [], 0
            while start < len(members) and (not chunk or size < BUCKET_BYTES):
                chunk.append(members[start])
                size += members[start].grad._local_tensor.numel() * members[start].grad.element_size()
                start += 1
            _all_reduce_bucket(chunk, axis)
            collectives += 1
    return collectives


def _all_reduce_bucket(members: list[DTensor], axis: int) -> None:
    locals_ = [p.grad._local_tensor for p in members]
    flat = torch.cat([t.reshape(-1) for t in locals_])
    dist.all_reduce(flat, group=members[0].device_mesh.get_group(axis))
    offset = 0
    for p, t in zip(members, locals_):
        n = t.numel()
        reduced = flat[offset:offset + n].view(t.shape)
        offset += n
        p.grad = DTensor.from_local(reduced, p.device_mesh, p.placements, run_check=False,
                                    shape=p.shape, stride=p.stride())
