"""Training-mode batch norm on a mesh: synchronised statistics with one collective per direction.

A batch norm whose batch dim (0) is split over some mesh axes (its "statistics axes") computes,
per channel, over the whole global batch when the job's ``training.batch_norm`` is
``synchronized`` (the default: the model one process trains), as ``torch.nn.SyncBatchNorm``
does, with one all-reduce per statistics axis in each direction:

    forward:   each rank: n_i, mean_i, var_i = its rows' per-channel mean and (biased) variance
               (``batch_norm_update_stats``: the native kernel's statistics pass, two-pass stable)
               all-reduce [n_i (mean_i - K), n_i var_i + n_i (mean_i - K)^2]      (2 C numbers)
               mean = K + S1 / N,  var = S2 / N - (S1 / N)^2                       (N: global count)
               out = (x - mean) / sqrt(var + eps) * weight + bias                  (one fused kernel)
    backward:  each rank: sum dy, sum dy * xhat (and dy * weight / std) in one fused kernel
               all-reduce [sum dy, sum dy * xhat]                                  (2 C numbers)
               dx = weight / std * (dy - sum dy / N - xhat * sum dy*xhat / N)

``K`` is the running mean (identical on every rank; the statistics are shifted by it so that
``S2 / N - (S1 / N)^2`` does not cancel), the packed sums are float64. The weight and bias
gradients leave as this rank's partial sums (``Partial`` over the statistics axes), reduced by
the data-parallel gradient all-reduce like every replicated parameter's. With ``local``, every
rank normalises its own rows (per-rank statistics and running statistics, plain DDP's batch
norm): no collective. A channel split (dim 1) is local in both modes: each rank owns its
channels' statistics, weight and bias.

Under the replayed program (:mod:`tensoropt.executor.program.lowering`) the collectives are functional
(``_c10d_functional.all_reduce`` + ``wait_tensor``), traced inside the autograd function's
forward and backward.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from tensoropt.batch_norm_kernels import (
    _rank_statistics,
    _running_update,
    _SyncBatchNorm,
    channel_split_batch_norm_alone,
    synchronized_batch_norm,
    synchronized_batch_norm_alone,
)
from tensoropt.config import BATCH_NORM_MODES

__all__ = ["BATCH_NORM_MODES", "UnsupportedBatchNorm", "batch_norm", "channel_split_batch_norm_alone",
           "synchronized_batch_norm", "synchronized_batch_norm_alone"]

class UnsupportedBatchNorm(RuntimeError):
    """A batch-norm layout the executor cannot run (a spatial split, a partial input)."""


def _gather_back(buffers: list, locals_: list, mesh, channel: tuple) -> None:
    """Write each buffer's updated channels (``locals_``, laid out as ``channel``) back into ``buffers``
    (DTensors of one shape laid out otherwise), stacked into one redistribution per placement group."""
    groups: dict[tuple, list[int]] = {}
    for i, t in enumerate(buffers):
        groups.setdefault(tuple(t.placements), []).append(i)
    rows = tuple(Shard(1) if isinstance(p, Shard) else p for p in channel)
    for placements, members in groups.items():
        stacked = torch.stack([locals_[i] for i in members])
        shape = (len(members), *buffers[members[0]].shape)
        full = DTensor.from_local(stacked, mesh, rows, run_check=False, shape=torch.Size(shape),
                                  stride=(shape[1], 1))
        target = tuple(Shard(p.dim + 1) if isinstance(p, Shard) else p for p in placements)
        full = full.redistribute(mesh, target)
        with torch.no_grad():
            for row, i in enumerate(members):
                buffers[i].copy_(full[row])


def _local(t):
    return t.to_local() if isinstance(t, DTensor) else t


def batch_norm(node_name: str, x, weight, bias, running_mean, running_var, training: bool,
               momentum: float, eps: float, stats: str = "synchronized"):
    """Training-mode batch norm of ``x`` (a DTensor split on batch and/or channels, or a plain tensor).

    Args:
        node_name: the graph node (named in errors).
        x: the input, ``N x C x ...``; its placements may be ``Shard(0)`` (batch), ``Shard(1)``
            (channels) or ``Replicate`` per mesh axis.
        weight, bias, running_mean, running_var: per-channel tensors (any may be None); laid out
            to ``x``'s channel split here when they are not.
        training, momentum, eps: as ``aten.batch_norm``.
        stats: ``"synchronized"`` (statistics over the global batch) or ``"local"`` (over this
            rank's rows: per-rank statistics, as plain DDP).

    Returns:
        The normalised output, laid out as ``x``.

    Example:
        >>> x = torch.randn(4, 3, 2, 2)
        >>> out = batch_norm("bn", x, None, None, None, None, True, 0.1, 1e-5)
        >>> abs(float(out.mean())) < 1e-6, tuple(out.shape)
        (True, (4, 3, 2, 2))
    """
    if stats not in BATCH_NORM_MODES:
        raise ValueError(f"training.batch_norm: {stats!r} is not one of {BATCH_NORM_MODES}")
    if not training or not isinstance(x, DTensor):
        return torch.ops.aten.batch_norm.default(x, weight, bias, running_mean, running_var, training,
                                                 momentum, eps, False)
    mesh = x.device_mesh
    for p in x.placements:
        if p.is_partial() or (isinstance(p, Shard) and p.dim not in (0, 1)):
            raise UnsupportedBatchNorm(
                f"node {node_name!r} (aten.batch_norm): input placement {p} is not a batch or channel "
                "split; the executor's batch norm supports Shard(0), Shard(1) and Replicate")
    channel = tuple(Shard(0) if isinstance(p, Shard) and p.dim == 1 else Replicate() for p in x.placements)
    stat_axes = [a for a, p in enumerate(x.placements) if isinstance(p, Shard) and p.dim == 0]
    grad_channel = tuple(Partial() if a in stat_axes else p for a, p in enumerate(channel))

    def laid_out(t):
        if not isinstance(t, DTensor):
            return t
        if tuple(t.placements) != channel:
            t = t.redistribute(mesh, channel)
        return t.to_local(grad_placements=grad_channel)

    xl = x.to_local(grad_placements=x.placements)
    w, b = laid_out(weight), laid_out(bias)
    # running statistics: updated in place on this rank's channels; buffers laid out otherwise
    # (replicated while the channels are split) are updated as new tensors of this rank's channels
    # (data dependences a scheduling pass cannot reorder), then gathered back together: one
    # all-gather of [mean; var] per channel-split axis
    mean_moved, var_moved = (isinstance(t, DTensor) and tuple(t.placements) != channel
                             for t in (running_mean, running_var))
    rm = running_mean.redistribute(mesh, channel).to_local() if mean_moved else _local(running_mean)
    rv = running_var.redistribute(mesh, channel).to_local() if var_moved else _local(running_var)
    if (stats == "local" or not stat_axes) and not (mean_moved or var_moved):
        out = torch.ops.aten.batch_norm.default(xl, w, b, rm, rv, True, momentum, eps, False)  # in place
        return DTensor.from_local(out, mesh, x.placements, run_check=False, shape=x.shape, stride=x.stride())
    if stats == "local" or not stat_axes:
        out, mean, var, n = _rank_statistics(xl, w, b, momentum, eps)
    else:
        n = x.numel() // x.shape[1]
        out, mean, var = _SyncBatchNorm.apply(xl, w, b, rm, momentum, eps, n,
                                              [mesh.get_group(a) for a in stat_axes])
    new_rm = _running_update(rm, mean, momentum, in_place=not mean_moved)
    new_rv = _running_update(rv, var * (n / max(n - 1, 1)), momentum, in_place=not var_moved)
    moved = [(t, new) for t, new, m in ((running_mean, new_rm, mean_moved), (running_var, new_rv, var_moved))
             if m]
    if moved:
        _gather_back([t for t, _ in moved], [new for _, new in moved], mesh, channel)
    return DTensor.from_local(out, mesh, x.placements, run_check=False, shape=x.shape, stride=x.stride())
