"""Operators the executor runs on local shards, without DTensor's per-operator dispatch.

DTensor's dispatch (sharding propagation, output wrapping, its autograd bookkeeping) costs about
as much as the compute of a small operator on a CPU. For the operators below, a configuration
whose layouts are a plain split needs no communication: each rank computes its shard from its
local operands. :func:`run_local` then takes the operands' local tensors (with the gradient
placements the split implies: a replicated operand of a split computation gets a Partial(sum)
gradient), runs the aten op on them, and wraps the result as a DTensor in the placement the
split gives. Anything else (another op, a layout combination that is not a plain split)
returns None and the interpreter runs the op through DTensor, which checks it.

Linear, per mesh axis (x has k dims, the feature dim last):

=======  ======  ======  ======  =========  =======  =======  =======
role     x       weight  bias    raw out    grad x   grad w   grad b
=======  ======  ======  ======  =========  =======  =======  =======
batch    S(d<k)  R       R       S(d)       S(d)     P        P
out      R       S(0)    S(0)    S(k-1)     P        S(0)     S(0)
in       S(k-1)  S(1)    (after) P          S(k-1)   S(1)     (DTensor)
none     R       R       R       R          R        R        R
=======  ======  ======  ======  =========  =======  =======  =======

With an ``in`` axis the bias is returned separately: it is added (through DTensor) after the
partial sum is reduced. Elementwise unary ops: the output and the gradient keep the input's
placements (no Partial input). Cross entropy with the batch split (mean over the batch, no class
weights, no label smoothing): each rank sums its samples' losses and counts its valid labels,
one all-reduce of (sum, count) over the split axes gives the mean, replicated; its backward is
local (the gradient of the mean is 1/count), where DTensor issues one collective in forward and
one in backward.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

UNARY = frozenset({"relu", "gelu", "silu", "tanh", "sigmoid"})
"""Elementwise unary aten packets run locally (no size arguments, no RNG)."""

LOCAL_PACKETS = UNARY | {"linear", "cross_entropy_loss"}
"""Aten overload packets :func:`run_local` may run on local shards."""

_P, _R = Partial(), Replicate()


def _linear_role(x: Placement, w: Placement, k: int) -> str:
    if isinstance(x, Shard) and 0 <= x.dim < k - 1 and w == _R:
        return "batch"
    if x == _R and isinstance(w, Shard) and w.dim == 0:
        return "out"
    if isinstance(x, Shard) and x.dim == k - 1 and isinstance(w, Shard) and w.dim == 1:
        return "in"
    if x == _R and w == _R:
        return "none"
    return "?"


def _wrap(out: torch.Tensor, like: DTensor, placements, meta) -> DTensor:
    """``out`` (a local shard) as a DTensor; the global shape and stride come from the graph's meta."""
    if meta is not None:
        return DTensor.from_local(out, like.device_mesh, placements, run_check=False,
                                  shape=tuple(meta.shape), stride=tuple(meta.stride()))
    return DTensor.from_local(out, like.device_mesh, placements, run_check=False)


def linear(x, weight, bias=None, meta=None):
    """``aten.linear`` on local shards, or None when the layouts are not a plain split.

    Returns (raw output DTensor, bias to add after the partial sum is reduced or None).

    Example:
        >>> out, late_bias = linear(x, w, b)  # doctest: +SKIP
    """
    if not (isinstance(x, DTensor) and isinstance(weight, DTensor) and weight.dim() == 2 and x.dim() >= 1):
        return None
    if bias is not None and not (isinstance(bias, DTensor) and bias.dim() == 1):
        return None
    k = x.dim()
    roles = [_linear_role(xp, wp, k) for xp, wp in zip(x.placements, weight.placements)]
    if "?" in roles:
        return None
    has_in = "in" in roles
    if bias is not None:
        expected = [_R if r in ("batch", "none", "in") else Shard(0) for r in roles]
        if list(bias.placements) != expected:
            return None
    out_p, gx, gw = [], [], []
    for r, xp in zip(roles, x.placements):
        out_p.append({"batch": xp, "out": Shard(k - 1), "in": _P, "none": _R}[r])
        gx.append({"batch": xp, "out": _P, "in": Shard(k - 1), "none": _R}[r])
        gw.append({"batch": _P, "out": Shard(0), "in": Shard(1), "none": _R}[r])
    xl = x.to_local(grad_placements=gx)
    wl = weight.to_local(grad_placements=gw)
    late_bias = None
    if bias is None:
        bl = None
    elif has_in:
        bl, late_bias = None, bias
    else:
        gb = [_P if r == "batch" else p for r, p in zip(roles, bias.placements)]
        bl = bias.to_local(grad_placements=gb)
    out = torch.nn.functional.linear(xl, wl, bl)
    return _wrap(out, x, out_p, meta), late_bias


def unary(op, x, *args, meta=None, **kwargs):
    """An elementwise unary op on the local shard, or None (not a DTensor, or a Partial input).

    Example:
        >>> unary(torch.ops.aten.relu.default, x)  # doctest: +SKIP
    """
    if not isinstance(x, DTensor) or any(p.is_partial() for p in x.placements):
        return None
    if any(isinstance(a, torch.Tensor) for a in (*args, *kwargs.values())):
        return None
    out = op(x.to_local(grad_placements=x.placements), *args, **kwargs)
    return _wrap(out, x, x.placements, meta)


class _GlobalMean(torch.autograd.Function):
    """sum over ranks of ``local_sum`` / sum over ranks of ``count`` (one all-reduce per group)."""

    @staticmethod
    def forward(ctx, local_sum, count, groups):
        buf = torch.stack([local_sum.detach().to(torch.float64), count.to(torch.float64)])
        for group in groups:
            dist.all_reduce(buf, group=group)
        ctx.count = buf[1].item()
        return (buf[0] / buf[1]).to(local_sum.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad / ctx.count, None, None


def cross_entropy(logits, labels, weight=None, reduction: int = 1, ignore_index: int = -100,
                  label_smoothing: float = 0.0):
    """Mean cross entropy of batch-split (or replicated) logits, replicated; None for other cases.

    Example:
        >>> loss = cross_entropy(z, y)  # doctest: +SKIP
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
    mesh = logits.device_mesh
    zl = logits.to_local(grad_placements=logits.placements)
    yl = labels.to_local()
    local_sum = torch.nn.functional.cross_entropy(zl, yl, reduction="sum", ignore_index=ignore_index)
    count = (yl != ignore_index).sum()
    loss = _GlobalMean.apply(local_sum, count, [mesh.get_group(a) for a in axes])
    return DTensor.from_local(loss, mesh, [_R] * mesh.ndim, run_check=False, shape=(), stride=())


def run_local(packet: str, op, args: tuple, kwargs: dict, meta=None):
    """Run ``op`` (aten packet ``packet``) on local shards: (output, late bias) or None.

    A cross entropy's output is already reduced (replicated); the others are raw outputs.

    Example:
        >>> run_local("relu", torch.ops.aten.relu.default, (x,), {})  # doctest: +SKIP
    """
    if packet == "linear":
        bound = dict(zip(("input", "weight", "bias"), args), **kwargs)
        if set(bound) - {"input", "weight", "bias"}:
            return None
        return linear(bound["input"], bound["weight"], bound.get("bias"), meta=meta)
    if packet == "cross_entropy_loss":
        names = ("logits", "labels", "weight", "reduction", "ignore_index", "label_smoothing")
        bound = dict(zip(names, args), **kwargs)
        if set(bound) - set(names) or "labels" not in bound:
            return None
        out = cross_entropy(bound.pop("logits"), bound.pop("labels"), **bound)
        return None if out is None else (out, None)
    if packet in UNARY and args:
        out = unary(op, *args, meta=meta, **kwargs)
        return None if out is None else (out, None)
    return None
