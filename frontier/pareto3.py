"""Three-objective grouped Pareto prune in O(N log N): a sort, then a staircase of the last two.

Rows sorted by (group, c0, c1, c2) can only be dominated by rows before them in their group (a row
that is <= in every objective and differs comes first lexicographically; an equal row too). So a
row is dominated iff some earlier row of its group has ``c1 <= its c1`` and ``c2 <= its c2``: the
least ``c2`` over the earlier rows with ``c1`` at most its own. A Fenwick tree per group, indexed by
the rank of ``c1`` inside the group (equal values share a rank), answers that prefix minimum and
takes each kept row in O(log n). The pipeline's stage tables in (time, state bytes, activation
bytes) use it (:mod:`tensoropt.pipeline.chain_stages`); :func:`frontier.pareto.pareto_select` calls
it for K = 3 (the general prune compares every pair of a group).

Example:
    >>> import numpy as np
    >>> cost = np.array([[1.0, 2.0, 3.0], [1.0, 3.0, 2.0], [2.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    >>> prune3(cost, np.zeros(4, dtype=np.int64)).tolist()
    [0, 1]
"""

from __future__ import annotations

import numpy as np

from frontier.staircase import njit


@njit(cache=True)
def _dominated3(c2, rank, start, stop):
    """Per row of the sorted arrays, whether an earlier row of its group ``[start, stop)`` beats it."""
    n = len(c2)
    fen = np.full(n + 1, np.inf)  # group [s, e) uses fen[s + 1 .. e] (1-based Fenwick of its size)
    out = np.zeros(n, dtype=np.bool_)
    for g in range(len(start)):
        s, e = start[g], stop[g]
        size = e - s
        for i in range(s, e):
            j = rank[i] + 1
            best = np.inf
            while j > 0:
                if fen[s + j] < best:
                    best = fen[s + j]
                j -= j & -j
            if best <= c2[i]:
                out[i] = True
                continue
            j = rank[i] + 1
            while j <= size:
                if c2[i] < fen[s + j]:
                    fen[s + j] = c2[i]
                j += j & -j
    return out


def prune3(cost: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Indices of one row per distinct non-dominated vector per group, ordered by (group, c0, c1, c2).

    Args:
        cost: ``(N, 3)`` finite costs (minimised).
        group: ``(N,)`` integer group ids.

    Example:
        >>> import numpy as np
        >>> cost = np.array([[0.0, 5.0, 5.0], [1.0, 1.0, 1.0], [2.0, 0.0, 9.0], [3.0, 1.0, 1.0]])
        >>> prune3(cost, np.array([0, 0, 0, 1])).tolist()
        [0, 1, 2, 3]
    """
    cost = np.asarray(cost, dtype=np.float64)
    group = np.asarray(group, dtype=np.int64)
    n = len(cost)
    if n == 0:
        return np.empty(0, dtype=np.int64)
    c0, c1, c2 = cost[:, 0], cost[:, 1], cost[:, 2]
    order = np.lexsort((c2, c1, c0, group))
    # rank of c1 inside its group (equal values share the least rank)
    by1 = np.lexsort((c1, group))
    g1, v1 = group[by1], c1[by1]
    pos = np.arange(n)
    new_group = np.r_[True, g1[1:] != g1[:-1]]
    new_value = new_group | np.r_[True, v1[1:] != v1[:-1]]
    rank_sorted = (np.maximum.accumulate(np.where(new_value, pos, 0))
                   - np.maximum.accumulate(np.where(new_group, pos, 0)))
    rank = np.empty(n, dtype=np.int64)
    rank[by1] = rank_sorted
    g = group[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    stops = np.r_[starts[1:], n]
    # compiled with numba; a plain Python loop where numba is missing (frontier.staircase.njit)
    dominated = _dominated3(np.ascontiguousarray(c2[order]), rank[order], starts, stops)
    return order[~dominated]
