"""Grouped Pareto prune for four and more objectives: a sort, then each row against the kept rows.

Rows sorted by (group, c0, c1, ...) can only be dominated by rows before them in their group (a row
that is <= in every objective and differs comes first lexicographically; an equal row too). And if
an earlier row ``r`` dominates row ``i`` while ``r`` is itself dominated by a kept row ``q``, then
``q`` dominates ``i`` (dominance is transitive) and ``q`` is earlier. So a row is dominated iff a
*kept* earlier row of its group is ``<=`` in the objectives ``1 .. K-1`` (objective 0 is ordered by
the sort). Each row is compared with the kept rows only, newest first (a row's neighbours in the
sort are the likeliest to dominate it), and the last row that dominated is tried first: ``O(N F)``
comparisons for ``F`` kept rows, against the ``O(N^2)`` of comparing every earlier row
(:func:`frontier.pareto._prune_general`). The pipeline DP's four-objective states
(:func:`frontier.pipeline.pipeline_frontier`) are its main user.

Example:
    >>> import numpy as np
    >>> cost = np.array([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 5.0], [0.0, 9.0, 9.0, 9.0],
    ...                  [1.0, 2.0, 3.0, 4.0]])
    >>> prune_scan(cost, np.zeros(4, dtype=np.int64)).tolist()
    [2, 0]
"""

from __future__ import annotations

import numpy as np

from frontier.staircase import njit


@njit(cache=True)
def _covers(kept, q, c, i):
    """Whether kept row ``q`` is ``<=`` row ``i`` of ``c`` in the objectives ``1 .. K-1``."""
    for j in range(1, c.shape[1]):
        if kept[q, j] > c[i, j]:
            return False
    return True


@njit(cache=True)
def _dominated_scan(c, start, stop):
    """Per row of the sorted ``c``, whether a kept earlier row of its group ``[start, stop)`` beats it."""
    n, k = c.shape
    out = np.zeros(n, dtype=np.bool_)
    kept = np.empty((n, k), dtype=np.float64)  # the kept rows of the current group, in order
    for g in range(len(start)):
        count = 0
        last = -1  # index into kept of the row that dominated most recently
        for i in range(start[g], stop[g]):
            dominated = last >= 0 and _covers(kept, last, c, i)
            q = count - 1
            while not dominated and q >= 0:
                if _covers(kept, q, c, i):
                    dominated = True
                    last = q
                q -= 1
            if dominated:
                out[i] = True
            else:
                kept[count, :] = c[i, :]
                count += 1
    return out


def prune_scan(cost: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Indices of one row per distinct non-dominated vector per group, ordered by (group, c0, c1, ...).

    Args:
        cost: ``(N, K)`` finite costs (minimised), any ``K >= 1``.
        group: ``(N,)`` integer group ids.

    Example:
        >>> import numpy as np
        >>> cost = np.array([[0.0, 5.0, 5.0, 5.0], [1.0, 1.0, 1.0, 1.0], [2.0, 1.0, 1.0, 1.0]])
        >>> prune_scan(cost, np.array([0, 0, 1])).tolist()
        [0, 1, 2]
    """
    cost = np.asarray(cost, dtype=np.float64)
    group = np.asarray(group, dtype=np.int64)
    n = len(cost)
    if n == 0:
        return np.empty(0, dtype=np.int64)
    order = np.lexsort(tuple(cost[:, j] for j in range(cost.shape[1] - 1, -1, -1)) + (group,))
    g = group[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    stops = np.r_[starts[1:], n]
    # compiled with numba; a plain Python loop where numba is missing (frontier.staircase.njit)
    dominated = _dominated_scan(np.ascontiguousarray(cost[order]), starts, stops)
    return order[~dominated]
