r"""Output groups that are copies of another: computed once, then copied (exact).

In a combine ``out[x] = prune(U_{s_v} T_1[x, s_v] (+) T_2[x, s_v] (+) ...)`` two values ``a``, ``a'``
of a kept variable ``w`` whose *slices* are equal in every table that has ``w`` (the same points per
joint configuration of the table's other variables, in the same order) give equal output groups::

    out[..., w = a', ...] = out[..., w = a, ...]

So only the groups whose every coordinate is the first value of its class are computed
(:func:`representative_mask`); the others are copies (:func:`copy_groups`), their back-pointers moved
to the rows of their own groups in each child table (same offset within the group), so the plans
behind them are their own. Such values occur wherever a combine's tables do not tell two
configurations apart: a residual ``add`` in a checkpointed block costs the same and meets the next
block's edges the same under ``block_recompute`` and ``block_selective`` (an ``add`` keeps no output
under either), and splits that the edges eliminated so far price alike (docs/algorithm.md).

Example:
    >>> import numpy as np
    >>> from frontier.table import leaf_table
    >>> t = leaf_table((0, 1), np.array([[[1.0, 0.0], [2.0, 0.0]], [[1.0, 0.0], [2.0, 0.0]]]))
    >>> value_classes([t], 0, {}).tolist(), value_classes([t], 1, {}).tolist()
    ([0, 0], [0, 1])
"""

from __future__ import annotations

import hashlib

import numpy as np

from frontier.pareto import ragged_arange
from frontier.table import Table


def slice_classes(table: Table, axis: int) -> np.ndarray:
    """For each value of ``table``'s scope variable number ``axis``, the first value with an equal slice.

    Example:
        >>> from frontier.table import leaf_table
        >>> t = leaf_table((0, 1), np.array([[[1.0, 0.0], [np.inf, 0.0]], [[1.0, 0.0], [np.inf, 0.0]],
        ...                                  [[1.0, 0.0], [3.0, 0.0]]]))
        >>> slice_classes(t, 0).tolist()
        [0, 0, 2]
    """
    shape = table.shape
    order = np.moveaxis(np.arange(int(np.prod(shape, dtype=np.int64))).reshape(shape), axis, 0)
    order = order.reshape(shape[axis], -1)
    counts = np.diff(table.start)
    seen: dict[bytes, int] = {}
    out = np.empty(shape[axis], dtype=np.int64)
    cost = table.cost + 0.0  # -0.0 + 0.0 is 0.0: equal values, equal bytes
    for a in range(shape[axis]):
        groups = order[a]
        n = counts[groups]
        rows = np.repeat(table.start[groups], n) + ragged_arange(n)
        h = hashlib.blake2b(n.tobytes(), digest_size=16)
        h.update(np.ascontiguousarray(cost[rows]).tobytes())
        out[a] = seen.setdefault(h.digest(), a)
    return out


def value_classes(tables: list[Table], v: int, cache: dict) -> np.ndarray:
    """For each value of variable ``v``, the first value whose slices equal its own in every table with ``v``.

    ``cache``: (table digest, axis) -> :func:`slice_classes` (equal digests: equal tables).

    Example:
        >>> from frontier.table import leaf_table
        >>> a = leaf_table((0,), np.array([[1.0, 0.0], [1.0, 0.0], [2.0, 0.0]]))
        >>> b = leaf_table((0, 1), np.array([[[1.0, 0.0]], [[2.0, 0.0]], [[2.0, 0.0]]]))
        >>> value_classes([a], 0, {}).tolist(), value_classes([a, b], 0, {}).tolist()
        ([0, 0, 2], [0, 1, 2])
    """
    joint = None
    for t in tables:
        if v not in t.scope:
            continue
        axis = t.scope.index(v)
        key = (t.digest, axis)
        cls = cache.get(key)
        if cls is None:
            cls = cache[key] = slice_classes(t, axis)
        joint = cls if joint is None else joint * len(cls) + cls
    if joint is None:
        return np.zeros(0, dtype=np.int64)
    _, first, inverse = np.unique(joint, return_index=True, return_inverse=True)
    return first[inverse.reshape(-1)]


def representative_groups(reps: list[np.ndarray]) -> np.ndarray:
    """For each output group (row-major over the variables of ``reps``), the group it copies: the one with
    every coordinate replaced by its class's first value (itself where every coordinate is one).

    Example:
        >>> representative_groups([np.array([0, 0]), np.array([0, 1, 1])]).tolist()
        [0, 1, 1, 0, 1, 1]
    """
    shape = tuple(len(r) for r in reps)
    src = np.zeros(shape, dtype=np.int64)
    stride = 1
    for k in range(len(reps) - 1, -1, -1):
        view = [1] * len(reps)
        view[k] = shape[k]
        src = src + (reps[k] * stride).reshape(view)
        stride *= shape[k]
    return src.reshape(-1)


def copy_groups(cost: np.ndarray, out_group: np.ndarray, rows: np.ndarray, vals: np.ndarray,
                src: np.ndarray, width: int, tables: list[Table], groups: list[np.ndarray]):
    """The combine's result with every output group ``o`` holding the points of group ``src[o]`` (computed:
    ``src[src[o]] == src[o]``), ordered by (group, objective 0) as the kernel orders them; each copied
    point's back-pointer into child table ``i`` moved from the rows of ``i``'s group at the source joint
    configuration to the same position in its group at the copy's (equal slices: equal points there).

    Args:
        cost, out_group, rows, vals: the kernel's result over the computed groups.
        src: per output group, the group it copies (:func:`representative_groups`).
        width: values of the dropped variable (1 when none); ``vals`` its value behind each point.
        tables, groups: the combine's tables and their group index per joint configuration.

    Example:
        >>> from frontier.table import leaf_table
        >>> t = leaf_table((0,), np.array([[1.0, 0.0], [1.0, 0.0]]))
        >>> out = copy_groups(np.array([[1.0, 0.0]]), np.array([0]), np.array([[0]]), np.array([0]),
        ...                   np.array([0, 0]), 1, [t], [np.array([0, 1])])
        >>> out[1].tolist(), out[2].tolist()
        ([0, 1], [[0], [1]])
    """
    n_out = len(src)
    start = np.r_[0, np.cumsum(np.bincount(out_group, minlength=n_out))]
    counts = start[src + 1] - start[src]
    index = np.repeat(start[src], counts) + ragged_arange(counts)
    group = np.repeat(np.arange(n_out, dtype=np.int64), counts)
    cost, rows, vals = cost[index], rows[index].copy(), vals[index]
    moved = np.flatnonzero(src[group] != group)
    if len(moved):
        x_new = group[moved] * width + vals[moved]
        x_src = src[group[moved]] * width + vals[moved]
        for i, (t, g) in enumerate(zip(tables, groups)):
            rows[moved, i] += t.start[g[x_new]] - t.start[g[x_src]]
    return cost, group, rows, vals


__all__ = ["copy_groups", "representative_groups", "slice_classes", "value_classes"]
