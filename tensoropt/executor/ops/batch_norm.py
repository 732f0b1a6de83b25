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
import torch.distributed._functional_collectives as funcol
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from tensoropt.config import BATCH_NORM_MODES

__all__ = ["BATCH_NORM_MODES", "UnsupportedBatchNorm", "batch_norm", "channel_split_batch_norm_alone",
           "synchronized_batch_norm", "synchronized_batch_norm_alone"]

_NO_TRAINING = torch.ops.aten._native_batch_norm_legit_no_training.default
_BACKWARD = torch.ops.aten.native_batch_norm_backward.default


class UnsupportedBatchNorm(RuntimeError):
    """A batch-norm layout the executor cannot run (a spatial split, a partial input)."""


def _reduce(t: torch.Tensor, groups: list) -> torch.Tensor:
    for group in groups:
        t = funcol.all_reduce(t, "sum", group)  # waited for where it is read
    return t


def _per_channel(t: torch.Tensor, ndim: int) -> torch.Tensor:
    return t.view([1, -1] + [1] * (ndim - 2))


class _SyncBatchNorm(torch.autograd.Function):
    """Batch norm of local rows whose statistics are summed over ``groups`` (see the module)."""

    @staticmethod
    def forward(ctx, x, weight, bias, shift, momentum, eps, count, groups):
        channels = x.shape[1]
        wide = torch.float64
        shift = shift.detach().to(wide) if shift is not None else \
            torch.zeros(channels, dtype=wide, device=x.device)
        n_local = x.numel() // max(channels, 1)
        if n_local:  # this rank's per-channel mean and biased variance in the fused kernel's one pass
            # (torch.var_mean over dims 0, 2, ... took ~3.5x as long on the CPU: 394 against 111 us at
            # 4 x 256 x 8 x 8, docs/results.md cnnprice)
            mean_l, var_l = torch.batch_norm_update_stats(x, None, None, 0.0)
            d = mean_l.to(wide) - shift
            packed = torch.cat([d * n_local, (var_l.to(wide) + d * d) * n_local])
        else:  # an empty shard (uneven batch split) still takes part in the collective
            packed = torch.zeros(2 * channels, dtype=wide, device=x.device)
        s1, s2 = _reduce(packed, groups).chunk(2)
        m = s1 / count
        stat_dtype = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
        mean = (shift + m).to(stat_dtype)
        var = (s2 / count - m * m).clamp_min(0).to(stat_dtype)
        kernel = weight.dtype if weight is not None else x.dtype  # the native kernels' stats dtype
        mean_k, var_k = mean.to(kernel), var.to(kernel)
        out = _NO_TRAINING(x, weight, bias, mean_k, var_k, momentum, eps)[0]
        ctx.save_for_backward(x, weight, mean_k, var_k)
        ctx.eps, ctx.count, ctx.groups = eps, count, groups
        ctx.has_bias = bias is not None
        ctx.mark_non_differentiable(mean, var)
        return out, mean, var

    @staticmethod
    def backward(ctx, dy, _mean, _var):
        x, weight, mean, var = ctx.saved_tensors
        w = weight if weight is not None else torch.ones_like(mean)
        # eval-mode backward with the global statistics: dy * w / std and the local sums
        partial_dx, sum_dy_xhat, sum_dy = _BACKWARD(dy, x, w, mean, var, None, None, False, ctx.eps,
                                                    [True, True, True])
        packed = torch.cat([sum_dy, sum_dy_xhat])
        if packed.dtype not in (torch.float32, torch.float64):  # 16-bit sums: reduced in float32
            packed = packed.float()
        total_dy, total_dy_xhat = _reduce(packed, ctx.groups).chunk(2)
        var, mean = var.to(packed.dtype), mean.to(packed.dtype)
        invstd = torch.rsqrt(var + ctx.eps)
        scale = w.to(packed.dtype) * invstd / ctx.count
        slope = scale * invstd * total_dy_xhat  # per channel: dx -= slope * x + offset
        offset = scale * total_dy - slope * mean
        dx = partial_dx - _per_channel(slope.to(x.dtype), x.dim()) * x \
            - _per_channel(offset.to(x.dtype), x.dim())
        grad_w = sum_dy_xhat if weight is not None and ctx.needs_input_grad[1] else None
        grad_b = sum_dy if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, grad_w, grad_b, None, None, None, None, None


def synchronized_batch_norm(x: torch.Tensor, weight, bias, running_mean, running_var, momentum: float,
                            eps: float, count: int, groups: list) -> torch.Tensor:
    """Training batch norm of this rank's rows ``x`` (plain tensors) with statistics summed over ``groups``.

    The local-tensor kernel of :func:`batch_norm` (one all-reduce per group in each direction);
    usable in eager code too, e.g. as a CPU stand-in for ``torch.nn.SyncBatchNorm``, which runs
    on GPUs only.

    Args:
        x: this rank's rows, ``n x C x ...``; weight, bias, running_mean, running_var: ``C`` each
            or None (the running statistics are updated in place).
        momentum, eps: as ``aten.batch_norm``.
        count: elements per channel over every rank (``N x H x W`` of the global batch).
        groups: the process groups whose ranks hold the other rows (summed one after the other).

    Example:
        >>> x = torch.randn(4, 3, 2, 2)
        >>> out = synchronized_batch_norm(x, None, None, None, None, 0.1, 1e-5, 16, [])  # no group: local
        >>> torch.allclose(out, torch.nn.functional.batch_norm(x, None, None, training=True), atol=1e-5)
        True
    """
    out, mean, var = _SyncBatchNorm.apply(x, weight, bias, running_mean, momentum, eps, count, groups)
    _running_update(running_mean, mean, momentum, in_place=True)
    _running_update(running_var, var * (count / max(count - 1, 1)), momentum, in_place=True)
    return out


def synchronized_batch_norm_alone(x: torch.Tensor, weight, bias, running_mean, running_var, training=True,
                                  momentum: float = 0.1, eps: float = 1e-5, *_rest) -> torch.Tensor:
    """A captured training batch norm's arguments (``aten.batch_norm``, ``native_batch_norm``,
    ``_native_batch_norm_legit_functional``: input, weight, bias, running mean, running variance,
    training, momentum, eps) run as :func:`batch_norm` runs a batch-split one with synchronised
    statistics, on this rank's rows alone: every operator of its forward and backward but the two
    all-reduces (no group), whose time the cost model prices as communication
    (:mod:`estimators.batch_norm`). The profiled compute times a synchronised batch norm with it
    (:class:`estimators.profiled.ProfiledCompute`'s ``variants``): the statistics' own pass
    (``var_mean``), the float64 packing and combination, the running statistics' update and the
    backward's per-channel correction, which the fused kernel the captured op names does not have.

    Example:
        >>> x = torch.randn(4, 3, 2, 2)
        >>> out = synchronized_batch_norm_alone(x, None, None, None, None, True, 0.1, 1e-5)
        >>> torch.allclose(out, torch.nn.functional.batch_norm(x, None, None, training=True), atol=1e-5)
        True
    """
    count = x.numel() // max(x.shape[1], 1)
    return synchronized_batch_norm(x, weight, bias, running_mean, running_var, momentum, eps, count, [])


def _rank_statistics(xl: torch.Tensor, w, b, momentum: float, eps: float):
    """Batch norm of this rank's rows and channels without running statistics (the buffers are updated
    apart, :func:`batch_norm`): (output, per-channel mean, biased variance, elements per channel)."""
    out, mean, invstd = torch.ops.aten.native_batch_norm.default(xl, w, b, None, None, True, momentum, eps)
    n = xl.numel() // max(xl.shape[1], 1)
    return out, mean.detach(), invstd.detach().reciprocal().square() - eps, n


def channel_split_batch_norm_alone(x: torch.Tensor, weight, bias, running_mean, running_var, training=True,
                                   momentum: float = 0.1, eps: float = 1e-5, *_rest) -> torch.Tensor:
    """A captured training batch norm's arguments (as :func:`synchronized_batch_norm_alone`) run as
    :func:`batch_norm` runs one whose channels are split while its running statistics are replicated
    (the executor's layout of buffers), on this rank's channels alone: the native kernel without running
    statistics, the running statistics' update as new tensors, stacked and copied back as the gather
    does (its all-gather is the cost model's communication,
    :func:`estimators.batch_norm.running_stats_time_s`).
    The profiled compute times a channel-split batch norm with it
    (:data:`estimators.batch_norm.CHANNEL_SPLIT_BATCH_NORM`).

    Example:
        >>> x, rm, rv = torch.randn(4, 3, 2, 2), torch.zeros(3), torch.ones(3)
        >>> out = channel_split_batch_norm_alone(x, None, None, rm, rv, True, 0.1, 1e-5)
        >>> ref_rm, ref_rv = torch.zeros(3), torch.ones(3)
        >>> ref = torch.nn.functional.batch_norm(x, ref_rm, ref_rv, None, None, True, 0.1, 1e-5)
        >>> torch.allclose(out, ref, atol=1e-5), torch.allclose(rm, ref_rm), torch.allclose(rv, ref_rv)
        (True, True, True)
    """
    out, mean, var, n = _rank_statistics(x, weight, bias, momentum, eps)
    new = [_running_update(running_mean, mean, momentum, in_place=False),
           _running_update(running_var, var * (n / max(n - 1, 1)), momentum, in_place=False)]
    buffers = [t for t in (running_mean, running_var) if t is not None]
    if buffers:  # _gather_back's local part: one stack, each row copied into its buffer
        stacked = torch.stack([t for t in new if t is not None])
        with torch.no_grad():
            for row, t in enumerate(buffers):
                t.copy_(stacked[row])
    return out


def _running_update(buffer, value, momentum: float, in_place: bool):
    """``buffer * (1 - momentum) + value * momentum``: into ``buffer``, or as a new tensor (None: None)."""
    if buffer is None:
        return None
    if in_place:
        return buffer.mul_(1.0 - momentum).add_(value.to(buffer.dtype) * momentum)
    return buffer * (1.0 - momentum) + value.to(buffer.dtype) * momentum


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
