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
import torch.distributed._functional_collectives as funcol
from torch.distributed.tensor import DTensor, Partial, Replicate

from estimators.collectives import FIRST_GRAD_BUCKET_BYTES as FIRST_BUCKET_BYTES
from estimators.collectives import GRAD_BUCKET_BYTES as BUCKET_BYTES
from tensoropt.executor.state.memory import storage_keys


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


class GradSync:
    """The data-parallel gradient all-reduce, overlapped with backward and bucketed as DDP does.

    A post-accumulate-grad hook on each parameter: as soon as backward has accumulated a
    gradient that is a partial sum over exactly one mesh axis where the parameter is replicated,
    it joins the open bucket of its (mesh, axis, dtype, device); a bucket reaching
    ``bucket_bytes`` (the step's first bucket: ``FIRST_BUCKET_BYTES``) is flattened and
    all-reduced asynchronously while backward goes on (later layers' gradients arrive first, as
    in DDP's reverse-order buckets). :meth:`finish` starts the buckets still open, waits for all,
    and gives each parameter its reduced gradient (a view of its bucket); any other gradient
    placement goes through DTensor's redistribute. Buckets are formed in the order the hooks
    fire, which is the same on every rank (same graph, same autograd order), so every rank
    issues the same collectives in the same order.

    ``functional=True`` (the step being traced into a local program,
    :mod:`tensoropt.executor.program.lowering`):
    each bucket is concatenated afresh and all-reduced with a functional collective
    (``_c10d_functional.all_reduce`` + ``wait_tensor`` in the trace; an in-place ``dist`` collective
    would replay wrong), and no hooks are registered (the tracer calls :meth:`add`).

    Example:
        >>> sync = GradSync([torch.zeros(2, requires_grad=True)])  # plain tensors: nothing to do
        >>> sync.finish()
        0
    """

    def __init__(self, params: Iterable[torch.Tensor], bucket_bytes: int = BUCKET_BYTES, hooks: bool = True,
                 functional: bool = False):
        self.params = list(params)
        self.bucket_bytes = bucket_bytes
        self.functional = functional
        hooks = hooks and not functional
        self._open: dict[tuple, tuple[list[DTensor], list[int]]] = {}
        self._inflight: list[tuple] = []
        self._collectives = 0
        self._buffers: dict[tuple, torch.Tensor] = {}
        if hooks:
            for p in self.params:
                if isinstance(p, DTensor) and p.requires_grad:
                    p.register_post_accumulate_grad_hook(self.add)

    def add(self, p: torch.Tensor) -> None:
        """Put ``p``'s gradient in its bucket if it is a single-axis partial sum (a hook)."""
        if not isinstance(p, DTensor) or not isinstance(p.grad, DTensor):
            return
        axis = _single_partial_axis(p)
        if axis is None:
            return
        key = (id(p.device_mesh), axis, p.grad.dtype, p.grad.device)
        members, size = self._open.setdefault(key, ([], [0]))
        members.append(p)
        size[0] += p.grad._local_tensor.numel() * p.grad.element_size()
        if size[0] >= (self.bucket_bytes if self._inflight else min(self.bucket_bytes, FIRST_BUCKET_BYTES)):
            self._launch(key)

    def _launch(self, key: tuple) -> None:
        members, _ = self._open.pop(key)
        axis = key[1]
        grads = [p.grad._local_tensor.reshape(-1) for p in members]
        group = members[0].device_mesh.get_group(axis)
        if self.functional:
            self._inflight.append((None, funcol.all_reduce(torch.cat(grads), "sum", group), members))
            self._collectives += 1
            return
        # one flat buffer per bucket, kept across steps (as DDP's buckets): no allocation per step
        bucket_key = (key, tuple(id(p) for p in members))
        flat = self._buffers.get(bucket_key)
        numel = sum(g.numel() for g in grads)
        if flat is None or flat.numel() != numel or storage_keys([flat]) & storage_keys(grads):
            flat = torch.empty(numel, dtype=grads[0].dtype, device=grads[0].device)
            self._buffers[bucket_key] = flat
        torch.cat(grads, out=flat)
        work = dist.all_reduce(flat, group=group, async_op=True)
        self._inflight.append((work, flat, members))
        self._collectives += 1

    def release_buffers(self) -> int:
        """Drop the flat bucket buffers kept across steps; returns their bytes. For a runtime whose
        interpreted steps are rare (the replayed program's first step of each ``train`` call): kept,
        they hold a second copy of every synchronised gradient beside the program's own buckets.

        Example:
            >>> GradSync([torch.zeros(2, requires_grad=True)]).release_buffers()
            0
        """
        freed = sum(t.numel() * t.element_size() for t in self._buffers.values())
        self._buffers.clear()
        return freed

    def finish(self) -> int:
        """Start the open buckets, wait for every bucket, set the reduced gradients; returns collectives."""
        for key in list(self._open):
            self._launch(key)
        for work, flat, members in self._inflight:
            if work is not None:
                work.wait()
            offset = 0
            for p in members:
                n = p.grad._local_tensor.numel()
                reduced = flat[offset:offset + n].view(p.grad._local_tensor.shape)
                offset += n
                p.grad = DTensor(reduced, p._spec, requires_grad=False)  # p's placements, shape, stride
        collectives, self._inflight, self._collectives = self._collectives, [], 0
        for p in self.params:
            if isinstance(p, DTensor) and p.grad is not None and p.grad.placements != p.placements:
                p.grad = p.grad.redistribute(p.device_mesh, p.placements)
                collectives += 1
        return collectives


def sync_gradients(params: Iterable[torch.Tensor]) -> int:
    """All-reduce partial gradients in place of ``params``' ``.grad``; returns the collectives issued.

    The same buckets as :class:`GradSync`, formed after backward (no overlap).

    Example:
        >>> sync_gradients([torch.zeros(2, requires_grad=True)])  # plain tensors: nothing to do
        0
    """
    sync = GradSync(params, hooks=False)
    for p in sync.params:
        sync.add(p)
    return sync.finish()
