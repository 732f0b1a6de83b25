"""Parallel dims of each operator kind (the rules behind the configuration space).

Each rule reads an OpGraph node's attributes and returns its :class:`ParDim` list. Operand dims
are dims of the operand *as the operator consumes it* (after folded views); parameter dims are
the parameter's own dims (mapped back through the operand's ``dim_map``).

Only splits the executor runs correctly are produced (see EXECUTOR.md): conv2d channel splits go
through the executor's explicit ``local_map`` path and can be switched off in
``CONV_CHANNEL_SPLITS_ENABLED``; spatial splits are never offered; attention splits batch and
heads only; norms split the dims they do not normalise over.
"""

from __future__ import annotations

from tensoropt.capture.dims import matmul_letter_roles
from tensoropt.capture.equations import matmul_equation
from tensoropt.capture.ops import CROSS_SAMPLE_OPS
from tensoropt.configspace.space import ParDim

CONV_CHANNEL_SPLITS_ENABLED: set[str] = {"out", "in"}
"""conv2d channel splits offered besides ``batch`` (the executor runs them with ``local_map``)."""

POOL_CHANNEL_SPLIT_ENABLED: bool = True
"""Whether max/avg/adaptive pooling offers the channel (``out``) split besides ``batch``."""

_SPLITTABLE_NAMES = ("batch", "seq", "heads", "out", "in")


def _param_dim(operand: dict, consumed_dim: int | None) -> int | None:
    """The parameter's own dim that becomes ``consumed_dim`` of the operand, else None."""
    if consumed_dim is None:
        return None
    for own, c in enumerate(operand["dim_map"]):
        if c == consumed_dim:
            return own
    return None


def _aligned(shape: tuple, out_shape: tuple, out_dim: int) -> int | None:
    """Dim of a broadcast operand aligned with ``out_dim`` of the output (None if broadcast)."""
    j = out_dim - (len(out_shape) - len(shape))
    if j < 0 or shape[j] != out_shape[out_dim]:
        return None
    return j


def _pointwise_dims(node: dict, names: list, skip: set[int] = frozenset()) -> list[ParDim]:
    """Dims of a shape-preserving op: each named output dim, aligned in every operand by broadcasting."""
    out = tuple(node["out_shape"])
    dims, used = [], set()
    for d, name in enumerate(names):
        if d in skip or name not in _SPLITTABLE_NAMES or name in used or out[d] <= 1:
            continue
        used.add(name)
        operand_dims = tuple(_aligned(tuple(e["shape"]), out, d) for e in node["inputs"])
        params = {}
        for o in node["operands"]:
            if o["role"] == "param":
                params[o["key"]] = _param_dim(o, _aligned(tuple(o["shape"]), out, d))
        dims.append(ParDim(name, out[d], operand_dims, params, out_dim=d))
    return dims


def _only(node: dict, index: int, dim: int) -> tuple:
    return tuple(dim if i == index else None for i in range(len(node["inputs"])))


def input_dims(node: dict) -> list[ParDim]:
    """User inputs: ``batch`` (dim 0) and ``seq`` (dim 1 of token ids [B, T] and of [B, T, C] inputs)."""
    return _pointwise_dims(node, [n if n in ("batch", "seq") else None for n in node["dim_names"]])


def matmul_dims(node: dict) -> list[ParDim]:
    """linear/mm/bmm/matmul/addmm/einsum: letters of the einsum become batch/heads/seq/out/in."""
    operands = node["operands"]
    shapes = [o["shape"] for o in operands]
    eq, (pa, pb), bias = matmul_equation(node["op"], shapes, node["attrs"])
    if not eq:
        return []
    lhs, out_letters = eq.split("->")
    la, lb = lhs.split(",")
    roles = matmul_letter_roles(la, lb, out_letters)
    sizes = {}
    for letters, pos in ((la, pa), (lb, pb)):
        for ch, s in zip(letters, shapes[pos]):
            sizes.setdefault(ch, s)
    dims = []
    for ch, name in roles.items():
        operand_dims = [None] * len(node["inputs"])
        params: dict[str, int | None] = {}
        for letters, pos in ((la, pa), (lb, pb), (None, bias)):
            if pos is None or pos >= len(operands):
                continue
            o = operands[pos]
            if letters is None:  # a bias broadcast against the output
                d = out_letters.index(ch) if ch in out_letters else None
                local = None if d is None else _aligned(tuple(o["shape"]), tuple(node["out_shape"]), d)
            else:
                local = letters.index(ch) if ch in letters else None
            if o["role"] == "input":
                operand_dims[o["index"]] = local
            elif o["role"] == "param":
                own = _param_dim(o, local)
                if local is not None and own is None:
                    break  # a view of the parameter mixes this dim: cannot split it
                params[o["key"]] = own
        else:
            out_dim = out_letters.index(ch) if ch in out_letters else None
            limits = _flattened_inner_limits(node["op"], la, shapes[pb]).get(ch, {})
            dims.append(
                ParDim(
                    name,
                    sizes[ch],
                    tuple(operand_dims),
                    params,
                    out_dim=out_dim,
                    reduction=ch not in out_letters,
                    **limits,
                )
            )
    return dims


def _flattened_inner_limits(op: str, la: str, shape_b: tuple) -> dict[str, dict]:
    """Limits on the letters DTensor's decomposition merges as inner dims of a flattened group.

    DTensor runs linear (and matmul by a matrix) as ``[B*T, K] @ [K, N]`` and a batched matmul as
    ``[B*H, T, K] @ [B*H, K, S]``: a shard of an inner dim of the merged group (T, H) becomes a
    strided shard, which cannot be unflattened when it spans two mesh axes (measured at 2x2:
    ``seq=4`` and ``heads=4`` raise), and a seq split of linear comes back replicated when K is
    split too (``in=2,seq=2`` gives R where S(1) is due).
    """
    if op == "aten.linear.default" or (op == "aten.matmul.default" and len(shape_b) == 2):
        return {ch: {"max_axes": 1, "excludes": ("in",)} for ch in la[1:-1]}
    if op == "aten.matmul.default":
        return {ch: {"max_axes": 1} for ch in la[1:-2]}
    return {}


def conv2d_dims(node: dict) -> list[ParDim]:
    """conv2d: batch; out/in channels when enabled (``CONV_CHANNEL_SPLITS_ENABLED``, groups == 1)."""
    ops = node["operands"]
    x = ops[0]
    if x["role"] != "input":
        return []
    i = x["index"]
    out = node["out_shape"]
    params = [o for o in ops[1:] if o["role"] == "param"]
    dims = [ParDim("batch", out[0], _only(node, i, 0), {p["key"]: None for p in params}, out_dim=0)]
    weight = ops[1] if len(ops) > 1 and ops[1]["role"] == "param" else None
    if weight is None or node["attrs"].get("groups", 1) != 1:
        return dims
    bias = ops[2] if len(ops) > 2 and ops[2]["role"] == "param" else None
    if "out" in CONV_CHANNEL_SPLITS_ENABLED:
        pd = {weight["key"]: _param_dim(weight, 0)}
        if bias is not None:
            pd[bias["key"]] = _param_dim(bias, 0)
        dims.append(ParDim("out", out[1], tuple(None for _ in node["inputs"]), pd, out_dim=1))
    if "in" in CONV_CHANNEL_SPLITS_ENABLED:
        pd = {weight["key"]: _param_dim(weight, 1)}
        if bias is not None:
            pd[bias["key"]] = None
        dims.append(ParDim("in", x["shape"][1], _only(node, i, 1), pd, reduction=True, grad_sync=False))
    return dims


def norm_dims(node: dict) -> list[ParDim]:
    """Norms split the dims they do not normalise over.

    layer_norm/rms_norm: the dims before the normalised ones (``batch``, ``seq``). batch_norm:
    ``batch`` (the executor's synchronised batch norm reduces the statistics across shards) and
    channels as ``out`` (per-channel statistics, weight and bias split with them). group_norm:
    ``batch`` only: each row's statistics span its group's channels and every spatial position, so
    a channel or spatial split would need reduced statistics the executor does not compute (the
    batch split's backward runs through ``executor/ops/dtensor_rules.py``'s group-norm rule).
    """
    out = node["out_shape"]
    if node["kind"] in ("layer_norm", "rms_norm"):
        first_norm = len(out) - len(node["attrs"].get("normalized_shape", [out[-1]]))
        names = ["batch", "seq"][:first_norm] + [None] * (len(out) - min(first_norm, 2))
    else:
        names = ["batch"] + [None] * (len(out) - 1)
    dims = _pointwise_dims(node, names)
    for d in dims:  # norm parameters are per-feature: never split by batch or seq
        d.param_dims.clear()
    if node["kind"] == "batch_norm" and len(out) >= 2 and node["inputs"]:
        params = {o["key"]: _param_dim(o, 0) for o in node["operands"] if o["role"] == "param"}
        dims.append(ParDim("out", out[1], _only(node, 0, 1), params, out_dim=1, grad_sync=False))
    return dims


def embedding_dims(node: dict) -> list[ParDim]:
    """embedding: the index dims (batch, seq), ``vocab`` (partial output) and ``out`` (width)."""
    ops = node["operands"]
    weight = ops[0]
    if weight["role"] != "param":
        return _pointwise_dims(node, node["dim_names"])
    out = node["out_shape"]
    key = weight["key"]
    dims = []
    idx = next((o for o in ops[1:] if o["role"] == "input"), None)
    if idx is not None:
        for j, name in enumerate(["batch", "seq"][: len(idx["shape"])]):
            dims.append(ParDim(name, out[j], _only(node, idx["index"], j), {key: None}, out_dim=j))
    none = tuple(None for _ in node["inputs"])
    vocab, width = weight["shape"]
    # DTensor's masked vocabulary partial works on one mesh axis only ("MaskBuffer has been
    # materialized with conflicting data" over two)
    dims.append(
        ParDim(
            "vocab", vocab, none, {key: _param_dim(weight, 0)}, reduction=True, grad_sync=False, max_axes=1
        )
    )
    dims.append(ParDim("out", width, none, {key: _param_dim(weight, 1)}, out_dim=len(out) - 1))
    return dims


def sdpa_dims(node: dict) -> list[ParDim]:
    """scaled_dot_product_attention: batch and heads of q, k, v (and of a 4-D mask operand)."""
    q = node["operands"][0]["shape"]
    if len(q) != 4:
        return []
    dims = []
    for name, d in (("batch", 0), ("heads", 1)):
        operand_dims = []
        for k, e in enumerate(node["inputs"]):
            shape = e["shape"]
            if k < 3 or (len(shape) == 4 and shape[d] == q[d]):
                operand_dims.append(d if shape[d] == q[d] else None)
            else:
                operand_dims.append(None)
        if any(od is None for od in operand_dims[:3]):
            continue  # grouped-query attention: k/v have fewer heads
        dims.append(ParDim(name, q[d], tuple(operand_dims), out_dim=d))
    return dims


def cross_entropy_dims(node: dict) -> list[ParDim]:
    """cross_entropy: ``batch`` (+ ``seq`` of [N, C, T] logits), partial when the loss is reduced;
    the class dim of 2-D logits as ``out`` when the loss is a mean or a sum without class weights
    or label smoothing (the executor's vocabulary-parallel loss, executor/ops/vocab_parallel.py, whose
    output is the replicated loss). HuggingFace's causal-LM loss (``.float()``, flattened to
    ``[tokens, vocabulary]``, labels padded with -100) is such a loss: its class dim is the head's
    ``out`` dim through the folded upcast and view.

    Example:
        >>> node = {"op": "aten.cross_entropy_loss.default", "attrs": {"reduction": "mean"},
        ...         "inputs": [{"shape": (6, 10)}, {"shape": (6,)}]}
        >>> [(d.name, d.size, d.operand_dims) for d in cross_entropy_dims(node)]
        [('batch', 6, (0, 0)), ('out', 10, (1, None))]
        >>> node["attrs"]["label_smoothing"] = 0.1
        >>> [d.name for d in cross_entropy_dims(node)]
        ['batch']
    """
    reduced = node["attrs"].get("reduction", "mean") != "none"
    logits = node["inputs"][0]["shape"] if node["inputs"] else ()
    if not logits:
        return []
    dims = []
    spatial = [("batch", 0, 0)] + ([("seq", 2, 1)] if len(logits) == 3 else [])
    for name, ld, td in spatial:
        operand_dims = tuple(
            ld if k == 0 else (td if len(e["shape"]) > td else None) for k, e in enumerate(node["inputs"])
        )
        dims.append(
            ParDim(name, logits[ld], operand_dims, out_dim=None if reduced else td, reduction=reduced)
        )
    attrs = node["attrs"]
    class_split = (attrs.get("reduction", "mean") in ("mean", "sum") and not attrs.get("weighted")
                   and not attrs.get("label_smoothing"))
    if len(logits) == 2 and node["op"] == "aten.cross_entropy_loss.default" and class_split:
        dims.append(ParDim("out", logits[1], _only(node, 0, 1), out_dim=None, grad_sync=False))
    return dims


def mse_loss_dims(node: dict) -> list[ParDim]:
    """mse_loss of a prediction and a target of one shape: ``batch`` (dim 0 of both), the output a
    partial sum when the loss is reduced (each rank sums its rows' squared errors; a mean divides by
    the global element count, known from the shapes), else split like the operands.

    Example:
        >>> node = {"inputs": [{"shape": (4, 8)}, {"shape": (4, 8)}], "attrs": {"reduction": "mean"}}
        >>> [(d.name, d.size, d.operand_dims, d.reduction) for d in mse_loss_dims(node)]
        [('batch', 4, (0, 0), True)]
    """
    shapes = [tuple(e["shape"]) for e in node["inputs"]]
    if len(shapes) != 2 or shapes[0] != shapes[1] or not shapes[0] or shapes[0][0] <= 1:
        return []  # broadcast operands (or a scalar): replicated only
    reduced = node["attrs"].get("reduction", "mean") != "none"
    return [ParDim("batch", shapes[0][0], (0, 0), out_dim=None if reduced else 0, reduction=reduced)]


def softmax_dims(node: dict) -> list[ParDim]:
    """softmax/log_softmax: every named dim except the softmax dim."""
    return _pointwise_dims(
        node, node["dim_names"], skip={node["attrs"].get("dim", len(node["out_shape"]) - 1)}
    )


def pool_dims(node: dict) -> list[ParDim]:
    """Pooling of [N, C, H, W]: batch, and channels (``out``) when enabled."""
    names = ["batch", "out" if POOL_CHANNEL_SPLIT_ENABLED else None, None, None][: len(node["out_shape"])]
    x = node["inputs"][0] if node["inputs"] else None
    if x is None or len(x["shape"]) != len(node["out_shape"]):
        return []
    return [ParDim(n, node["out_shape"][d], _only(node, 0, d), out_dim=d) for d, n in enumerate(names) if n]


def cat_dims(node: dict) -> list[ParDim]:
    """cat: every named dim except the concatenation dim."""
    return _pointwise_dims(node, node["dim_names"], skip={node["attrs"].get("dim", 0)})


_NOT_SUMMED = ("amax", "amin", "max", "min")
"""Reductions whose split reduced dim would not leave a partial sum (max.dim's indices are local too)."""


def stack_dims(node: dict) -> list[ParDim]:
    """stack: every named dim of its (same-shaped) operands, each operand split alike; the new dim
    ``dim`` of the output is whole (DTensor's stack strategy shifts the shards past it).

    Example:
        >>> node = {"out_shape": (2, 4, 6), "attrs": {"dim": 0}, "dim_names": [None, "batch", "out"],
        ...         "inputs": [{"shape": (4, 6)}, {"shape": (4, 6)}], "operands": []}
        >>> [(d.name, d.operand_dims, d.out_dim) for d in stack_dims(node)]
        [('batch', (0, 0), 1), ('out', (1, 1), 2)]
    """
    out = tuple(node["out_shape"])
    new = node["attrs"].get("dim", 0)
    if not node["inputs"] or any(len(e["shape"]) != len(out) - 1 for e in node["inputs"]):
        return []
    dims, used = [], set()
    for d, name in enumerate(node["dim_names"]):
        if d == new or name not in _SPLITTABLE_NAMES or name in used or out[d] <= 1:
            continue
        used.add(name)
        src = d if d < new else d - 1
        dims.append(ParDim(name, out[d], tuple(src for _ in node["inputs"]), out_dim=d))
    return dims


def reduce_dims(node: dict) -> list[ParDim]:
    """sum/mean: kept dims pass their split; a split reduced dim leaves a partial sum (not for
    amax/amin/max/min: their reduced dim stays whole)."""
    if not node["inputs"]:
        return []
    x = node["inputs"][0]
    attrs = node["attrs"]
    reduced = set(attrs.get("dims", []))
    src = _source_names(node)
    dims, used, kept = [], set(), 0
    for d, size in enumerate(x["shape"]):
        name = src[d] if d < len(src) else None
        is_reduced = d in reduced
        out_dim = None if is_reduced else kept
        if not is_reduced or attrs.get("keepdim"):
            kept += 1
        if name not in _SPLITTABLE_NAMES or name in used or size <= 1:
            continue
        if is_reduced and attrs.get("mode") in _NOT_SUMMED:
            continue
        used.add(name)
        dims.append(ParDim(name, size, _only(node, 0, d), out_dim=out_dim, reduction=is_reduced))
    return dims


def _source_names(node: dict) -> list:
    """Dim names of the first operand as consumed (stored by configurations() before the rules run)."""
    return node.get("_operand_names", [[]])[0]


def pad_dims(node: dict) -> list[ParDim]:
    """Constant padding: every named dim it does not pad (DTensor's ``constant_pad_nd`` strategy
    shards exactly those); other modes (reflect, replicate, circular) stay replicated."""
    attrs = node["attrs"]
    if attrs.get("mode", "constant") != "constant" or not node["inputs"]:
        return []
    return _pointwise_dims(node, node["dim_names"], skip=set(attrs.get("padded_dims", [])))


def opaque_dims(node: dict) -> list[ParDim]:
    """Opaque ops: batch only, and only where that is shape-safe and sample-local.

    Every operand must have the output's rank and a dim 0 named ``batch`` of the output's size,
    no dim-like argument of the op (``dim``, ``dims``, ``axis``...) may refer to dim 0, and the op
    must not index across samples (``ops.CROSS_SAMPLE_OPS``). This is a heuristic over an op it
    knows nothing else about; the executor checks every node's output placement at run time.
    """
    out = node["out_shape"]
    if not out or not node["dim_names"] or node["dim_names"][0] != "batch" or not node["inputs"]:
        return []
    dim_args = node["attrs"].get("dim_args")
    if dim_args is None or 0 in dim_args or node["op"] in CROSS_SAMPLE_OPS:
        return []
    names = node.get("_operand_names", [])
    operand_dims = []
    for k, e in enumerate(node["inputs"]):
        ok = len(e["shape"]) == len(out) and e["shape"][0] == out[0] and names[k][:1] == ["batch"]
        if not ok:
            return []
        operand_dims.append(0)
    params = {o["key"]: None for o in node["operands"] if o["role"] == "param"}
    return [ParDim("batch", out[0], tuple(operand_dims), params, out_dim=0)]


RULES = {
    "input": input_dims,
    "linear": matmul_dims,
    "matmul": matmul_dims,
    "conv2d": conv2d_dims,
    "batch_norm": norm_dims,
    "group_norm": norm_dims,
    "layer_norm": norm_dims,
    "rms_norm": norm_dims,
    "embedding": embedding_dims,
    "sdpa": sdpa_dims,
    "cross_entropy": cross_entropy_dims,
    "mse_loss": mse_loss_dims,
    "softmax": softmax_dims,
    "log_softmax": softmax_dims,
    "pool": pool_dims,
    "adaptive_pool": pool_dims,
    "cat": cat_dims,
    "stack": stack_dims,
    "reduce": reduce_dims,
    "pad": pad_dims,
    "elementwise": lambda node: _pointwise_dims(node, node["dim_names"]),
    "dropout": lambda node: _pointwise_dims(node, node["dim_names"]),
    "broadcast": lambda node: _pointwise_dims(node, node["dim_names"]),
    "opaque": opaque_dims,
}
"""kind -> rule(node attrs) -> list[ParDim]."""
