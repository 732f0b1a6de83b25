"""The global gradient norm of a parallel model, and clipping to it.

Each gradient is a DTensor laid out like its parameter (or like its ZeRO shard parameter):
sharded on some mesh axes, replicated on others. Its contribution to the global norm is counted
once: every rank adds the norm of its local shard only where its coordinate is 0 on each axis
the gradient is replicated on, and one all-reduce over the world sums the contributions (the
maximum for ``inf``). So the value equals ``torch.nn.utils.clip_grad_norm_`` on the plain model,
whatever the placements (several meshes and plain tensors included: torch's own function fails
on those, TRAINING.md).

Example:
    >>> g = torch.nn.Parameter(torch.zeros(2)); g.grad = torch.tensor([3.0, 4.0])
    >>> float(clip_grad_norm([g], 1.0)), [round(x, 6) for x in g.grad.tolist()]
    (5.0, [0.6, 0.8])
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Partial, Replicate


def _counted(grad: torch.Tensor) -> bool:
    """Whether this rank's local part of ``grad`` is the one copy counted in the global norm."""
    if not isinstance(grad, DTensor):
        return True
    coord = grad.device_mesh.get_coordinate()
    for axis, placement in enumerate(grad.placements):
        if isinstance(placement, Partial):
            raise RuntimeError("clip_grad_norm_: a gradient is still a partial sum (accumulated under "
                               "no_sync); run the step's last micro-batch outside no_sync() first")
        if isinstance(placement, Replicate) and coord[axis] != 0:
            return False
    return True


@torch.no_grad()
def clip_grad_norm(params: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0,
                   error_if_nonfinite: bool = False) -> torch.Tensor:
    """Clip the gradients of ``params`` to a global norm of ``max_norm``; returns the norm before.

    Args:
        params: parameters (DTensors and/or plain tensors) whose ``.grad`` is set; each once.
        max_norm: the largest norm allowed.
        norm_type: the p of the p-norm (``inf`` for the largest absolute value).
        error_if_nonfinite: raise if the norm is nan or inf (as torch's does).

    Returns:
        The global norm (a plain float32 scalar tensor, the same on every rank).

    Example:
        >>> w = torch.nn.Parameter(torch.zeros(2)); w.grad = torch.tensor([0.3, 0.4])
        >>> round(float(clip_grad_norm([w], 1.0)), 4), [round(x, 6) for x in w.grad.tolist()]
        (0.5, [0.3, 0.4])
    """
    grads = [p.grad for p in params if p.grad is not None]
    locals_ = [g._local_tensor if isinstance(g, DTensor) else g for g in grads]
    counted = [t for g, t in zip(grads, locals_) if _counted(g) and t.numel()]
    norm_type = float(norm_type)
    device = locals_[0].device if locals_ else torch.device("cpu")
    if norm_type == math.inf:
        total = torch.stack([t.abs().max().double() for t in counted]).max() if counted \
            else torch.zeros((), dtype=torch.float64, device=device)
        total = total.reshape(1)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(total, op=dist.ReduceOp.MAX)
        norm = total[0]
    else:
        norms = torch._foreach_norm(counted, norm_type) if counted else []
        total = torch.stack([n.double() for n in norms]).pow(norm_type).sum() if norms \
            else torch.zeros((), dtype=torch.float64, device=device)
        total = total.reshape(1)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(total, op=dist.ReduceOp.SUM)
        norm = total[0].pow(1.0 / norm_type)
    norm = norm.float()
    if error_if_nonfinite and not torch.isfinite(norm):
        raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} is non-finite "
                           f"({float(norm)})")
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    if locals_:
        torch._foreach_mul_(locals_, coef.to(locals_[0].device))
    return norm
