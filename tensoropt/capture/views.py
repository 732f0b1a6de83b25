"""Pure view / metadata ops, folded into OpGraph edges, and how each maps tensor dims.

A *dim map* of a view from a tensor of rank ``n`` is a list of length ``n``: entry ``i`` is the
dim of the view's result that input dim ``i`` becomes, or ``None`` when a shard of input dim
``i`` cannot pass through the view as a shard of one result dim (the dim is sliced, split or
merged as an inner part of a group). A merged group passes the shard of its outermost dim
(``[B, C, H, W] -> [B, C*H*W]``: ``0->0, 1->1, 2->None, 3->None``); a split dim passes its shard
to the outermost result dim (``[B, T, C] -> [B, T, H, D]``: ``2->2``).
"""

from __future__ import annotations

VIEW_OPS = frozenset(
    {
        "aten.view.default",
        "aten._unsafe_view.default",
        "aten.reshape.default",
        "aten.permute.default",
        "aten.transpose.int",
        "aten.t.default",
        "aten.flatten.using_ints",
        "aten.unflatten.int",
        "aten.unsqueeze.default",
        "aten.squeeze.default",
        "aten.squeeze.dim",
        "aten.squeeze.dims",
        "aten.expand.default",
        "aten.expand_as.default",
        "aten.contiguous.default",
        "aten.clone.default",
        "aten.detach.default",
        "aten.alias.default",
        "aten.lift_fresh_copy.default",
        "aten._to_copy.default",
        "aten.to.dtype",
        "aten.to.dtype_layout",
        "aten.to.device",
        "aten.type_as.default",
        "aten.slice.Tensor",
        "aten.select.int",
        "aten.narrow.default",
        "aten.movedim.int",
        "aten.swapaxes.default",
        "aten.split.Tensor",
        "aten.split_with_sizes.default",
        "aten.chunk.default",
        "aten.unbind.int",
        "aten.tensor_split.sections",
        "operator.getitem",
    }
)
"""Ops folded into edges (the op names as ``op_name`` spells them)."""

SPLIT_OPS = frozenset(
    {
        "aten.split.Tensor",
        "aten.split_with_sizes.default",
        "aten.chunk.default",
        "aten.unbind.int",
        "aten.tensor_split.sections",
    }
)
"""Views that return a tuple of tensors; an ``operator.getitem`` picks one."""


def _norm(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def reshape_map(in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> list[int | None]:
    """Dim map of a reshape: groups of dims with equal products, outermost dim of a group passes.

    Example:
        >>> reshape_map((2, 3, 4, 5), (2, 60))
        [0, 1, None, None]
        >>> reshape_map((2, 8, 32), (2, 8, 4, 8))
        [0, 1, 2]
    """
    result: list[int | None] = [None] * len(in_shape)
    i = j = 0
    while i < len(in_shape) and j < len(out_shape):
        # skip size-1 dims on either side: they carry no shard
        if in_shape[i] == 1 and (j >= len(out_shape) or out_shape[j] != 1):
            i += 1
            continue
        if out_shape[j] == 1 and in_shape[i] != 1:
            j += 1
            continue
        gi, gj = [i], [j]
        pi, pj = in_shape[i], out_shape[j]
        while pi != pj:
            if pi < pj:
                i += 1
                if i >= len(in_shape):
                    return result
                gi.append(i)
                pi *= in_shape[i]
            else:
                j += 1
                if j >= len(out_shape):
                    return result
                gj.append(j)
                pj *= out_shape[j]
        result[gi[0]] = gj[0]
        i, j = i + 1, j + 1
    return result


def view_dim_map(
    op: str, args: tuple, in_shape: tuple[int, ...], out_shape: tuple[int, ...]
) -> list[int | None]:
    """Dim map (input dims -> result dims) of one folded view op.

    Args:
        op: op name, e.g. ``"aten.transpose.int"``.
        args: the fx node's args (the tensor first).
        in_shape: shape of the tensor the view reads.
        out_shape: shape of the tensor it returns (for tuple views: the picked element).

    Example:
        >>> view_dim_map("aten.transpose.int", (None, 1, 2), (2, 8, 4, 8), (2, 4, 8, 8))
        [0, 2, 1, 3]
    """
    n = len(in_shape)
    ident = list(range(n))
    if op in ("aten.permute.default",):
        perm = [_norm(d, n) for d in args[1]]
        result: list[int | None] = [None] * n
        for new, old in enumerate(perm):
            result[old] = new
        return result
    if op in ("aten.transpose.int", "aten.swapaxes.default"):
        a, b = _norm(args[1], n), _norm(args[2], n)
        ident[a], ident[b] = b, a
        return ident
    if op == "aten.t.default":
        return ident[::-1]
    if op == "aten.movedim.int":
        src, dst = _norm(args[1], n), _norm(args[2], len(out_shape))
        order = [d for d in range(n) if d != src]
        order.insert(dst, src)
        return [order.index(d) for d in range(n)]
    if op in ("aten.slice.Tensor", "aten.narrow.default"):
        d = _norm(args[1] if len(args) > 1 else 0, n)
        result = list(ident)
        if out_shape[d] != in_shape[d]:
            result[d] = None
        return result
    if op == "aten.select.int":
        d = _norm(args[1], n)
        return [None if i == d else (i if i < d else i - 1) for i in range(n)]
    if op == "aten.unbind.int":
        d = _norm(args[1] if len(args) > 1 else 0, n)
        return [None if i == d else (i if i < d else i - 1) for i in range(n)]
    if op in SPLIT_OPS:
        d = _norm(args[2] if len(args) > 2 else 0, n)
        result = list(ident)
        if out_shape[d] != in_shape[d]:
            result[d] = None
        return result
    if op in ("aten.expand.default", "aten.expand_as.default"):
        lead = len(out_shape) - n
        return [i + lead if in_shape[i] == out_shape[i + lead] else None for i in range(n)]
    if len(in_shape) == len(out_shape) and tuple(in_shape) == tuple(out_shape):
        return ident  # contiguous, clone, detach, alias, casts, getitem, no-op reshapes
    return reshape_map(tuple(in_shape), tuple(out_shape))


def compose(first: list[int | None], second: list[int | None]) -> list[int | None]:
    """Dim map of ``second`` after ``first``.

    Example:
        >>> compose([0, 2, 1], [1, 0, None])
        [1, None, 0]
    """
    return [None if d is None or d >= len(second) else second[d] for d in first]
