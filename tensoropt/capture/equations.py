"""Einsum equations for the matmul family (linear, mm, bmm, matmul, addmm, baddbmm, einsum).

Writing every contraction as an explicit einsum (one letter per dim, no ellipsis) lets the
configuration space treat them alike: a letter in the output and in both factors is a batch-like
dim, a letter in the output and one factor is a row (``seq``) or column (``out``) dim, a letter in
both factors and not in the output is a reduction (``in``) dim.
"""

from __future__ import annotations

_LETTERS = "abcdefghijlmnopqrstuvwxyz"  # no 'k': reserved for the reduction of mm-like ops


def matmul_equation(op: str, shapes: list[tuple[int, ...]], attrs: dict) -> tuple[str, list[int], int | None]:
    """Equation over the two factors, their operand positions, and the position of an added bias.

    Args:
        op: aten op name. shapes: shapes of all tensor operands in argument order.
        attrs: the node's attrs (einsum keeps its equation there).

    Returns:
        ``(equation, [pos_a, pos_b], bias_pos)``; the equation is ``""`` when unsupported
        (einsum with ellipsis or more than two factors, matmul with a vector).

    Example:
        >>> matmul_equation("aten.linear.default", [(2, 8, 32), (64, 32), (64,)], {})
        ('abk,ck->abc', [0, 1], 2)
        >>> matmul_equation("aten.matmul.default", [(2, 4, 8, 16), (2, 4, 16, 8)], {})
        ('abck,abkd->abcd', [0, 1], None)
    """
    if op == "aten.linear.default":
        a = len(shapes[0])
        lead = _LETTERS[: a - 1]
        out = _LETTERS[a - 1]
        bias = 2 if len(shapes) > 2 else None
        return f"{lead}k,{out}k->{lead}{out}", [0, 1], bias
    if op == "aten.mm.default":
        return "mk,kn->mn", [0, 1], None
    if op == "aten.addmm.default":
        return "mk,kn->mn", [1, 2], 0
    if op == "aten.bmm.default":
        return "bmk,bkn->bmn", [0, 1], None
    if op == "aten.baddbmm.default":
        return "bmk,bkn->bmn", [1, 2], 0
    if op == "aten.einsum.default":
        eq = attrs.get("equation", "")
        if "..." in eq or "->" not in eq or eq.split("->")[0].count(",") != 1:
            return "", [0, 1], None
        return eq, [0, 1], None
    if op == "aten.matmul.default":
        sa, sb = shapes[0], shapes[1]
        if len(sa) < 2 or len(sb) < 2:
            return "", [0, 1], None
        nbatch = max(len(sa), len(sb)) - 2
        out_batch = _LETTERS[:nbatch]
        m, n = _LETTERS[nbatch], _LETTERS[nbatch + 1]
        spare = iter(_LETTERS[nbatch + 2 :])

        def batch_letters(shape):
            own = len(shape) - 2
            letters = ""
            for i in range(own):
                j = nbatch - own + i
                full = max(
                    sa[j - (nbatch - (len(sa) - 2))] if j - (nbatch - (len(sa) - 2)) >= 0 else 1,
                    sb[j - (nbatch - (len(sb) - 2))] if j - (nbatch - (len(sb) - 2)) >= 0 else 1,
                )
                letters += out_batch[j] if shape[i] == full else next(spare)
            return letters

        return f"{batch_letters(sa)}{m}k,{batch_letters(sb)}k{n}->{out_batch}{m}{n}", [0, 1], None
    return "", [0, 1], None
