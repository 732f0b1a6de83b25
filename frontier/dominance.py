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
    fails somewhere) or they are equal and ``i`` comes first: one comparison (``<=``) per pair, and
    only for the pairs still standing: the columns are compared a slice at a time (``FIRST_COLUMNS``,
    then twice as many each time), and a pair that fails a slice is not compared again. Most pairs
    fail on the first columns (a node's own time and memory); a block option's rows fail at the
    first ``+inf`` of an edge between options, so wide rows cost about their own pairs' work.

    Example:
        >>> _undominated_rows(np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 1.0], [0.0, 5.0]])).tolist()
        [True, False, False, True]
    """
    m, width = rows.shape
    pair_i, pair_j = np.nonzero(~np.eye(m, dtype=bool))  # candidate pairs: i <= j so far
    lo, step = 0, FIRST_COLUMNS
    with np.errstate(invalid="ignore"):
        while lo < width and len(pair_i):
            step = max(1, min(step, PAIR_CELLS // max(len(pair_i), 1)))
            hi = min(width, lo + step)
            ok = (rows[pair_i, lo:hi] <= rows[pair_j, lo:hi]).all(axis=1)
            pair_i, pair_j = pair_i[ok], pair_j[ok]
            lo, step = hi, 2 * step
    le = np.zeros((m, m), dtype=bool)  # le[i, j]: row i <= row j everywhere
    le[pair_i, pair_j] = True
    earlier = np.arange(m)[:, None] < np.arange(m)[None, :]
    dominated = le & (~le.T | earlier)
    return ~dominated.any(axis=0)


#: Columns compared in the first slice by :func:`_undominated_rows` (each next slice twice as many).
FIRST_COLUMNS = 8
#: Most row cells compared at once by :func:`_undominated_rows`.
PAIR_CELLS = 16_000_000
