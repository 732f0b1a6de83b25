r"""Exact preprocessing: configurations that differ only in their own cost become one class.

Memory options (ZeRO-1/2/3 of one split) change an operator's own time and memory but none of
its edges' costs: the layouts it consumes and produces are the same. Such configurations ``s``,
``s'`` of node ``v`` (equal ``c_uv[., s] = c_uv[., s']`` on every incident edge) are
interchangeable for the rest of the graph, so the frontier only needs, per *class* of them, the
Pareto set of their node costs::

    F(v)[class] = prune{ c_v[s] : s in class }

:func:`merge_classes` turns the problem into one over classes (edge tables indexed by one member
of each class) and gives each node a leaf table with one group per class and one row per
non-dominated member. The table records the member behind each row as its ``vals`` with
``var = v``: the plan walk (:func:`frontier.plan.reconstruct`) visits it after the table that
eliminated ``v`` (it is that table's descendant) and writes the member over the class. A node
whose classes are all single keeps one row per configuration, as before. Exact: every plan maps
to a plan over classes of equal edge costs and a node cost among the class's set, and back.

Example:
    >>> import numpy as np
    >>> from frontier.problem import Problem
    >>> p = Problem(names=["a", "b"], node_cost=[np.array([[1.0, 4.0], [2.0, 2.0], [5.0, 0.0]]),
    ...             np.zeros((1, 2))], edges=[(0, 1)],
    ...             edge_cost=[np.array([[[1.0, 0.0]], [[1.0, 0.0]], [[0.0, 0.0]]])])
    >>> small, tables = merge_classes(p)
    >>> small.sizes, tables[0].counts.tolist(), tables[0].vals.tolist()
    ([2, 1], [2, 1], [0, 1, 2])
"""

from __future__ import annotations

import hashlib

import numpy as np

from frontier.pareto import pareto_select
from frontier.problem import Problem
from frontier.table import Table


def merge_classes(problem: Problem, keep: frozenset = frozenset()) -> tuple[Problem, list[Table]]:
    """The problem over classes of configurations with equal edge costs, and each node's table.

    ``keep``: node numbers whose configurations stay one class each (variables a caller keeps
    uneliminated and indexes by configuration, :func:`frontier.chain.eliminate_except`).

    Returns:
        ``(small, node_tables)``: ``small`` has one configuration per class (its first member;
        its node cost is not used by the solve: the node table replaces it); ``node_tables[v]``
        is the leaf table of node ``v`` over its classes, whose ``vals`` are configuration
        indices of ``problem``.

    Example:
        >>> import numpy as np
        >>> p = Problem(names=["a"], node_cost=[np.array([[1.0, 2.0], [2.0, 1.0]])], edges=[], edge_cost=[])
        >>> merge_classes(p)[1][0].counts.tolist()
        [2]
    """
    n = len(problem.names)
    incident: list[list[tuple[int, bool]]] = [[] for _ in range(n)]
    for e, (u, v) in enumerate(problem.edges):
        incident[u].append((e, True))
        incident[v].append((e, False))
    first: list[np.ndarray] = []
    tables: list[Table] = []
    for v in range(n):
        cost = problem.node_cost[v]
        parts = [np.zeros((len(cost), 0))]
        for e, is_src in incident[v]:
            c = problem.edge_cost[e]
            parts.append((c if is_src else c.transpose(1, 0, 2)).reshape(len(cost), -1))
        rows = np.ascontiguousarray(np.concatenate(parts, axis=1))
        if v in keep:
            rows = np.arange(len(cost))[:, None]
        rep, cls = equal_rows(rows)
        first.append(rep)
        tables.append(_class_table(v, cost, cls, len(rep)))
    return problem.restrict(first), tables


def equal_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Classes of equal rows, numbered by their first member: ``(first member of each class, class of
    each row)``. Rows are compared by value (``-0.0`` equals ``0.0``) through their bytes, one hash per
    row (``np.unique(axis=0)`` sorts the rows as records: several times slower on wide rows).

    Example:
        >>> rep, cls = equal_rows(np.array([[1.0, 2.0], [0.0, 1.0], [1.0, 2.0], [-0.0, 1.0]]))
        >>> rep.tolist(), cls.tolist()
        ([0, 1], [0, 1, 0, 1])
    """
    rows = np.ascontiguousarray(rows + 0.0)  # -0.0 + 0.0 is 0.0: equal values, equal bytes
    seen: dict[bytes, int] = {}
    cls = np.empty(len(rows), dtype=np.int64)
    rep = []
    for i in range(len(rows)):
        key = rows[i].tobytes()
        c = seen.get(key)
        if c is None:
            c = seen[key] = len(rep)
            rep.append(i)
        cls[i] = c
    return np.asarray(rep, dtype=np.int64), cls


def _class_table(v: int, cost: np.ndarray, cls: np.ndarray, n_classes: int) -> Table:
    """Leaf table of node ``v``: per class, the Pareto set of its members' costs (infinite dropped)."""
    finite = np.flatnonzero(np.isfinite(cost).all(axis=1))
    keep = finite[pareto_select(cost[finite], cls[finite])]  # ordered by class, then objective 0
    counts = np.bincount(cls[keep], minlength=n_classes)
    start = np.r_[0, np.cumsum(counts)].astype(np.int64)
    h = hashlib.blake2b(digest_size=16)
    h.update(np.asarray((n_classes,), dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(cost[keep]).tobytes())
    h.update(start.tobytes())
    h.update(keep.astype(np.int64).tobytes())
    return Table(scope=(v,), shape=(n_classes,), cost=np.ascontiguousarray(cost[keep]), start=start,
                 digest=h.digest(), var=v, vals=keep.astype(np.int64))
