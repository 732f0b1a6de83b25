"""Exact general fallback: linear dynamic programming over a narrow topological cut.

When no variable of a component has at most two neighbours, the remaining variables are
visited one at a time in a topological order (tables point from the smaller node number,
which is a topological number, to the larger). The state is one table over the *live*
variables -- visited variables that still share a table with an unvisited one::

    cut <- cut (+) (every table whose scope lies in visited + {x})      (visit x)
    cut <- U_{s_u} cut    for each u in cut's scope that is no longer live

Each step is a :meth:`frontier.combine.Combiner.combine`, so the result is exact; the
cost is exponential only in the width of the cut. Among the variables ready to visit
(all smaller-numbered neighbours visited) the one giving the smallest next cut (product
of configuration counts of the live variables) is taken.
"""

from __future__ import annotations

import math

from frontier.reductions import Reducer


def linear_dp(reducer: Reducer) -> None:
    """Eliminate every variable left in ``reducer`` by DP over a topological cut.

    Leaves the empty-scope result table in the reducer.

    Example:
        >>> import numpy as np, itertools
        >>> from frontier.combine import Combiner
        >>> from frontier.table import leaf_table
        >>> pairs = list(itertools.combinations(range(4), 2))  # K4: every node has 3 neighbours
        >>> r = Reducer(Combiner(sizes=[2] * 4), [leaf_table((v,), np.eye(2)) for v in range(4)]
        ...             + [leaf_table(p, np.zeros((2, 2, 2))) for p in pairs])
        >>> r.pick() is None
        True
        >>> linear_dp(r)
        >>> r.result().cost.tolist()
        [[0.0, 4.0], [1.0, 3.0], [2.0, 2.0], [3.0, 1.0], [4.0, 0.0]]
    """
    combiner = reducer.combiner
    unvisited = set(reducer.variables)
    visited: set[int] = set()
    cut = None
    while unvisited:
        ready = [x for x in sorted(unvisited) if all(u in visited for u in reducer.neighbours(x) if u < x)]
        x = min(ready, key=lambda x: _next_width(reducer, cut, visited, x))
        keys = [k for k in reducer.incident[x] if k <= visited | {x}]
        tables = [reducer.pop(k) for k in keys]
        cut = combiner.combine(([cut] if cut is not None else []) + tables)
        unvisited.discard(x)
        visited.add(x)
        for u in cut.scope:
            if not reducer.incident[u]:
                reducer.applied["linear DP"] += 1
                cut = combiner.combine([cut], drop=u)
                reducer.variables.discard(u)
                if reducer._on_eliminate is not None:
                    reducer._on_eliminate()
    reducer.add(cut)


def _next_width(reducer: Reducer, cut, visited: set[int], x: int) -> float:
    """Product of configuration counts of the live variables after visiting ``x``."""
    after = visited | {x}
    scope = set(cut.scope if cut is not None else ()) | {x}
    live = [u for u in scope if any(not k <= after for k in reducer.incident[u])]
    return math.prod(reducer.combiner.sizes[u] for u in live)
