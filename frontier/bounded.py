"""Bounded sum-and-union for two objectives: skip blocks of candidates that cannot survive.

The sum-and-union of :mod:`frontier.combine` generates every sum of one row per table.
Most are dominated. Here each table's groups (sorted by objective 0) are cut into chunks
of ``CHUNK`` rows, and:

1. every combination of chunks gets the sum of the chunks' per-objective minima -- a
   corner below every candidate the combination can make;
2. the combinations whose corners are non-dominated are expanded and pruned: a real,
   partial frontier ``U`` for every output group;
3. any other combination whose corner is (weakly) dominated by a point of ``U`` is
   skipped -- each of its candidates is dominated by, or equal to, that real point;
4. the remaining combinations are expanded in full and pruned together with ``U``.

The result is exactly the prune of all candidates (same rows, same order).
"""

from __future__ import annotations

import numpy as np

from frontier.pareto import pareto_select, ragged_arange

#: Chunk length relative to the square root of the mean group size.
SCALE = 0.5


def expand(starts, costs, groups, x_lo: int, x_hi: int):
    """All sums of one row per view for joint configurations ``x_lo <= x < x_hi``.

    Args:
        starts: per view, ``(G_i + 1,)`` row offsets of its groups.
        costs: per view, ``(M_i, K)`` row costs.
        groups: per view, its group index for every joint configuration.

    Returns:
        (x, cost, rows): joint configuration, summed cost and the row of each view, per sum;
        ordered by x.

    Example:
        >>> import numpy as np
        >>> x, c, r = expand([np.array([0, 2])], [np.array([[1.0], [2.0]])], [np.array([0])], 0, 1)
        >>> x.tolist(), c.tolist(), r[0].tolist()
        ([0, 0], [[1.0], [2.0]], [0, 1])
    """
    x = np.arange(x_lo, x_hi, dtype=np.int64)
    cost, rows = None, []
    for start, c, g in zip(starts, costs, groups):
        n = np.diff(start)[g[x]]
        parent = np.repeat(np.arange(len(x)), n)
        x = x[parent]
        row = start[g[x]] + ragged_arange(n)
        cost = c[row] if cost is None else cost[parent] + c[row]
        rows = [r[parent] for r in rows] + [row]
    return x, cost, rows


def bounded_sum_union(tables, groups, x_lo: int, x_hi: int, width: int, box_eps: float):
    """Exact prune of all sums over ``x_lo <= x < x_hi``, grouped by ``x // width`` (K = 2).

    Returns:
        (cost, x, rows): the kept sums, their joint configuration, and one row per table.
    """
    chunks = [_chunks(t) for t in tables]
    # chunk combinations and their corners (a lower bound on each of their candidates)
    x_c, corner, chunk_ids = expand([c[2] for c in chunks], [c[3] for c in chunks], groups, x_lo, x_hi)
    out_c = x_c // width
    # 1. expand the combinations with non-dominated corners -> partial frontier U (real points)
    front = np.zeros(len(x_c), dtype=bool)
    front[pareto_select(corner, out_c)] = True
    x_u, cost_u, rows_u = _expand_chunks(tables, chunks, x_c[front], [c[front] for c in chunk_ids])
    keep = pareto_select(cost_u, x_u // width)
    x_u, cost_u, rows_u = x_u[keep], cost_u[keep], [r[keep] for r in rows_u]
    # 2. skip the other combinations whose corner U dominates; expand the rest
    rest = np.flatnonzero(~front)
    alive = rest[~_dominated_by_staircase(corner[rest], out_c[rest], cost_u, x_u // width)]
    x, cost, rows = _expand_chunks(tables, chunks, x_c[alive], [c[alive] for c in chunk_ids])
    x = np.r_[x_u, x]
    cost = np.concatenate([cost_u, cost])
    rows = [np.r_[a, b] for a, b in zip(rows_u, rows)]
    keep = pareto_select(cost, x // width - x_lo // width, box_eps)
    return cost[keep], x[keep], [r[keep] for r in rows]


def _chunks(table):
    """(first row, length, per-group chunk offsets, corner cost) of each chunk of ``table``.

    Chunks hold about sqrt(rows per group) / 2 rows: small enough for tight corners, large
    enough that combinations of chunks are far fewer than combinations of rows.
    """
    counts = table.counts
    nonempty = counts[counts > 0]
    CHUNK = int(np.clip(np.sqrt(nonempty.mean()) * SCALE, 1, 64)) if len(nonempty) else 1
    n_chunks = -(-counts // CHUNK)
    group = np.repeat(np.arange(len(counts)), n_chunks)
    j = ragged_arange(n_chunks)
    first = table.start[group] + j * CHUNK
    length = np.minimum(CHUNK, counts[group] - j * CHUNK)
    start = np.r_[0, np.cumsum(n_chunks)].astype(np.int64)
    if len(first):
        corner = np.stack(
            [np.minimum.reduceat(table.cost[:, k], first) for k in range(table.cost.shape[1])], 1
        )
    else:
        corner = np.zeros((0, table.cost.shape[1]))
    return first, length, start, corner


def _expand_chunks(tables, chunks, x, chunk_ids):
    """Every row combination inside the given chunk combinations."""
    cost, rows = None, []
    combo = np.arange(len(x))
    for i, (t, (first, length, _, _)) in enumerate(zip(tables, chunks)):
        c = chunk_ids[i][combo]
        n = length[c]
        parent = np.repeat(np.arange(len(combo)), n)
        combo = combo[parent]
        row = first[c[parent]] + ragged_arange(n)
        cost = t.cost[row] if cost is None else cost[parent] + t.cost[row]
        rows = [r[parent] for r in rows] + [row]
    return x[combo], cost, rows


def _dominated_by_staircase(points, group, stair, stair_group):
    """Whether each point is weakly dominated by the staircase of its group (K = 2).

    ``stair`` is sorted by (group, objective 0) and is a Pareto set inside each group, so
    the last stair point with objective 0 <= the point's has the smallest objective 1 of them.
    """
    if len(points) == 0 or len(stair) == 0:
        return np.zeros(len(points), dtype=bool)
    # complex keys compare lexicographically: (group, objective 0), exactly
    i = np.searchsorted(stair_group + 1j * stair[:, 0], group + 1j * points[:, 0], side="right") - 1
    ok = i >= 0
    i = np.maximum(i, 0)
    return ok & (stair_group[i] == group) & (stair[i, 1] <= points[:, 1])
