"""The local kernels of a training batch norm: synchronised statistics over process groups, and a
channel-split batch norm's local part, on plain tensors.

:mod:`tensoropt.executor.ops.batch_norm` runs a batch norm placed on a mesh with them, and the profiled
compute (:class:`estimators.profiled.ProfiledCompute`'s ``variants``, handed over by
:mod:`tensoropt.cost_graph`) times a batch norm as the executor runs it with
:func:`synchronized_batch_norm_alone` and :func:`channel_split_batch_norm_alone`: a module below both
(the cost graph does not import the executor). The formulation is the executor's module's.

Example:
    >>> x = torch.randn(4, 3, 2, 2)
    >>> out = synchronized_batch_norm(x, None, None, None, None, 0.1, 1e-5, 16, [])
    >>> torch.allclose(out, torch.nn.functional.batch_norm(x, None, None, training=True), atol=1e-5)
    True
"""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol

__all__ = ["channel_split_batch_norm_alone", "synchronized_batch_norm", "synchronized_batch_norm_alone"]

_NO_TRAINING = torch.ops.aten._native_batch_norm_legit_no_training.default
_BACKWARD = torch.ops.aten.native_batch_norm_backward.default


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

    The local-tensor kernel of :func:`tensoropt.executor.ops.batch_norm.batch_norm`
    (one all-reduce per group in each direction);
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
    training, momentum, eps) run as :func:`tensoropt.executor.ops.batch_norm.batch_norm`
    runs a batch-split one with synchronised
    statistics, on this rank's rows alone: every operator of its forward and backward but the two
    all-reduces (no group), whose time the cost model prices as communication
    (:mod:`estimators.batch_norm`). The profiled compute times a synchronised batch norm with it
    (:class:`estimators.profiled.ProfiledCompute`'s ``variants``): the statistics' own pass
    (``batch_norm_update_stats``), the float64 packing and combination, the running statistics' update and the
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
    apart, :func:`tensoropt.executor.ops.batch_norm.batch_norm`):
    (output, per-channel mean, biased variance, elements per channel)."""
    out, mean, invstd = torch.ops.aten.native_batch_norm.default(xl, w, b, None, None, True, momentum, eps)
    n = xl.numel() // max(xl.shape[1], 1)
    return out, mean.detach(), invstd.detach().reciprocal().square() - eps, n


def channel_split_batch_norm_alone(x: torch.Tensor, weight, bias, running_mean, running_var, training=True,
                                   momentum: float = 0.1, eps: float = 1e-5, *_rest) -> torch.Tensor:
    """A captured training batch norm's arguments (as :func:`synchronized_batch_norm_alone`) run as
    :func:`tensoropt.executor.ops.batch_norm.batch_norm` runs one whose channels are split while its running
    statistics are replicated
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
