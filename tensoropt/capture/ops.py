"""Semantic kinds of aten ops, their attributes and their forward FLOPs.

``kind`` is the category configspace and estimators dispatch on. Kinds: ``linear``, ``matmul``
(mm/bmm/matmul/einsum/addmm/baddbmm), ``conv2d``, ``batch_norm``, ``layer_norm``, ``rms_norm``,
``group_norm``, ``embedding``, ``pool`` (max/avg), ``adaptive_pool``, ``elementwise``,
``softmax``, ``log_softmax``, ``dropout``, ``sdpa``, ``cross_entropy``, ``mse_loss``, ``cat``, ``stack``
(operands of one shape joined along a new dim), ``reduce`` (sum/mean/amax/max/min over dims),
``pad`` (constant padding), ``broadcast`` (``broadcast_tensors``: its
operands expanded to one shape, element 0 the node's output), ``input`` (a user input), ``opaque``
(anything else).
"""

from __future__ import annotations

from estimators.memory import numel

ELEMENTWISE_OPS = frozenset(
    "aten." + s
    for s in (
        "relu.default gelu.default silu.default tanh.default sigmoid.default exp.default log.default "
        "sqrt.default rsqrt.default neg.default abs.default pow.Tensor_Scalar pow.Tensor_Tensor "
        "add.Tensor add.Scalar sub.Tensor sub.Scalar rsub.Scalar rsub.Tensor mul.Tensor mul.Scalar "
        "div.Tensor div.Scalar div.Tensor_mode hardtanh.default leaky_relu.default elu.default "
        "hardswish.default hardsigmoid.default mish.default softplus.default relu6.default "
        "erf.default sin.default cos.default reciprocal.default square.default clamp.default "
        "clamp_min.default clamp_max.default where.self where.ScalarOther where.ScalarSelf "
        "masked_fill.Scalar masked_fill.Tensor maximum.default minimum.default "
        "relu_.default add_.Tensor mul_.Tensor gelu_.default silu_.default"
    ).split()
)

_KINDS = {
    "aten.linear.default": "linear",
    "aten.matmul.default": "matmul",
    "aten.mm.default": "matmul",
    "aten.bmm.default": "matmul",
    "aten.addmm.default": "matmul",
    "aten.baddbmm.default": "matmul",
    "aten.einsum.default": "matmul",
    "aten.conv2d.default": "conv2d",
    "aten.batch_norm.default": "batch_norm",
    "aten._native_batch_norm_legit_functional.default": "batch_norm",
    "aten._native_batch_norm_legit.default": "batch_norm",
    "aten._native_batch_norm_legit_no_training.default": "batch_norm",
    "aten.native_batch_norm.default": "batch_norm",
    "aten.layer_norm.default": "layer_norm",
    "aten.native_layer_norm.default": "layer_norm",
    "aten.rms_norm.default": "rms_norm",
    "aten.group_norm.default": "group_norm",
    "aten.native_group_norm.default": "group_norm",
    "aten.embedding.default": "embedding",
    "aten.max_pool2d.default": "pool",
    "aten.max_pool2d_with_indices.default": "pool",
    "aten.avg_pool2d.default": "pool",
    "aten.adaptive_avg_pool2d.default": "adaptive_pool",
    "aten._adaptive_avg_pool2d.default": "adaptive_pool",
    "aten.adaptive_max_pool2d.default": "adaptive_pool",
    "aten.softmax.int": "softmax",
    "aten._softmax.default": "softmax",
    "aten.log_softmax.int": "log_softmax",
    "aten._log_softmax.default": "log_softmax",
    "aten.dropout.default": "dropout",
    "aten.native_dropout.default": "dropout",
    "aten.scaled_dot_product_attention.default": "sdpa",
    "aten.cross_entropy_loss.default": "cross_entropy",
    "aten.nll_loss_forward.default": "cross_entropy",
    "aten.mse_loss.default": "mse_loss",
    "aten.cat.default": "cat",
    "aten.stack.default": "stack",
    "aten.sum.default": "reduce",
    "aten.sum.dim_IntList": "reduce",
    "aten.mean.default": "reduce",
    "aten.mean.dim": "reduce",
    "aten.amax.default": "reduce",
    "aten.amin.default": "reduce",
    "aten.max.dim": "reduce",
    "aten.min.dim": "reduce",
    "aten.max.default": "reduce",
    "aten.min.default": "reduce",
    "aten.pad.default": "pad",
    "aten.constant_pad_nd.default": "pad",
    "aten.broadcast_tensors.default": "broadcast",
}


def op_kind(op: str) -> str:
    """Semantic kind of an aten op name; ``"opaque"`` when unknown.

    Example:
        >>> op_kind("aten.linear.default"), op_kind("aten.gelu.default"), op_kind("aten.cumsum.default")
        ('linear', 'elementwise', 'opaque')
    """
    if op in _KINDS:
        return _KINDS[op]
    if op in ELEMENTWISE_OPS:
        return "elementwise"
    return "opaque"


def _arg(args: tuple, kwargs: dict, index: int, name: str, default):
    if len(args) > index:
        return args[index]
    return kwargs.get(name, default)


def _pair(v) -> list[int]:
    if isinstance(v, int):
        return [v, v]
    v = list(v)
    return v * 2 if len(v) == 1 else v


def op_attrs(op: str, kind: str, args: tuple, kwargs: dict, in_shapes: list[tuple[int, ...]]) -> dict:
    """Op-specific attributes other stages need (JSON-friendly).

    Args:
        op: aten op name. kind: its kind. args/kwargs: the fx node's arguments (tensors appear
        as fx nodes and are ignored). in_shapes: shapes of all tensor operands in order.

    Example:
        >>> op_attrs("aten.softmax.int", "softmax", (None, -1), {}, [(2, 3)])
        {'dim': 1}
    """
    rank = len(in_shapes[0]) if in_shapes else 0
    if kind == "conv2d":
        return {
            "stride": _pair(_arg(args, kwargs, 3, "stride", 1)),
            "padding": _pair(_arg(args, kwargs, 4, "padding", 0))
            if not isinstance(_arg(args, kwargs, 4, "padding", 0), str)
            else _arg(args, kwargs, 4, "padding", 0),
            "dilation": _pair(_arg(args, kwargs, 5, "dilation", 1)),
            "groups": int(_arg(args, kwargs, 6, "groups", 1)),
        }
    if kind in ("softmax", "log_softmax"):
        d = _arg(args, kwargs, 1, "dim", -1)
        return {"dim": d + rank if d < 0 else d}
    if kind in ("layer_norm", "rms_norm"):
        return {"normalized_shape": list(_arg(args, kwargs, 1, "normalized_shape", []))}
    if kind == "group_norm":
        return {"num_groups": int(_arg(args, kwargs, 1, "num_groups", 1))}
    if kind == "batch_norm":
        return {
            "training": bool(_arg(args, kwargs, 5, "training", True))
            if op == "aten.batch_norm.default"
            else True
        }
    if kind == "dropout":
        return {
            "p": float(_arg(args, kwargs, 1, "p", 0.5)),
            "train": bool(_arg(args, kwargs, 2, "train", True)),
        }
    if kind == "pool":
        kernel = _pair(_arg(args, kwargs, 1, "kernel_size", 1))
        stride = _arg(args, kwargs, 2, "stride", None)
        return {
            "kernel": kernel,
            "stride": _pair(stride) if stride else kernel,
            "padding": _pair(_arg(args, kwargs, 3, "padding", 0)),
            "mode": "max" if "max" in op else "avg",
        }
    if kind == "adaptive_pool":
        return {
            "output_size": _pair(_arg(args, kwargs, 1, "output_size", 1)),
            "mode": "max" if "max" in op else "avg",
        }
    if kind == "cat":
        d = _arg(args, kwargs, 1, "dim", 0)
        return {"dim": d + rank if d < 0 else d}
    if kind == "stack":  # the new dim, of the output (rank + 1 dims)
        d = _arg(args, kwargs, 1, "dim", 0)
        return {"dim": d + rank + 1 if d < 0 else d}
    if kind == "cross_entropy":
        red = _arg(args, kwargs, 3, "reduction", 1)
        attrs = {
            "reduction": {0: "none", 1: "mean", 2: "sum"}.get(red, red),
            "class_dim": 1 if rank > 1 else 0,
        }
        if "nll_loss" not in op:  # (self, target, weight, reduction, ignore_index, label_smoothing)
            attrs["weighted"] = _arg(args, kwargs, 2, "weight", None) is not None
            attrs["label_smoothing"] = float(_arg(args, kwargs, 5, "label_smoothing", 0.0) or 0.0)
        return attrs
    if kind == "mse_loss":
        red = _arg(args, kwargs, 2, "reduction", 1)
        return {"reduction": {0: "none", 1: "mean", 2: "sum"}.get(red, red)}
    if kind == "reduce":
        dims = _arg(args, kwargs, 1, "dim", None)
        if dims is None or "default" in op:  # sum/mean/max/min.default reduce every dim (amax's too, kept so)
            dims = list(range(rank))
        dims = [dims] if isinstance(dims, int) else list(dims)
        keep = bool(_arg(args, kwargs, 2, "keepdim", False)) if "default" not in op else False
        return {
            "dims": sorted(d + rank if d < 0 else d for d in dims),
            "keepdim": keep,
            "mode": op.split(".")[1],
        }
    if kind == "sdpa":
        return {
            "dropout_p": float(_arg(args, kwargs, 4, "dropout_p", 0.0)),
            "is_causal": bool(_arg(args, kwargs, 5, "is_causal", False)),
            "has_mask": _arg(args, kwargs, 3, "attn_mask", None) is not None,
        }
    if kind == "matmul" and op == "aten.einsum.default":
        return {"equation": str(args[0]).replace(" ", "")}
    if kind == "embedding":
        return {"padding_idx": int(_arg(args, kwargs, 2, "padding_idx", -1))}
    if kind == "pad":
        return pad_attrs(op, args, kwargs, rank)
    return {}


def pad_attrs(op: str, args: tuple, kwargs: dict, rank: int) -> dict:
    """``pad`` (torch's order: last dim first, left then right), ``mode`` and the ``padded_dims``
    (dims with a non-zero amount on either side) of ``aten.pad`` / ``aten.constant_pad_nd``.

    Example:
        >>> pad_attrs("aten.pad.default", (None, [0, 1]), {}, 2)
        {'pad': [0, 1], 'mode': 'constant', 'padded_dims': [1]}
    """
    pad = [int(p) for p in _arg(args, kwargs, 1, "pad", [])]
    mode = str(_arg(args, kwargs, 2, "mode", "constant")) if op == "aten.pad.default" else "constant"
    padded = sorted(rank - 1 - i for i in range(len(pad) // 2) if pad[2 * i] or pad[2 * i + 1])
    return {"pad": pad, "mode": mode, "padded_dims": padded}


_DIM_ARG_NAMES = frozenset({"dim", "dims", "dim0", "dim1", "axis", "start_dim", "end_dim", "dimension"})

CROSS_SAMPLE_OPS = frozenset(
    "aten." + s
    for s in (
        "index.Tensor index_put.default index_put_.default nonzero.default unique.default "
        "_unique2.default unique_dim.default masked_select.default take.default stack.default "
        "bincount.default histc.default nonzero_static.default repeat_interleave.Tensor"
    ).split()
)
"""Opaque ops that index or gather across samples: never offered a batch split."""


def opaque_dim_args(target, args: tuple, kwargs: dict, rank: int) -> list[int] | None:
    """Tensor dims an op's dim-like arguments (``dim``, ``dims``, ``axis``...) refer to.

    Defaults from the op schema count (``sort`` works on dim -1 unless told otherwise). Returns
    None when the op has no schema to read (then nothing is known to be safe).

    Example:
        >>> import torch
        >>> opaque_dim_args(torch.ops.aten.cumsum.default, (None, 1), {}, 3)
        [1]
        >>> opaque_dim_args(torch.ops.aten.sort.default, (None,), {}, 2)
        [1]
    """
    schema = getattr(target, "_schema", None)
    if schema is None:
        return None
    dims: list[int] = []
    for i, a in enumerate(schema.arguments):
        if a.name not in _DIM_ARG_NAMES:
            continue
        if i < len(args) and not a.kwarg_only:
            v = args[i]
        elif a.name in kwargs:
            v = kwargs[a.name]
        elif a.has_default_value():
            v = a.default_value
        else:
            continue
        for d in [v] if isinstance(v, int) else list(v or []):
            if isinstance(d, int) and rank:
                dims.append(d % rank)
    return sorted(set(dims))


def op_flops(
    kind: str, attrs: dict, in_shapes: list[tuple[int, ...]], out_shape: tuple[int, ...], op: str = ""
) -> int:
    """Forward FLOPs (multiply-add = 2) of one op in closed form.

    linear ``2*rows*in*out`` (bias not counted); matmul ``2*numel(out)*K``; conv2d
    ``2*N*Cout*Hout*Wout*(Cin/groups)*kh*kw``; sdpa ``4*B*H*T*S*D + 5*B*H*T*S`` (two matmuls plus
    softmax); norms, softmax and cross_entropy 5 per element; mse_loss 3 per element (difference,
    square, sum); pooling ``kh*kw`` per output;
    elementwise, dropout, reductions and opaque ops one per element; views, cat, embedding and
    broadcast (expands, no arithmetic) and stack 0.

    Example:
        >>> op_flops("linear", {}, [(4, 8), (16, 8)], (4, 16))
        1024
    """
    out = numel(out_shape)
    if kind == "linear":
        return 2 * out * in_shapes[0][-1]
    if kind == "matmul":
        if op == "aten.einsum.default" and "equation" in attrs:
            return 2 * einsum_iteration_size(attrs["equation"], in_shapes)
        a = in_shapes[1] if op in ("aten.addmm.default", "aten.baddbmm.default") else in_shapes[0]
        return 2 * out * a[-1]
    if kind == "conv2d":
        w = in_shapes[1]
        return 2 * out * w[1] * w[2] * w[3]
    if kind == "sdpa":
        q, k = in_shapes[0], in_shapes[1]
        b_h = numel(q[:-2])
        t, d, s = q[-2], q[-1], k[-2]
        return 4 * b_h * t * s * d + 5 * b_h * t * s
    if kind in ("batch_norm", "layer_norm", "rms_norm", "group_norm", "softmax", "log_softmax"):
        return 5 * out
    if kind == "cross_entropy":
        return 5 * numel(in_shapes[0])
    if kind == "mse_loss":
        return 3 * numel(in_shapes[0])
    if kind == "pool":
        k = attrs.get("kernel", [1, 1])
        return out * k[0] * k[1]
    if kind in ("adaptive_pool", "reduce"):
        return numel(in_shapes[0]) if in_shapes else out
    if kind in ("cat", "stack", "embedding", "input", "broadcast"):
        return 0
    return out


def einsum_iteration_size(equation: str, shapes: list[tuple[int, ...]]) -> int:
    """Product of the sizes of all distinct letters of an einsum (its iteration space).

    Example:
        >>> einsum_iteration_size("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)])
        120
    """
    lhs = equation.split("->")[0].split(",")
    sizes: dict[str, int] = {}
    for letters, shape in zip(lhs, shapes):
        for ch, s in zip(letters, shape):
            sizes[ch] = s
    return numel(list(sizes.values()))
