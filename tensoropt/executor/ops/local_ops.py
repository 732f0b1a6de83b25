"""Operators the executor runs on local shards instead of through DTensor.

Cross entropy with the batch split (mean over the batch, no class weights, no label smoothing):
each rank sums its samples' losses; divided by the count of valid labels on all ranks, that is
the rank's share of the mean (:func:`partial_mean_cross_entropy`, a Partial(sum) loss when the
loss is the graph's output), or one all-reduce of (sum, count) over the split axes gives the
mean, replicated (:func:`mean_cross_entropy`); the backward is local either way (the gradient
of the mean is 1/count). DTensor issues one collective in forward and one more in backward (the
total weight), each a synchronisation point between the ranks.

mse_loss with the batch split (:func:`mse_loss`; DTensor has no sharding strategy for it): each
rank sums its rows' squared errors, divided by the global element count (from the shapes) for a
mean: a Partial(sum) loss, summed by the interpreter, or read after the step when it is the graph's
output; no collective beyond that sum, and a local backward.

Linear and unary elementwise ops were tried here too (``to_local`` with the split's gradient
placements, the aten op, ``from_local``) and measured slower than DTensor's dispatch on torch
2.13 (0.63 vs 0.43 ms per operator, forward + backward, 2 gloo processes): the two
``autograd.Function`` wrappers cost more than DTensor's cached sharding propagation, so they go
through DTensor. Which nodes run here is decided by :func:`estimators.overhead.runs_local`, which
the time estimate uses too.
"""

from __future__ import annotations

import math  # noqa: F401 (doctest)

import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from estimators.overhead import LOCAL_PACKETS

__all__ = ["LOCAL_PACKETS", "cross_entropy", "mean_cross_entropy", "mse_loss", "mse_share",
           "partial_cross_entropy", "partial_mean_cross_entropy", "run_local"]

_R = Replicate()


class _GlobalMean(torch.autograd.Function):
    """sum over ranks of ``local_sum`` / sum over ranks of ``count`` (two all-reduces per group, both
    in flight at once: the count, which depends on the labels only, and the sum, which only the
    loss's value reads; in the replayed program the first runs while forward does and the second
    while backward does, :mod:`tensoropt.executor.program.graph_passes`)."""

    @staticmethod
    def forward(ctx, local_sum, count, groups):
        count = count.to(torch.float64).reshape(1)
        total = local_sum.detach().to(torch.float64).reshape(1)
        for group in groups:  # functional: traceable into the replayed program (no .item() either)
            count = funcol.all_reduce(count, "sum", group)
            total = funcol.all_reduce(total, "sum", group)
        ctx.count = count.reshape(()).to(local_sum.dtype)
        return (total.reshape(()) / count.reshape(())).to(local_sum.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad / ctx.count, None, None


_CE_NAMES = ("logits", "labels", "weight", "reduction", "ignore_index", "label_smoothing")


def _bind(args: tuple, kwargs: dict) -> dict | None:
    """The aten cross entropy's arguments by name, or None for an unknown one or no labels."""
    bound = dict(zip(_CE_NAMES, args), **kwargs)
    return None if set(bound) - set(_CE_NAMES) or "labels" not in bound else bound


def _batch_axes(logits, labels, weight=None, reduction: int = 1, label_smoothing: float = 0.0,
                **_) -> list[int] | None:
    """Mesh axes that split both the logits' and the labels' batch, or None where the local path does
    not apply (not a plain mean of 2-D DTensor logits, or an axis neither batch-split nor replicated).
    """
    if not (isinstance(logits, DTensor) and isinstance(labels, DTensor) and logits.dim() == 2
            and labels.dim() == 1 and weight is None and reduction == 1 and not label_smoothing):
        return None
    axes = []
    for axis, (zp, yp) in enumerate(zip(logits.placements, labels.placements)):
        if isinstance(zp, Shard) and zp.dim == 0 and isinstance(yp, Shard) and yp.dim == 0:
            axes.append(axis)
        elif not (zp == _R and yp == _R):
            return None
    return axes


def _local_sum(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits, labels, reduction="sum", ignore_index=ignore_index)


def cross_entropy(logits, labels, weight=None, reduction: int = 1, ignore_index: int = -100,
                  label_smoothing: float = 0.0):
    """Mean cross entropy of batch-split (or replicated) logits, replicated; None for other cases.

    Example:
        >>> loss = cross_entropy(z, y)  # needs the local shards of a planned run  # doctest: +SKIP
    """
    axes = _batch_axes(logits, labels, weight, reduction, label_smoothing)
    if axes is None:
        return None
    mesh = logits.device_mesh
    zl = logits.to_local(grad_placements=logits.placements)
    loss = mean_cross_entropy(zl, labels.to_local(), ignore_index, [mesh.get_group(a) for a in axes])
    return DTensor.from_local(loss, mesh, [_R] * mesh.ndim, run_check=False, shape=(), stride=())


def mean_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int, groups: list):
    """Mean cross entropy over the samples of every rank of ``groups`` (plain local tensors in and out).

    Example:
        >>> loss = mean_cross_entropy(torch.zeros(2, 4), torch.tensor([0, 1]), -100, [])
        >>> abs(loss.item() - math.log(4)) < 1e-6
        True
    """
    return _GlobalMean.apply(_local_sum(logits, labels, ignore_index), (labels != ignore_index).sum(), groups)


def partial_mean_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int,
                               count: torch.Tensor) -> torch.Tensor:
    """This rank's share of the mean cross entropy over all ranks: its samples' loss sum / ``count``.

    ``count`` is the number of valid labels on all ranks (already all-reduced); the shares sum to
    the global mean, and the gradient of each is its samples' gradient / ``count``, no collective.

    Example:
        >>> share = partial_mean_cross_entropy(torch.zeros(2, 4), torch.tensor([0, 1]), -100,
        ...                                    torch.tensor([4.0], dtype=torch.float64))
        >>> abs(share.item() - math.log(4) / 2) < 1e-6
        True
    """
    local_sum = _local_sum(logits, labels, ignore_index)
    return local_sum / count.to(local_sum.dtype).reshape(())


def partial_cross_entropy(args: tuple, kwargs: dict, count: torch.Tensor):
    """A plain-mean cross entropy of DTensors as this rank's share (:func:`partial_mean_cross_entropy`):
    Partial(sum) on the axes the batch is split on, replicated on the others; None when the
    logits and labels are not both batch-split or both replicated on every axis, or the loss is not
    a plain mean.

    Example:
        >>> # not run here: needs the local shards of a planned run
        >>> loss = partial_cross_entropy((z, y), {}, count)  # doctest: +SKIP
    """
    bound = _bind(args, kwargs)
    axes = None if bound is None else _batch_axes(**bound)
    if axes is None:
        return None
    logits, labels = bound["logits"], bound["labels"]
    placements = [Partial() if a in axes else _R for a in range(logits.device_mesh.ndim)]
    zl = logits.to_local(grad_placements=logits.placements)
    share = partial_mean_cross_entropy(zl, labels.to_local(), bound.get("ignore_index", -100), count)
    return DTensor.from_local(share, logits.device_mesh, placements, run_check=False, shape=(), stride=())


_MSE_NAMES = ("input", "target", "reduction")
_NONE, _MEAN = 0, 1
"""aten's reduction codes (``torch.nn._reduction``): 0 none, 1 mean, 2 sum."""


def mse_share(prediction: torch.Tensor, target: torch.Tensor, reduction: int,
              global_numel: int) -> torch.Tensor:
    """This rank's share of an mse_loss over rows split across ranks (plain local tensors in and out).

    The squared errors of the local rows summed, divided by ``global_numel`` (the element count of
    the whole prediction, known from the shapes) for a mean: the shares sum to the loss over all
    rows, and the gradient of each is its rows' gradient, no collective. ``reduction`` none: the
    local elementwise loss.

    Example:
        >>> x, y = torch.tensor([[1.0, 2.0]]), torch.tensor([[0.0, 0.0]])
        >>> float(mse_share(x, y, 1, 4)), float(mse_share(x, y, 2, 4))
        (1.25, 5.0)
    """
    if reduction == _NONE:
        return torch.nn.functional.mse_loss(prediction, target, reduction="none")
    local_sum = torch.nn.functional.mse_loss(prediction, target, reduction="sum")
    return local_sum / global_numel if reduction == _MEAN else local_sum


def mse_loss(args: tuple, kwargs: dict) -> DTensor | None:
    """aten.mse_loss of DTensors split alike on dim 0 (or replicated) on every mesh axis, computed on
    the local rows (DTensor has no sharding strategy for it).

    Returns the raw output: the reduced loss as a Partial(sum) DTensor on the split axes
    (:func:`mse_share`; the interpreter sums it, or leaves it to be read after the step), replicated
    on the others; with reduction none, the elementwise loss laid out like the prediction. None when
    the operands are not DTensors of one shape and one such layout.

    Example:
        >>> # not run here: needs the local shards of a planned run
        >>> loss = mse_loss((prediction, target), {})  # doctest: +SKIP
    """
    bound = dict(zip(_MSE_NAMES, args), **kwargs)
    x, t = bound.get("input"), bound.get("target")
    if set(bound) - set(_MSE_NAMES) or not (isinstance(x, DTensor) and isinstance(t, DTensor)) \
            or x.shape != t.shape or x.placements != t.placements:
        return None
    if not all(p == _R or (isinstance(p, Shard) and p.dim == 0) for p in x.placements):
        return None
    reduction = int(bound.get("reduction", _MEAN))
    xl = x.to_local(grad_placements=x.placements)
    tl = t.to_local(grad_placements=t.placements)
    share = mse_share(xl, tl, reduction, x.numel())
    if reduction == _NONE:
        return DTensor.from_local(share, x.device_mesh, x.placements, run_check=False, shape=x.shape,
                                  stride=x.stride())
    placements = [Partial() if isinstance(p, Shard) else _R for p in x.placements]
    return DTensor.from_local(share, x.device_mesh, placements, run_check=False, shape=(), stride=())


def run_local(packet: str, args: tuple, kwargs: dict):
    """Run the aten op of packet ``packet`` on local shards: its (reduced, replicated) output, or None.

    Example:
        >>> # not run here: needs the local shards of a planned run
        >>> run_local("cross_entropy_loss", (z, y), {})  # doctest: +SKIP
    """
    if packet != "cross_entropy_loss":
        return None
    bound = _bind(args, kwargs)
    return None if bound is None else cross_entropy(**bound)
