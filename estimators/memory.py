"""What autograd saves for backward, per operator, at local-shard shapes (torch-free).

Each rule below was checked on torch 2.13 with ``torch.autograd.graph.saved_tensors_hooks``
(see tests/estimators/test_saved_tensors.py, which re-checks them against real ops):

    kind / op                         saves (besides parameters)
    linear, conv2d                    input                                   (operand)
    mm, bmm, matmul, einsum           both operands; addmm/baddbmm not the bias
    relu, tanh, sigmoid, exp, sqrt,   output
      rsqrt, reciprocal
    gelu, silu, log, pow, erf, ...    input
    mul, div (two tensors)            each operand whose partner needs a gradient
    maximum, minimum                  both operands
    where / masked_fill               the boolean condition (operand)
    add, sub, neg, views, cat, sum    nothing
    softmax, log_softmax              output
    layer_norm                        input + mean, rstd (rows x float32 each)
    rms_norm                          input + rstd; on CPU also x*rstd (full size)
    batch_norm (training)             input + save_mean, save_invstd (C x float32 each) + the
                                      running_mean/var buffers (saved by reference; C each);
                                      (also tensoropt's executor's, synchronised or not);
                                      "decomposed" (a BN written with tensor ops): centred and
                                      normalised input (new, full size) + 1/std
    group_norm                        input + mean, rstd (N x G x float32 each)
    dropout (training, p > 0)         mask: CPU a float tensor of the input's size (input*noise
                                      path); CUDA a bool mask (native_dropout)
    max_pool / adaptive_max_pool      input + int64 indices of the output's shape
    avg_pool, adaptive_avg_pool       input (adaptive_avg_pool to 1x1 becomes a mean: nothing)
    embedding                         the indices (operand)
    cross_entropy                     log_softmax of the logits (new) + target (operand) + a
                                      4-byte total weight
    mse_loss                          prediction and target (operands)
    sdpa, math path                   q*scale and k*scale (new, q and k sized), the attention
      (CPU with dropout, or forced)   weights b*h*t*s (new), v (operand); with dropout in
                                      training two more b*h*t*s tensors on CPU (mask + dropped
                                      weights), one float + one bool mask on CUDA
    sdpa, fused path (flash /         q, k, v (operands), its output (b,t,h,d-contiguous: the
      efficient: the default)         next transpose + reshape is a view of it) and the
                                      logsumexp b*h*t float32; with an explicit mask also the
                                      mask as a float t*s bias
    broadcast (broadcast_tensors)     nothing (expands; backward needs only the shapes)
    opaque                            assumed: every activation operand (conservative)
    parameters (mixed precision:      the compute-dtype copy of a parameter the op keeps
      :func:`keeps_param`)            (linear/conv/matmul weights when the input needs a
                                      gradient; norm and elementwise parameters; not embedding)

An operator none of whose operands needs a gradient and that has no parameters saves nothing.
"Operand" entries share storage with the producer's output when the layout is unchanged; the
cost graph (:mod:`estimators.node_costs`) counts such a storage once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from estimators.dtypes import DTYPE_BYTES, itemsize  # noqa: F401 - re-exported (the one dtype table)

ITEMSIZE = DTYPE_BYTES
"""Bytes per element of each dtype name (:data:`estimators.dtypes.DTYPE_BYTES`)."""

OPTIMIZER_STATE_FACTOR = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}
"""Optimizer state per parameter element, in parameter-sized tensors (torch.optim defaults)."""

_SAVES_OUTPUT = {"relu", "relu_", "tanh", "sigmoid", "exp", "sqrt", "rsqrt", "reciprocal"}
_SAVES_NOTHING = {"add", "add_", "sub", "rsub", "neg", "clone", "contiguous", "to", "alias", "pad",
                  "constant_pad_nd"}
_SAVES_BOTH = {"maximum", "minimum", "mm", "bmm", "matmul", "einsum"}
_CONDITION_ARG = {"where": 0, "masked_fill": 1}


def numel(shape) -> int:
    """Number of elements of a shape.

    Example:
        >>> numel((2, 3)), numel(())
        (6, 1)
    """
    return math.prod(shape) if shape else 1


def optimizer_factor(optimizer: str) -> int:
    """Parameter-sized optimizer state tensors per parameter for ``optimizer``.

    Example:
        >>> optimizer_factor("adamw"), optimizer_factor("sgd")
        (2, 0)
    """
    try:
        return OPTIMIZER_STATE_FACTOR[optimizer.lower()]
    except KeyError:
        raise ValueError(
            f"unknown optimizer {optimizer!r}; expected one of {sorted(OPTIMIZER_STATE_FACTOR)}"
        ) from None


@dataclass(frozen=True)
class SavedSpec:
    """What one operator saves: operand indices (into the node's ``inputs``) and whether its output."""

    inputs: tuple[int, ...] = ()
    output: bool = False


@dataclass(frozen=True)
class SavingRules:
    """How the executor runs the ops whose saved tensors depend on it.

    Attributes:
        device_kind: "cpu" or "gpu" (dropout masks, rms_norm, the attention kernel differ).
        sdpa: attention kernel: "auto" (torch's choice), "math" or "fused" (see :func:`sdpa_path`).
        batch_norm: "native" (aten batch_norm: input + per-channel stats; tensoropt's executor's
            batch norm saves the same, synchronised or not) or "decomposed" (a batch norm written
            with tensor ops: the centred input and the normalised output, full size, + 1/std per
            channel; what the executor saved before issue 16).
    """

    device_kind: str = "gpu"
    sdpa: str = "auto"
    batch_norm: str = "native"

    def __post_init__(self):
        if self.sdpa not in ("auto", "math", "fused"):
            raise ValueError(f"sdpa backend must be 'auto', 'math' or 'fused', got {self.sdpa!r}")
        if self.batch_norm not in ("native", "decomposed"):
            raise ValueError(f"batch_norm must be 'native' or 'decomposed', got {self.batch_norm!r}")


_SAVES_INPUT_AND_OUTPUT = ("amax", "amin", "max", "min")
"""Reductions whose backward reads the input and the result (where the extreme was)."""


def _short(op: str) -> str:
    """``"aten.relu.default"`` -> ``"relu"``."""
    parts = op.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "aten" else parts[-1]


def sdpa_path(node: dict, rules: SavingRules) -> str:
    """Which attention kernel autograd records: ``"math"`` or ``"fused"`` (flash / efficient).

    ``rules.sdpa`` "math" or "fused" forces it; "auto" follows torch 2.13's dispatch: the fused
    kernels unless on CPU with dropout (the CPU flash kernel has no dropout).

    Example:
        >>> cpu = SavingRules("cpu")
        >>> sdpa_path({"attrs": {"dropout_p": 0.1}}, cpu), sdpa_path({"attrs": {}}, cpu)
        ('math', 'fused')
    """
    if rules.sdpa != "auto":
        return rules.sdpa
    dropout = (node.get("attrs") or {}).get("dropout_p", 0.0) > 0
    return "math" if rules.device_kind == "cpu" and dropout else "fused"


def saved_spec(node: dict, rules: SavingRules = SavingRules()) -> SavedSpec:
    """Which operands and whether the output a node's autograd saves (see the module table).

    Args:
        node: OpGraph node attributes (``op``, ``kind``, ``inputs``, ``operands``).
        rules: how the executor runs attention and batch norm (:class:`SavingRules`).

    Example:
        >>> saved_spec({"op": "aten.relu.default", "kind": "elementwise", "inputs": [{}], "operands": []})
        SavedSpec(inputs=(), output=True)
    """
    kind, name = node["kind"], _short(node["op"])
    operands = node.get("operands") or [{"role": "input", "index": i} for i in range(len(node["inputs"]))]
    act = {pos: o["index"] for pos, o in enumerate(operands) if o.get("role") == "input"}
    n_in = len(node["inputs"])

    def at(*positions: int) -> tuple[int, ...]:
        return tuple(sorted({act[p] for p in positions if p in act}))

    if kind in ("input", "cat", "stack", "reduce", "broadcast") and name not in _SAVES_INPUT_AND_OUTPUT:
        return SavedSpec()
    if kind in ("linear", "conv2d", "opaque", "mse_loss"):
        return SavedSpec(tuple(range(n_in)))
    if kind == "matmul":
        if name in ("addmm", "baddbmm"):
            return SavedSpec(at(1, 2))
        return SavedSpec(tuple(range(n_in)))
    if kind in ("softmax", "log_softmax"):
        return SavedSpec(output=True)
    attrs = node.get("attrs") or {}
    if (
        kind == "adaptive_pool"
        and attrs.get("mode") == "avg"
        and list(attrs.get("output_size", [])) == [1, 1]
    ):
        return SavedSpec()  # becomes a mean: nothing saved
    if kind == "batch_norm" and rules.batch_norm == "decomposed" and attrs.get("training", True):
        return SavedSpec()
    if kind in ("layer_norm", "rms_norm", "batch_norm", "group_norm", "pool", "adaptive_pool"):
        return SavedSpec(at(0))
    if kind in ("embedding", "dropout"):
        return SavedSpec(tuple(range(n_in)) if kind == "embedding" else ())
    if kind == "cross_entropy":
        return SavedSpec(at(1))
    if kind == "sdpa":
        if sdpa_path(node, rules) == "math":
            return SavedSpec(at(2))
        # the fused kernels keep their output (allocated b,t,h,d-contiguous, so the usual
        # transpose + reshape into the output projection is a view of this same storage)
        return SavedSpec(at(0, 1, 2), output=True)
    if name in _SAVES_INPUT_AND_OUTPUT:
        return SavedSpec(at(0), output=True)
    # elementwise
    if name in _SAVES_OUTPUT:
        return SavedSpec(output=True)
    if name in _SAVES_NOTHING or len(operands) == 0:
        return SavedSpec()
    if name in _CONDITION_ARG:
        return SavedSpec(at(_CONDITION_ARG[name]))
    if name in _SAVES_BOTH:
        return SavedSpec(tuple(range(n_in)))
    if name in ("mul", "mul_", "div"):
        if len(operands) < 2:
            return SavedSpec()
        # operands that take a gradient: activations and parameters (HF's RMSNorm: weight * x saves x)
        grad = set(act) | {pos for pos, o in enumerate(operands) if o.get("role") == "param"}
        saved = {1} if 0 in grad else set()  # d/d(self) needs other
        if 1 in grad:
            saved |= {0, 1} if name == "div" else {0}
        return SavedSpec(at(*saved))
    return SavedSpec(at(0))


_COPYING_VIEWS = frozenset({"aten.clone.default", "aten._to_copy.default", "aten.lift_fresh_copy.default"})
_CASTING_VIEWS = frozenset({"aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout",
                            "aten.to.device", "aten.type_as.default"})
_REORDERING_VIEWS = frozenset({"aten.expand.default", "aten.expand_as.default", "aten.transpose.int",
                               "aten.permute.default", "aten.t.default", "aten.movedim.int",
                               "aten.swapaxes.default"})
_MATERIALISING_VIEWS = frozenset({"aten.reshape.default", "aten.contiguous.default",
                                  "aten.flatten.using_ints"})


def copy_key(views, src_dtype: str, dtype: str) -> tuple[str, ...] | None:
    """The part of a folded view chain that makes a new storage (up to its last copying op), or
    None when the chain hands its consumer a view of the producer's output.

    Copying ops: a clone or copy, a dtype cast (when the dtypes differ), a reshape/contiguous
    after an expand or a transpose (HF's ``repeat_kv``: ``expand`` then ``reshape`` materialises
    the repeated heads). Two operands of one producer with the same key read one storage (the
    exported program computes the cast once and hands it to every consumer; the executor
    memoises it the same way), so it is charged once (:class:`estimators.op_costs.GraphInfo`).

    Example:
        >>> copy_key(["aten.view.default"], "float32", "float32") is None
        True
        >>> copy_key(["aten.to.dtype", "aten.view.default"], "bfloat16", "float32")
        ('aten.to.dtype',)
        >>> copy_key(["aten.unsqueeze.default", "aten.expand.default", "aten.reshape.default"],
        ...          "float32", "float32")
        ('aten.unsqueeze.default', 'aten.expand.default', 'aten.reshape.default')
    """
    views = tuple(views)
    last, reordered = -1, False
    for i, v in enumerate(views):
        if v in _COPYING_VIEWS or (src_dtype != dtype and v in _CASTING_VIEWS):
            last, reordered = i, False
        elif v in _REORDERING_VIEWS:
            reordered = True
        elif v in _MATERIALISING_VIEWS and reordered:
            last, reordered = i, False
    if last < 0:
        return views if src_dtype != dtype else None  # a cast the chain does not name
    return views[: last + 1]


def copies_operand(views, src_dtype: str, dtype: str) -> bool:
    """Whether a folded view chain hands its consumer a new storage rather than a view of the
    producer's (see :func:`copy_key`).

    Example:
        >>> copies_operand(["aten.view.default", "aten.split.Tensor"], "float32", "float32")
        False
        >>> copies_operand(["aten.unsqueeze.default", "aten.expand.default", "aten.reshape.default"],
        ...                "float32", "float32")
        True
    """
    return copy_key(views, src_dtype, dtype) is not None


def saved_operand_key(producer: dict, entry: dict, rules: SavingRules) -> tuple[str, ...] | None:
    """Which storage a saved operand ``entry`` (an ``inputs`` entry reading ``producer``) is:
    None for the producer's output itself (a view of it), else the :func:`copy_key` of the copy.

    A fused attention kernel's output is allocated b,t,h,d-contiguous, so the usual transpose +
    contiguous + reshape after it is a view, not a copy.

    Example:
        >>> p = {"kind": "elementwise", "op": "aten.add.Tensor", "out_dtype": "bfloat16"}
        >>> saved_operand_key(p, {"views": ["aten.to.dtype"], "dtype": "float32"}, SavingRules())
        ('aten.to.dtype',)
    """
    if producer.get("kind") == "sdpa" and sdpa_path(producer, rules) == "fused":
        return None
    return copy_key(entry.get("views") or (), str(producer.get("out_dtype", "float32")),
                    str(entry.get("dtype", "float32")))


def keeps_param(node: dict, shape, inputs_need_grad) -> bool:
    """Whether an operator saves its parameter of ``shape`` for backward (the tensor it computes with).

    Matters in mixed precision, where that tensor is a compute-dtype copy of the master parameter
    (kept from forward to this operator's backward) rather than the parameter itself. linear, conv2d
    and matmul keep the weight (not the bias) to form the input's gradient, so only when an
    activation operand needs one (``inputs_need_grad``: one bool per ``node["inputs"]``);
    embedding keeps only its indices; norms and elementwise ops keep every parameter.

    Example:
        >>> linear = {"kind": "linear"}
        >>> [keeps_param(linear, (8, 4), [True]), keeps_param(linear, (8,), [True]),
        ...  keeps_param(linear, (8, 4), [False])]
        [True, False, False]
        >>> keeps_param({"kind": "embedding"}, (9, 8), [0]), keeps_param({"kind": "layer_norm"}, (8,), [1])
        (False, True)
    """
    kind = node["kind"]
    if kind == "embedding":
        return False
    if kind in ("linear", "conv2d", "matmul"):
        return len(shape) >= 2 and any(inputs_need_grad)
    return True


def _local_mask_shape(node: dict, q: tuple, k: tuple) -> tuple[int, ...]:
    """Local shape of an attention mask operand: its dims split as q's where they match q's
    (the executor lays the mask out like q), broadcast dims kept; ``(T, S)`` when it is unknown.

    Example:
        >>> node = {"inputs": [{"shape": (8, 4, 32, 16)}], "operands": [{}, {}, {},
        ...         {"role": "buffer", "shape": (8, 1, 32, 32)}]}
        >>> _local_mask_shape(node, (4, 4, 32, 16), (4, 4, 32, 16))  # batch split in two
        (4, 1, 32, 32)
    """
    operands = node.get("operands") or []
    q_global = tuple(node["inputs"][0]["shape"]) if node.get("inputs") else q
    if len(operands) < 4 or not operands[3].get("shape"):
        return (q[-2], k[-2])
    mask = tuple(operands[3]["shape"])
    offset = len(q_global) - len(mask)
    out = []
    for d, m in enumerate(mask):
        j = d + offset
        split = 0 <= j < len(q) and m > 1 and m == q_global[j] and q[j] != q_global[j]
        out.append(q[j] if split else m)
    return tuple(out)


def extra_saved_bytes(
    node: dict,
    in_shapes: list[tuple[int, ...]],
    out_shape: tuple[int, ...],
    rules: SavingRules = SavingRules(),
) -> int:
    """Bytes of the *new* tensors a node saves (statistics, masks, indices), at local shapes.

    Args:
        node: OpGraph node attributes (``op``, ``kind``, ``attrs``, ``inputs``, ``out_dtype``).
        in_shapes: local shapes of the node's ``inputs`` (activation operands), in order.
        out_shape: local shape of the node's output.
        rules: device kind and how attention / batch norm run (:class:`SavingRules`).

    Example:
        >>> node = {"op": "aten.layer_norm.default", "kind": "layer_norm", "attrs": {"normalized_shape": [8]},
        ...         "inputs": [{"dtype": "float32"}], "out_dtype": "float32"}
        >>> extra_saved_bytes(node, [(4, 8)], (4, 8))  # mean + rstd, 4 rows x 4 bytes each
        32
    """
    kind, attrs, device_kind = node["kind"], node.get("attrs") or {}, rules.device_kind
    dtype = node.get("out_dtype", "float32")
    size = itemsize(dtype)
    stat = max(4, size)  # statistics are kept in the accumulation type (float32 for half types)
    x = in_shapes[0] if in_shapes else out_shape
    if kind == "layer_norm" or kind == "rms_norm":
        k = len(attrs.get("normalized_shape") or [1])
        rows = numel(x[: len(x) - k])
        extra = (2 if kind == "layer_norm" else 1) * rows * stat
        if kind == "rms_norm" and device_kind == "cpu":
            extra += numel(x) * size
        return extra
    if kind == "batch_norm":
        if not attrs.get("training", True) or len(x) < 2:
            return 0
        if rules.batch_norm == "decomposed":  # centred x, normalised x (when scaled), rsqrt(var + eps)
            has_weight = any(k.endswith("weight") for k in node.get("params", {}))
            return (1 + int(has_weight)) * numel(x) * size + x[1] * stat
        running = 2 * x[1] * size if node.get("buffers") else 0  # running_mean/var are saved too
        return 2 * x[1] * stat + running
    if kind == "group_norm":
        channels = x[1] if len(x) > 1 else 1
        full_c = (
            node["inputs"][0]["shape"][1]
            if node.get("inputs") and len(node["inputs"][0]["shape"]) > 1
            else channels
        )
        groups = max(1, attrs.get("num_groups", 1) * channels // max(1, full_c))
        return 2 * x[0] * groups * stat
    if kind == "dropout":
        if not attrs.get("train", True) or attrs.get("p", 0.5) <= 0:
            return 0
        return numel(x) * (size if device_kind == "cpu" else 1)
    if kind in ("pool", "adaptive_pool"):
        if attrs.get("mode") == "max":
            return numel(out_shape) * 8
        return 0
    if kind == "cross_entropy":
        return numel(x) * size + 4
    if kind == "sdpa" and sdpa_path(node, rules) == "fused":
        q, k = in_shapes[0], in_shapes[1]
        extra = numel(q[:-1]) * 4  # logsumexp (float32); the output is charged as the node's output
        if attrs.get("has_mask"):  # the mask, converted to an additive float bias of its own shape
            extra += numel(_local_mask_shape(node, q, k)) * size
        return extra
    if kind == "sdpa":
        q, k = in_shapes[0], in_shapes[1]
        attn = numel(q[:-1]) * k[-2]
        extra = (numel(q) + numel(k) + attn) * size
        if attrs.get("dropout_p", 0.0) > 0:
            extra += attn * size + (attn * size if device_kind == "cpu" else attn)
        return extra
    return 0
