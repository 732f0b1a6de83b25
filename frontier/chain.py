r"""Frontiers of chains of identical blocks: one interior elimination per block, a sweep for all lengths.

A chain is ``x_0 - B_1 - x_1 - B_2 - x_2 - ...``: the boundary variables ``x_j`` (the one tensor
between two blocks, by its configuration) and the blocks' interiors, each touching only its two
boundaries. Eliminating a block's interior, keeping its two boundaries, gives its *transfer table*
``R(x_{j-1}, x_j)`` (:func:`eliminate_except`: the FT reductions of :mod:`frontier.driver` on the
block's graph, the kept variables never eliminated, merged or dropped). Identical blocks have
identical transfer tables, so one elimination serves every block. The frontier of the first ``n``
blocks, per configuration of ``x_n``, is then the sweep::

    V_0(x_0)   = a start table (the received tensor's cost, or the embedding's frontier)
    V_n(x_n)   = U_{x_{n-1}} V_{n-1}(x_{n-1}) (+) R(x_{n-1}, x_n)          (:func:`sweep_step`)
    F_n        = U_{x_n} V_n(x_n) (+) E(x_n)                                (:func:`finish`)

with ``E`` the end (a send's cost, or the head's frontier per received configuration). One sweep
of ``N`` steps gives every length ``n <= N`` at once (a pipeline's stages of different block counts
read ``V_n`` off the same sweep) instead of one solve per length. Exact: it is variable
elimination in the Pareto semiring in one particular order (:mod:`frontier.reductions`); with a
box factor ``e`` each sweep step and each boxed elimination keeps one point per ``(1 + e)``-box,
and a table's ``depth`` counts those steps on its derivation paths, so every exact point is within
``(1 + e)^depth`` of a kept one (:func:`bound_of`).

Plans come back from the back-pointers: :meth:`Reduced.assignments` rebuilds a block's interior from
a row of its transfer table, the sweep tables' ``vals`` give each boundary's configuration.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import networkx as nx
import numpy as np

from frontier.classes import merge_classes
from frontier.combine import Combiner
from frontier.components import component_tables
from frontier.dominance import drop_dominated_configs
from frontier.plan import reconstruct
from frontier.reductions import Reducer
from frontier.table import Table, leaf_table
from frontier.validate import load_problem


@dataclass
class Reduced:
    """A graph with every variable but ``keep`` eliminated: its table and how to rebuild a plan."""

    table: Table
    """Over the kept variables (scope: their numbers here, ascending; renumbered ``0, 1, ...`` by
    :meth:`relabelled`)."""
    names: list
    """Graph node of each variable number."""
    kept: list[np.ndarray]
    """Per variable, the graph's configuration index of each configuration the solve kept."""
    keep: tuple
    """The kept graph nodes, in the order asked for."""

    def relabelled(self) -> Table:
        """The table with its kept variables numbered ``0, 1, ...`` in the order of ``keep``.

        Raises:
            ValueError: the kept variables' numbers are not in the order of ``keep`` (a table's
                groups follow its variables' order: ``keep`` must follow the graph's order).
        """
        numbers = tuple(self.names.index(n) for n in self.keep)
        if numbers != self.table.scope:
            raise ValueError(f"kept variables {list(self.keep)} are not in the graph's order")
        return dataclasses.replace(self.table, scope=tuple(range(len(numbers))))

    def assignments(self, rows) -> list[dict]:
        """The graph's configuration of every eliminated node behind each of ``rows`` of the table.

        Example:
            >>> G = nx.DiGraph()
            >>> G.add_node("a", cost=np.array([[1.0, 0.0], [0.0, 1.0]]))
            >>> G.add_node("b", cost=np.array([[0.0, 0.0], [0.0, 0.0]]))
            >>> G.add_edge("a", "b", cost=np.zeros((2, 2, 2)))
            >>> r = eliminate_except(G, ["b"])
            >>> r.table.counts.tolist(), r.assignments([0, 1])  # group b=0: (0, 1) by a=1, (1, 0) by a=0
            ([2, 2], [{'a': 1}, {'a': 0}])
        """
        configs = reconstruct(self.table, np.asarray(rows, dtype=np.int64), len(self.names))
        keep = set(self.keep)
        out = []
        for row in configs:
            out.append({n: int(self.kept[v][row[v]]) for v, n in enumerate(self.names)
                        if n not in keep and row[v] >= 0})
        return out


class _KeepingReducer(Reducer):
    """A :class:`frontier.reductions.Reducer` that never eliminates the variables in ``keep``."""

    def __init__(self, combiner: Combiner, tables: list[Table], keep: frozenset, compose: bool):
        self.keep = keep
        super().__init__(combiner, tables, compose=compose)

    def _refresh(self, v: int) -> None:
        if v in self.keep:
            self._estimate.pop(v, None)
            return
        super()._refresh(v)

    def pick_general(self) -> tuple[int, float]:
        from frontier.reductions import candidate_count

        free = [v for v in self.variables if v not in self.keep]
        for v in free:
            if v not in self._general:
                self._general[v] = candidate_count([self.tables[key] for key in self.incident[v]])
        v = min(free, key=lambda v: (self._general[v], v))
        return v, self._general[v]


def eliminate_except(G: nx.DiGraph, keep: list, *, step_epsilon: float = 0.0, box_min_candidates: float = 0.0,
                     memo: dict | None = None) -> Reduced:
    """Eliminate every node of the cost graph ``G`` but ``keep``: their joint frontier table.

    Args:
        G: a cost graph as :func:`frontier.solve` takes.
        keep: nodes to keep (in the graph's topological order); their configurations are neither
            dropped nor merged, so the table's groups are indexed by the graph's configurations.
        step_epsilon: box factor of each elimination (0: exact); see :func:`frontier.solve`.
        box_min_candidates: box only eliminations generating more candidates than this.
        memo: a dict shared across calls (:class:`frontier.combine.Combiner`'s memo).

    Returns:
        The :class:`Reduced`: per joint configuration of ``keep``, the Pareto set of the cost of
        everything else (kept nodes' own costs included).

    Example:
        >>> G = nx.DiGraph()
        >>> G.add_node("a", cost=np.array([[1.0, 0.0], [0.0, 1.0]]))
        >>> G.add_node("b", cost=np.array([[0.0, 0.0], [5.0, 5.0]]))
        >>> G.add_edge("a", "b", cost=np.zeros((2, 2, 2)))
        >>> r = eliminate_except(G, ["b"])
        >>> r.table.scope, r.table.cost.tolist()
        ((1,), [[0.0, 1.0], [1.0, 0.0], [5.0, 6.0], [6.0, 5.0]])
    """
    problem = load_problem(G, step_epsilon)
    numbers = frozenset(problem.names.index(n) for n in keep)
    problem, kept = drop_dominated_configs(problem, keep=numbers)
    problem, node_tables = merge_classes(problem, keep=numbers)
    tables = [t for comp in component_tables(problem, node_tables) for t in comp]
    combiner = Combiner(sizes=problem.sizes, box_eps=float(step_epsilon),
                        box_min_candidates=box_min_candidates if step_epsilon else 0.0)
    if memo is not None:
        combiner._memo = memo
    reducer = _KeepingReducer(combiner, tables, numbers, compose=bool(step_epsilon))
    while reducer.variables - numbers:
        v = reducer.pick()
        if v is None or v in numbers:
            v, _ = reducer.pick_general()
        reducer.eliminate(v)
    rest = list(reducer.tables.values())
    table = rest[0] if len(rest) == 1 else combiner.combine(rest)
    return Reduced(table, list(problem.names), kept, tuple(keep))


def _combiner(sizes: list[int], step_epsilon: float, box_min_candidates: float,
              memo: dict | None) -> Combiner:
    c = Combiner(sizes=list(sizes), box_eps=float(step_epsilon),
                 box_min_candidates=box_min_candidates if step_epsilon else 0.0)
    if memo is not None:
        c._memo = memo
    return c


def sweep_step(V: Table, R: Table, *, step_epsilon: float = 0.0, box_min_candidates: float = 0.0,
               memo: dict | None = None) -> Table:
    """``V'(y) = U_x V(x) (+) R(x, y)``: one block more (``V`` over variable 0, ``R`` over (0, 1)).

    Returns the table over ``y``, numbered 0 (its ``vals``: the configuration of ``x`` behind each
    row; its children: ``V`` and ``R``).

    Example:
        >>> V = leaf_table((0,), np.array([[0.0, 1.0], [1.0, 0.0]]))
        >>> R = leaf_table((0, 1), np.array([[[1.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [9.0, 9.0]]]))
        >>> sweep_step(V, R).cost.tolist()  # y=0: (1, 1) or (1, 0); y=1: (0, 1) or (10, 9)
        [[1.0, 0.0], [0.0, 1.0]]
    """
    if V.scope != (0,) or R.scope != (0, 1) or V.shape[0] != R.shape[0]:
        raise ValueError(f"sweep_step: V over (0,), R over (0, 1) with matching sizes; "
                         f"got {V.scope}, {R.scope}")
    out = _combiner([R.shape[0], R.shape[1]], step_epsilon, box_min_candidates, memo).combine([V, R], drop=0)
    return dataclasses.replace(out, scope=(0,))


def finish(V: Table, E: Table, *, step_epsilon: float = 0.0, box_min_candidates: float = 0.0,
           memo: dict | None = None) -> Table:
    """``U_x V(x) (+) E(x)``: the chain's frontier (empty scope); ``E`` over variable 0 too.

    Example:
        >>> V = leaf_table((0,), np.array([[0.0, 1.0], [1.0, 0.0]]))
        >>> finish(V, leaf_table((0,), np.array([[0.0, 0.0], [5.0, 0.0]]))).cost.tolist()
        [[0.0, 1.0], [6.0, 0.0]]
    """
    if V.scope != (0,) or E.scope != (0,) or V.shape != E.shape:
        raise ValueError(f"finish: V and E over (0,) with equal sizes; "
                         f"got {V.scope}{V.shape}, {E.scope}{E.shape}")
    return _combiner([V.shape[0]], step_epsilon, box_min_candidates, memo).combine([V, E], drop=0)


def start_table(cost: np.ndarray) -> Table:
    """A one-variable table from per-configuration costs (a received tensor's receive, a send).

    Example:
        >>> start_table(np.array([[1.0, 0.0], [2.0, 0.0]])).counts.tolist()
        [1, 1]
    """
    return leaf_table((0,), np.asarray(cost, dtype=np.float64))


def bound_of(table: Table, step_epsilon: float) -> float:
    """The proven bound of a table: ``(1 + e)^depth - 1`` (0 when exact).

    Example:
        >>> bound_of(start_table(np.zeros((1, 2))), 0.001)
        0.0
    """
    return (1.0 + step_epsilon) ** table.depth - 1.0 if step_epsilon > 0 else 0.0


def child(table: Table, scope_len: int) -> tuple[int, Table]:
    """Index and table of ``table``'s child with a scope of ``scope_len`` variables (a sweep step's
    ``V`` has one, its ``R`` two; a finish's ``V`` and ``E`` both one: take ``children`` by identity).

    Example:
        >>> V = leaf_table((0,), np.zeros((2, 2)))
        >>> R = leaf_table((0, 1), np.zeros((2, 2, 2)))
        >>> child(sweep_step(V, R), 2)[0] in (0, 1)
        True
    """
    for i, c in enumerate(table.children):
        if len(c.scope) == scope_len:
            return i, c
    raise ValueError(f"no child over {scope_len} variables")
