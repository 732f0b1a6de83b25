"""Disconnected graphs: each connected component is solved alone, then the frontiers are
combined by a Minkowski sum and a prune (the total cost is the sum of the parts)."""

from __future__ import annotations

from collections.abc import Callable

from frontier.combine import Combiner
from frontier.problem import Problem
from frontier.table import Table, leaf_table


def component_tables(problem: Problem, node_tables: list[Table] | None = None) -> list[list[Table]]:
    """Leaf tables of ``problem`` split by connected component (node tables and edge tables).

    ``node_tables`` replaces the node tables built from ``problem.node_cost`` (the classes of
    :func:`frontier.classes.merge_classes`).

    Example:
        >>> import numpy as np
        >>> p = Problem(names=["a", "b", "c"], node_cost=[np.zeros((2, 2))] * 3,
        ...             edges=[(0, 1)], edge_cost=[np.zeros((2, 2, 2))])
        >>> [[t.scope for t in comp] for comp in component_tables(p)]
        [[(0,), (1,), (0, 1)], [(2,)]]
    """
    parent = list(range(len(problem.names)))

    def find(v: int) -> int:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for u, v in problem.edges:
        parent[find(u)] = find(v)
    comps: dict[int, list[Table]] = {}
    for n, c in enumerate(problem.node_cost):
        table = leaf_table((n,), c) if node_tables is None else node_tables[n]
        comps.setdefault(find(n), []).append(table)
    for (u, v), c in zip(problem.edges, problem.edge_cost):
        comps[find(u)].append(leaf_table((u, v), c))
    return list(comps.values())


def sum_components(
    combiner: Combiner, results: list[Table], progress: Callable[[], None] | None = None
) -> Table:
    """Minkowski sum (then prune) of the empty-scope frontiers of the components.

    Example:
        >>> import numpy as np
        >>> c = Combiner(sizes=[2, 2])
        >>> unit = np.array([[0.0, 1.0], [1.0, 0.0]])
        >>> parts = [c.combine([leaf_table((v,), unit)], drop=v) for v in (0, 1)]
        >>> sum_components(c, parts).cost.tolist()
        [[0.0, 2.0], [1.0, 1.0], [2.0, 0.0]]
    """
    total = results[0]
    for part in results[1:]:
        total = combiner.combine([total, part])
        if progress is not None:
            progress()
    return total
