r"""Thinning a two-objective frontier to few plans with a proven bound: the smallest (1+e)-cover.

A point ``q`` *(1+e)-covers* ``p`` when ``q_k <= (1 + e) p_k`` in both objectives. Given a Pareto
set sorted by objective 0 (so objective 1 falls along it), :func:`epsilon_cover` returns a
smallest subset covering every point (greedy, optimal for a staircase):

1. the first point ``p`` not yet covered must be covered by some ``q`` with
   ``q_0 <= (1 + e) p_0``; among those the last one (largest ``q_0``, so the least ``q_1``) covers
   the most later points, and it covers ``p`` itself (``q_1 <= p_1``) and every point between;
2. it also covers the later points ``p'`` with ``q_1 <= (1 + e) p'_1`` (``q_0 <= p'_0`` holds);
   the first point past those starts the next step.

Any cover needs a separate point for each such step (the step's first point ``p`` is covered by
no point chosen before), so the count is the least possible. The fastest and the leanest point are
always kept (a selection by time or by a budget still finds them exactly), which costs at most
two more points than the least cover. :func:`cover_to_count` finds the
smallest ``e`` (to 1 %% of itself) whose cover has at most ``max_points`` points.

Example:
    >>> import numpy as np
    >>> pts = np.array([[1.0, 10.0], [1.005, 9.0], [1.2, 8.0], [1.21, 7.99]])
    >>> epsilon_cover(pts, 0.01).tolist()
    [0, 1, 3]
"""

from __future__ import annotations

import numpy as np

from frontier.staircase import njit


def epsilon_cover(cost: np.ndarray, epsilon: float) -> np.ndarray:
    """Indices of a smallest subset of ``cost`` that (1+epsilon)-covers every row (see the module).

    Args:
        cost: ``(N, 2)`` non-negative Pareto set sorted by objective 0 ascending.
        epsilon: the cover's factor minus one; 0 keeps every row.

    Returns:
        Ascending indices of the kept rows; the first and the last are always kept.

    Example:
        >>> import numpy as np
        >>> epsilon_cover(np.array([[1.0, 3.0], [2.0, 2.0], [3.0, 1.0]]), 1.0).tolist()
        [0, 2]
    """
    cost = np.asarray(cost, dtype=np.float64)
    n = len(cost)
    if epsilon <= 0 or n <= 1:
        return np.arange(n)
    t, m = cost[:, 0], cost[:, 1]
    f = 1.0 + epsilon
    kept = []
    i = 0
    while i < n:
        # the last q with t_q <= f * t_i (t ascending); the fastest point stands for itself
        q = 0 if i == 0 else int(np.searchsorted(t, f * t[i], side="right")) - 1
        kept.append(q)
        # skip every later point q covers in memory: m falls along the set, so m_p * f >= m_q
        # holds up to the first p with m_p < m_q / f
        j = q + 1
        while j < n and m[q] <= f * m[j]:
            j += 1
        i = j
    if kept[-1] != n - 1:
        kept.append(n - 1)
    return np.asarray(kept, dtype=np.int64)


def cover_to_count(cost: np.ndarray, max_points: int, precision: float = 0.01) -> tuple[np.ndarray, float]:
    """A (1+e)-cover of at most ``max_points`` points with ``e`` close to the least that allows it.

    Args:
        cost: as for :func:`epsilon_cover`.
        max_points: most points to keep (>= 1).
        precision: ``e`` is within this share of the least ``e`` that reaches ``max_points``.

    Returns:
        ``(indices, e)``: the kept rows and the factor minus one they cover the set within
        (0 and every row when the set is already small enough).

    Example:
        >>> import numpy as np
        >>> cost = np.array([[1.0 + i / 100, 2.0 - i / 100] for i in range(100)])
        >>> keep, e = cover_to_count(cost, 10)
        >>> len(keep) <= 10, 0.0 < e < 0.1
        (True, True)
    """
    if max_points < 1:
        raise ValueError(f"max_points: got {max_points}, expected at least 1")
    cost = np.asarray(cost, dtype=np.float64)
    if len(cost) <= max_points:
        return np.arange(len(cost)), 0.0
    lo, hi = 0.0, 1e-4
    keep = epsilon_cover(cost, hi)
    while len(keep) > max_points:
        lo, hi = hi, hi * 4
        keep = epsilon_cover(cost, hi)
    while hi - lo > precision * hi:
        mid = 0.5 * (lo + hi)
        trial = epsilon_cover(cost, mid)
        if len(trial) <= max_points:
            hi, keep = mid, trial
        else:
            lo = mid
    return keep, hi


def grouped_cover(cost: np.ndarray, start: np.ndarray, epsilon: float) -> np.ndarray:
    """Indices of a smallest (1+epsilon)-cover of every group's Pareto set (the solver's boxing step).

    The greedy of :func:`epsilon_cover` on each group ``start[g]:start[g + 1]`` without keeping the
    fastest and the leanest point for themselves: a least cover, which gives the same guarantee as
    one point per (1+epsilon)-box (every point ``p`` of the group has a kept ``q <= (1+epsilon) p``)
    with fewer points.

    Args:
        cost: ``(N, 2)`` non-negative costs, each group a Pareto set sorted by objective 0.
        start: ``(G + 1,)`` group row offsets.
        epsilon: the cover's factor minus one (> 0).

    Returns:
        Ascending indices of the kept rows.

    Example:
        >>> import numpy as np
        >>> cost = np.array([[1.0, 3.0], [1.001, 2.999], [3.0, 1.0], [1.0, 1.0]])
        >>> grouped_cover(cost, np.array([0, 3, 4]), 0.01).tolist()
        [1, 2, 3]
    """
    cost = np.asarray(cost, dtype=np.float64)
    return _grouped_cover(np.ascontiguousarray(cost[:, 0]), np.ascontiguousarray(cost[:, 1]),
                          np.asarray(start, dtype=np.int64), 1.0 + float(epsilon))


@njit(cache=True)
def _grouped_cover(t, m, start, f):  # pragma: no cover - compiled (its Python form runs without numba)
    keep = np.empty(len(t), dtype=np.int64)
    k = 0
    for g in range(len(start) - 1):
        i, hi = start[g], start[g + 1]
        while i < hi:
            q = i  # the last q with t_q <= f t_i: it covers p_i and everything between
            while q + 1 < hi and t[q + 1] <= f * t[i]:
                q += 1
            keep[k] = q
            k += 1
            j = q + 1  # and the later points it covers in memory
            while j < hi and m[q] <= f * m[j]:
                j += 1
            i = j
    return keep[:k]
