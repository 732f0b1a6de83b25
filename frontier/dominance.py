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
    fails somewhere) or they are equal and ``i`` comes first: one comparison of every pair (``<=``),
    not two (``<=`` and ``<``), in chunks of rows.

    Example:
        >>> _undominated_rows(np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 1.0], [0.0, 5.0]])).tolist()
        [True, False, False, True]
    """
    m, width = rows.shape
    le = np.empty((m, m), dtype=bool)  # le[i, j]: row i <= row j everywhere
    step = max(1, PAIR_CELLS // max(m * width, 1))
    with np.errstate(invalid="ignore"):
        for lo in range(0, m, step):
            le[lo:lo + step] = (rows[lo:lo + step, None, :] <= rows[None, :, :]).all(axis=2)
    np.fill_diagonal(le, False)
    earlier = np.arange(m)[:, None] < np.arange(m)[None, :]
    dominated = le & (~le.T | earlier)
    return ~dominated.any(axis=0)


#: Most row cells compared at once by :func:`_undominated_rows`.
PAIR_CELLS = 16_000_000
