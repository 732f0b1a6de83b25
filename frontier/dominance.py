"""Exact preprocessing: drop configurations that another configuration of the same node beats.

Configuration ``s`` of node ``v`` is dominated by ``s'`` when ``c_v[s'] <= c_v[s]`` and,
for every incident edge and every configuration of the neighbour, the edge cost with
``s'`` is ``<=`` the one with ``s`` (all objectives; ties broken by index). Then any plan
using ``s`` costs at least as much, in every objective, as the same plan with ``s'``, so
removing ``s`` leaves the set of non-dominated cost vectors unchanged. Removing
configurations of one node can expose dominance at its neighbours, so the test is
repeated until nothing changes.
"""

from __future__ import annotations

import numpy as np

from frontier.problem import Problem


def drop_dominated_configs(problem: Problem,
                           keep: frozenset = frozenset()) -> tuple[Problem, list[np.ndarray]]:
    """The problem restricted to undominated configurations, and the kept indices per node.

    ``keep``: node numbers whose configurations all stay (variables a caller keeps uneliminated,
    :func:`frontier.chain.eliminate_except`).

    Example:
        >>> import numpy as np
        >>> p = Problem(names=["a"], node_cost=[np.array([[1.0, 1.0], [2.0, 1.0], [0.0, 3.0]])],
        ...             edges=[], edge_cost=[])
        >>> small, kept = drop_dominated_configs(p)
        >>> kept[0].tolist(), small.node_cost[0].tolist()
        ([0, 2], [[1.0, 1.0], [0.0, 3.0]])
    """
    n = len(problem.names)
    kept = [np.arange(len(c)) for c in problem.node_cost]
    incident: list[list[tuple[int, int, bool]]] = [[] for _ in range(n)]
    for e, (u, v) in enumerate(problem.edges):
        incident[u].append((e, v, True))
        incident[v].append((e, u, False))
    dirty = set(range(n))
    while dirty:
        v = dirty.pop()
        if len(kept[v]) == 1 or v in keep:
            continue
        parts = [problem.node_cost[v][kept[v]]]
        for e, other, is_src in incident[v]:
            c = problem.edge_cost[e]
            sub = (
                c[np.ix_(kept[v], kept[other])]
                if is_src
                else c[np.ix_(kept[other], kept[v])].transpose(1, 0, 2)
            )
            parts.append(sub.reshape(len(kept[v]), -1))
        rows = np.concatenate(parts, axis=1)
        alive = _undominated_rows(rows)
        if not alive.all():
            kept[v] = kept[v][alive]
            dirty.update(other for _, other, _ in incident[v])
    return problem.restrict(kept), kept


def _undominated_rows(rows: np.ndarray) -> np.ndarray:
    """Mask of rows that no other row weakly dominates (an equal row only counts if earlier).

    Row ``i`` dominates row ``j`` when ``i <= j`` everywhere and either they differ (then ``j <= i``
    fails somewhere) or they are equal and ``i`` comes first. Each ``<=`` is tested only where it can
    hold: a row with ``+inf`` where another is finite is never ``<=`` it (a block option's rows
    against another option's: one matrix product finds these pairs), rows with the same ``+inf``
    columns are compared on their finite columns only, and the columns are compared a slice at a
    time for the pairs still standing (:func:`_pairs_le`).

    Example:
        >>> _undominated_rows(np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 1.0], [0.0, 5.0]])).tolist()
        [True, False, False, True]
    """
    m, width = rows.shape
    finite = np.isfinite(rows)
    le = np.zeros((m, m), dtype=bool)  # le[i, j]: row i <= row j everywhere
    if finite.all():
        pair_i, pair_j = np.nonzero(~np.eye(m, dtype=bool))
        pair_i, pair_j = _pairs_le(rows, pair_i, pair_j)
        le[pair_i, pair_j] = True
    else:
        ids: dict[bytes, int] = {}  # rows with the same infinite columns share a pattern
        pattern = np.array([ids.setdefault(r.tobytes(), len(ids)) for r in np.packbits(finite, axis=1)])
        first = np.unique(pattern, return_index=True)[1]
        fin = finite[first]
        # possible[i, j]: no column where i is infinite and j finite (then i <= j may hold)
        by_pattern = np.empty((len(fin), len(fin)), dtype=bool)
        step = max(1, PAIR_CELLS // max(len(fin) * width, 1))
        for lo in range(0, len(fin), step):
            by_pattern[lo:lo + step] = ~(~fin[lo:lo + step, None, :] & fin[None, :, :]).any(axis=2)
        possible = by_pattern[pattern[:, None], pattern[None, :]]
        np.fill_diagonal(possible, False)
        same = pattern[:, None] == pattern[None, :]
        for p in range(len(ids)):
            members = np.flatnonzero(pattern == p)
            cols = np.flatnonzero(finite[members[0]])
            sub_i, sub_j = np.nonzero(possible[np.ix_(members, members)])
            sub_i, sub_j = _pairs_le(rows[np.ix_(members, cols)], sub_i, sub_j)
            le[members[sub_i], members[sub_j]] = True
        pair_i, pair_j = np.nonzero(possible & ~same)
        pair_i, pair_j = _pairs_le(rows, pair_i, pair_j)
        le[pair_i, pair_j] = True
    earlier = np.arange(m)[:, None] < np.arange(m)[None, :]
    dominated = le & (~le.T | earlier)
    return ~dominated.any(axis=0)


def _pairs_le(rows: np.ndarray, pair_i: np.ndarray, pair_j: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pairs ``(i, j)`` among those given with ``rows[i] <= rows[j]`` everywhere: the columns are
    compared a slice at a time (``FIRST_COLUMNS``, then twice as many each time), and a pair that
    fails a slice is not compared again (most fail on the first columns, a node's own time and
    memory).

    Example:
        >>> rows = np.array([[1.0, 1.0], [1.0, 2.0], [0.0, 5.0]])
        >>> [p.tolist() for p in _pairs_le(rows, np.array([0, 1, 2]), np.array([1, 0, 0]))]
        [[0], [1]]
    """
    width = rows.shape[1]
    lo, step = 0, FIRST_COLUMNS
    with np.errstate(invalid="ignore"):
        while lo < width and len(pair_i):
            step = max(1, min(step, PAIR_CELLS // max(len(pair_i), 1)))
            hi = min(width, lo + step)
            ok = (rows[pair_i, lo:hi] <= rows[pair_j, lo:hi]).all(axis=1)
            pair_i, pair_j = pair_i[ok], pair_j[ok]
            lo, step = hi, 2 * step
    return pair_i, pair_j


#: Columns compared in the first slice by :func:`_undominated_rows` (each next slice twice as many).
FIRST_COLUMNS = 8
#: Most row cells compared at once by :func:`_undominated_rows`.
PAIR_CELLS = 16_000_000
