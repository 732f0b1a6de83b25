"""Pareto sets of cost vectors: vectorised pruning inside groups, and epsilon boxes.

A *grouped* set of cost vectors is a float array ``cost`` of shape ``(N, K)`` plus an
integer array ``group`` of shape ``(N,)``. Pruning keeps, inside every group, exactly
one row per distinct non-dominated cost vector (all objectives are minimised). Rows
with a ``+inf`` entry are infeasible and never kept.

- K = 2: one lexicographic sort and a segmented running minimum, O(N log N).
- K = 3: a lexicographic sort and a Fenwick staircase of the last two objectives per group,
  O(N log N) (:func:`frontier.pareto3.prune3`).
- K >= 4: a lexicographic sort, then each row against the kept rows before it in its group,
  compiled (:func:`frontier.pareto_scan.prune_scan`, ``O(N F)`` for ``F`` kept rows).
- With ``COMPILED_PRUNE3`` / ``COMPILED_PRUNE_SCAN`` off: a lexicographic sort, then a blocked
  pairwise test of each row against every row sorted before it in its group (only an earlier row
  can dominate a later one), ``O(N^2)``.

Epsilon boxes (:func:`box_representatives`) keep one row per ``(1 + e)``-box of every
objective before the exact prune; a dropped row is then within a factor ``1 + e`` of a
kept row in every objective.
"""

from __future__ import annotations

import numpy as np

from frontier.pareto3 import prune3
from frontier.pareto_scan import prune_scan

#: K = 3 prunes use :func:`frontier.pareto3.prune3`; False selects the pairwise prune (comparisons).
COMPILED_PRUNE3 = True
#: K >= 4 prunes use :func:`frontier.pareto_scan.prune_scan`; False selects the pairwise prune. The
#: pipeline DP's 8B search at 64 GPUs spent 485 of its 531 s in the pairwise prune (docs/results.md).
COMPILED_PRUNE_SCAN = True
#: Largest number of row pairs compared at once by the K >= 3 prune.
_PAIR_CHUNK = 4_000_000
#: Sets larger than this are first thinned by per-group pivot points.
_PREFILTER_MIN = 2048


def pareto_select(cost: np.ndarray, group: np.ndarray | None = None, box_eps: float = 0.0) -> np.ndarray:
    """Return the indices of the rows to keep, ordered by group, then cost[:, 0], cost[:, 1], ...

    Args:
        cost: ``(N, K)`` float array of cost vectors (minimised).
        group: ``(N,)`` non-negative integer group ids; rows compete only inside a group.
            ``None`` puts every row in one group.
        box_eps: when > 0, first keep one row per ``(1 + box_eps)`` box of every objective
            (costs must then be non-negative).

    Returns:
        Integer indices into ``cost``: one row per distinct non-dominated vector per group.

    Example:
        >>> import numpy as np
        >>> pareto_select(np.array([[1.0, 5.0], [2.0, 2.0], [3.0, 3.0], [1.0, 5.0]])).tolist()
        [0, 1]
    """
    cost = np.asarray(cost, dtype=np.float64)
    n = len(cost)
    if group is None:
        group = np.zeros(n, dtype=np.int64)
    else:
        group = np.asarray(group, dtype=np.int64)
    feasible = np.logical_and.reduce([np.isfinite(cost[:, j]) for j in range(cost.shape[1])]) if n else None
    if n and not feasible.all():
        base = np.flatnonzero(feasible)
        return base[pareto_select(cost[base], group[base], box_eps)]
    if n == 0:
        return np.empty(0, dtype=np.int64)
    if box_eps > 0.0:
        base = box_representatives(cost, group, box_eps)
        return base[pareto_select(cost[base], group[base])]
    if cost.shape[1] == 3 and COMPILED_PRUNE3:
        return prune3(cost, group)
    if cost.shape[1] >= 4 and COMPILED_PRUNE_SCAN:
        return prune_scan(cost, group)
    if n > _PREFILTER_MIN and cost.shape[1] >= 3:
        base = _pivot_filter(cost, group)
        if len(base) < n:
            return base[pareto_select(cost[base], group[base])]
    if cost.shape[1] == 1:
        order = np.lexsort((cost[:, 0], group))
        first = np.ones(n, dtype=bool)
        first[1:] = group[order][1:] != group[order][:-1]
        return order[first]
    if cost.shape[1] == 2:
        return _prune2(cost[:, 0], cost[:, 1], group)
    return _prune_general(cost, group)


def _prune2(c0: np.ndarray, c1: np.ndarray, group: np.ndarray) -> np.ndarray:
    """K = 2 prune: keep a row iff its c1 is below every earlier c1 of its group (sorted by c0).

    Rows are ordered by (group, c0) in one sort of the complex keys ``group + 1j * c0``; a
    row with a c0 equal to the next kept row's is dropped afterwards, which settles ties
    without sorting by c1.
    """
    n = len(c0)
    if group[0] == group[-1] and not (group[1:] != group[:-1]).any():
        order = np.argsort(c0)
    else:  # complex numbers sort lexicographically: (group, c0), exactly
        order = np.argsort(group + 1j * c0)
    g = group[order]
    a = c1[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    if len(starts) <= 4096:
        running = np.empty(n)
        for lo, hi in zip(starts, np.r_[starts[1:], n]):
            np.minimum.accumulate(a[lo:hi], out=running[lo:hi])
        keep = np.ones(n, dtype=bool)
        keep[1:] = a[1:] < running[:-1]
        keep[starts] = True
    else:
        rank = np.empty(n, dtype=np.int64)
        rank[np.argsort(a, kind="stable")] = np.arange(n, dtype=np.int64)
        key = (g[-1] - g) * n + rank
        running = np.minimum.accumulate(key)
        keep = np.ones(n, dtype=bool)
        keep[1:] = key[1:] < running[:-1]
    kept = order[keep]
    # Equal c0 in a group: only the last kept row (smallest c1) survives.
    kg, k0 = g[keep], c0[kept]
    last = np.ones(len(kept), dtype=bool)
    last[:-1] = (kg[1:] != kg[:-1]) | (k0[1:] != k0[:-1])
    return kept[last]


def _prune_general(cost: np.ndarray, group: np.ndarray) -> np.ndarray:
    """K >= 3 prune: blocked pairwise dominance test against earlier rows of the same group."""
    n, k = cost.shape
    order = np.lexsort(tuple(cost[:, j] for j in range(k - 1, -1, -1)) + (group,))
    c = cost[order]
    g = group[order]
    new_group = np.ones(n, dtype=bool)
    new_group[1:] = g[1:] != g[:-1]
    group_start = np.maximum.accumulate(np.where(new_group, np.arange(n), 0))
    earlier = np.arange(n) - group_start  # rows before i in its group
    dominated = np.zeros(n, dtype=bool)
    cum = np.cumsum(earlier)
    lo = 0
    while lo < n:
        hi = max(int(np.searchsorted(cum, cum[lo] - earlier[lo] + _PAIR_CHUNK, side="right")), lo + 1)
        cnt = earlier[lo:hi]
        if cnt.sum() > 0:
            i = np.repeat(np.arange(lo, hi), cnt)
            j = group_start[i] + ragged_arange(cnt)
            hit = (c[j] <= c[i]).all(axis=1)
            dominated[i[hit]] = True
        lo = hi
    return order[~dominated]


def _pivot_filter(cost: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Indices of rows not dominated by a few per-group pivots (minimisers of weighted sums).

    A pivot is a real row, so anything it dominates (or equals, at a later index) can be
    dropped without changing the Pareto set of the group.
    """
    n, k = cost.shape
    if (group[1:] < group[:-1]).any():
        order = np.argsort(group, kind="stable")
        return order[_pivot_filter(cost[order], group[order])]
    boundary = np.flatnonzero(group[1:] != group[:-1]) + 1
    starts = np.r_[0, boundary]
    sizes = np.diff(np.r_[starts, n])
    cols = [np.ascontiguousarray(cost[:, j]) for j in range(k)]
    lo = np.array([c.min() for c in cols])
    span = np.array([c.max() for c in cols]) - lo
    span = np.where(span > 0, span, 1.0)
    scaled = [(cols[j] - lo[j]) / span[j] for j in range(k)]
    index = np.arange(n)
    keep = np.ones(n, dtype=bool)
    for w in _directions(k):
        value = sum(w[j] * scaled[j] for j in range(k))
        best = np.repeat(np.minimum.reduceat(value, starts), sizes)
        pivot = np.repeat(np.minimum.reduceat(np.where(value == best, index, n), starts), sizes)
        le = np.ones(n, dtype=bool)
        lt = pivot < index
        for j in range(k):
            pj = cols[j][pivot]
            le &= pj <= cols[j]
            lt |= pj < cols[j]
        keep &= ~(le & lt)
    return np.flatnonzero(keep)


def _directions(k: int) -> list[np.ndarray]:
    """Weight vectors for the pivot filter: the diagonal and a few strictly positive mixtures."""
    if k == 2:
        return [np.array([0.5, 0.5]), np.array([0.2, 0.8]), np.array([0.8, 0.2])]
    rng = np.random.default_rng(12345)
    return [np.full(k, 1.0 / k)] + list(rng.dirichlet(np.ones(k), size=k + 2))


def box_representatives(cost: np.ndarray, group: np.ndarray, eps: float) -> np.ndarray:
    """Indices of one row per (group, (1 + eps)-box in every objective); costs must be >= 0.

    Two costs in the same box differ by less than a factor ``1 + eps`` in every objective;
    zero is its own box.

    Example:
        >>> import numpy as np
        >>> cost = np.array([[1.0, 1.0], [1.001, 1.0], [2.0, 1.0]])
        >>> box_representatives(cost, np.zeros(3, int), 0.01).tolist()
        [0, 2]
    """
    with np.errstate(divide="ignore"):
        box = np.floor(np.log(cost) / np.log1p(eps))
    box = np.where(cost > 0, box, -(2.0**62)).astype(np.int64)
    order = np.lexsort(tuple(box[:, j] for j in range(box.shape[1] - 1, -1, -1)) + (group,))
    b = box[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = (b[1:] != b[:-1]).any(axis=1) | (group[order][1:] != group[order][:-1])
    return np.sort(order[first])


def ragged_arange(counts: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(c)`` for each ``c`` in ``counts`` (used to expand grouped sets).

    Example:
        >>> import numpy as np
        >>> ragged_arange(np.array([2, 0, 3])).tolist()
        [0, 1, 0, 1, 2]
    """
    counts = np.asarray(counts, dtype=np.int64)
    offsets = np.repeat(np.cumsum(counts) - counts, counts)
    return np.arange(int(counts.sum()), dtype=np.int64) - offsets
