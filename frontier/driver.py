r"""Frontier tracking (FT): the exact Pareto frontier of a cost graph.

Formulation. A DAG ``G = (V, E)``; node ``v`` has configurations ``s_v in {0..C_v-1}``
with cost vectors ``c_v[s_v] in R^K``; edge ``(u, v)`` has ``c_uv[s_u, s_v] in R^K``
(all objectives additive and minimised; ``+inf`` marks an infeasible choice). A plan
``s`` costs (:meth:`frontier.problem.Problem.costs`)::

    cost(s) = sum_{v in V} c_v[s_v] + sum_{(u,v) in E} c_uv[s_u, s_v]

and the answer is the Pareto frontier ``PF = min{ cost(s) : s }``, one plan per
distinct non-dominated vector. FT is variable elimination in the semiring whose "sum" is
the Minkowski sum of Pareto sets and whose "min" is their union
(:func:`frontier.pareto.pareto_select` prunes after both):

- configurations beaten by another of the same node are dropped first (exact):
  :func:`frontier.dominance.drop_dominated_configs`; a node left with one configuration is folded
  into its neighbours' node costs (exact): :func:`frontier.fixed.fold_fixed_nodes`;
  configurations with equal edge costs (memory options of one split) become one class whose
  node table holds their Pareto set (exact): :func:`frontier.classes.merge_classes`;
- ``F(v)``, ``F(u, v)``: frontier tables, one Pareto set per configuration (pair)
  (:class:`frontier.table.Table`, built by :func:`frontier.components.component_tables`);
- ``F (+) F'`` and ``U_{s_v}``: :meth:`frontier.combine.Combiner.combine`, memoised so
  identical repeated blocks are computed once;
- node / edge elimination, triangle, merge / contract of degree-one nodes:
  :class:`frontier.reductions.Reducer`; when none applies, the elimination of the variable (of
  any number of neighbours) that generates the fewest candidates:
  :meth:`frontier.reductions.Reducer.pick_general`;
- disconnected parts: ``PF = prune(PF_1 (+) PF_2 (+) ...)``,
  :func:`frontier.components.sum_components`;
- plans from back-pointers: :func:`frontier.plan.reconstruct`.

With ``epsilon > 0`` each elimination first keeps one point per ``(1 + e)``-box with
``(1 + e)^D = 1 + epsilon``, ``D`` the number of variables of the largest component (no
derivation passes more eliminations), so every true frontier point is within
``1 + epsilon`` of a returned one in every objective (docs/algorithm.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from frontier.classes import merge_classes
from frontier.combine import Combiner, CombineStats
from frontier.components import component_tables, sum_components
from frontier.dominance import drop_dominated_configs
from frontier.fixed import fold_fixed_nodes
from frontier.memory_limit import SolverMemoryError, default_limit_bytes
from frontier.pareto import pareto_select
from frontier.plan import reconstruct
from frontier.point import Point
from frontier.reductions import Reducer
from frontier.validate import load_problem

#: Most candidate points the general fallback may generate in one elimination (an hour's work and
#: tables past any machine's memory beyond); past it the solve stops at once, naming the node.
GENERAL_MAX_CANDIDATES = 1e9


@dataclass
class SolveReport:
    """What a solve did: reductions applied and kernel work (for benchmarks and tests)."""

    reductions: dict = field(default_factory=dict)
    """Reduction name -> times applied."""
    stats: CombineStats = field(default_factory=CombineStats)
    """Kernel counters, including how many combines were reused from the memo."""
    bound: float = 0.0
    """Proven bound of the result: every exact frontier point is within a factor ``1 + bound``,
    in every objective, of a returned point; ``(1 + e)^h - 1`` with ``e`` the per-elimination box
    factor and ``h`` the most boxing steps on one derivation path (0 when exact)."""
    box_depth: int = 0
    """``h`` above: the most boxing steps on one derivation path of the returned frontier."""


def solve(
    G: nx.DiGraph,
    *,
    epsilon: float = 0.0,
    progress: Callable[[int, int], None] | None = None,
    reuse: bool = True,
    report: SolveReport | None = None,
    memory_limit_bytes: float | None | str = "auto",
    step_epsilon: float | None = None,
    box_min_candidates: float = 0.0,
    merge: bool = True,
    memo: dict | None = None,
) -> list[Point]:
    """The Pareto frontier of the cost graph ``G`` (see the module docstring).

    Args:
        G: DAG; node attr ``"cost"`` of shape ``(C_n, K)``, edge attr ``"cost"`` of shape
            ``(C_u, C_v, K)``. Other attributes are ignored.
        epsilon: 0 for the exact frontier; > 0 for a (1 + epsilon)-approximation whose
            points are still real plans with their real costs (costs must be >= 0).
        progress: called as ``progress(done, total)`` with the number of nodes eliminated
            so far and the total number of nodes (first with ``done = 0``, last with
            ``done = total``).
        reuse: memoise identical reductions (repeated blocks); off only for comparisons.
        report: filled with the reductions applied and the kernel counters, if given.
        step_epsilon: instead of ``epsilon``, the box factor of each elimination (``e`` in
            docs/algorithm.md); the bound it guarantees is then measured on the derivation paths
            actually taken and given in ``report.bound``.
        box_min_candidates: with ``step_epsilon``, box only the eliminations generating more
            candidate points than this (the sweep steps of a deep model; block interiors stay
            exact and add nothing to the bound); 0 boxes every elimination.
        merge: solve over classes of configurations with equal edge costs
            (:mod:`frontier.classes`); off only for comparisons.
        memo: a dict kept by the caller across solves: combines already computed in an earlier
            solve (with the same ``step_epsilon`` / ``box_min_candidates``) are answered from it.
            Its keys are content digests (:meth:`frontier.combine.Combiner.key`), so graphs that
            share identical blocks (a pipeline's stages of different lengths) share their
            interior eliminations and the compositions of their sweep.
        memory_limit_bytes: most bytes the kept tables may take; ``"auto"``:
            :func:`frontier.memory_limit.default_limit_bytes` (60 % of the available memory, or
            ``$TENSOROPT_SOLVER_MEMORY_GIB``); None: no limit.

    Returns:
        One :class:`~frontier.point.Point` per distinct non-dominated cost vector, sorted
        by objective 0 ascending; empty when every plan has an infinite cost.

    Raises:
        ValueError: bad input, naming the node or edge (see :func:`frontier.validate.load_problem`).
        frontier.memory_limit.SolverMemoryError: the tables outgrew ``memory_limit_bytes`` (the
            message says what to change), instead of the process being killed by the system.

    Example:
        >>> import networkx as nx, numpy as np
        >>> G = nx.DiGraph()
        >>> G.add_node("a", cost=np.array([[1.0, 4.0], [3.0, 1.0]]))
        >>> G.add_node("b", cost=np.array([[1.0, 1.0], [2.0, 0.0]]))
        >>> G.add_edge("a", "b", cost=np.array([[[0.0, 0.0], [1.0, 0.0]], [[1.0, 0.0], [0.0, 0.0]]]))
        >>> [(p.cost.tolist(), p.assignment) for p in solve(G)]
        [([2.0, 5.0], {'a': 0, 'b': 0}), ([4.0, 4.0], {'a': 0, 'b': 1}), ([5.0, 1.0], {'a': 1, 'b': 1})]
    """
    if step_epsilon is not None and epsilon > 0:
        raise ValueError("solve: give epsilon or step_epsilon, not both")
    original = load_problem(G, epsilon if step_epsilon is None else step_epsilon)
    problem, kept = drop_dominated_configs(original)
    problem = fold_fixed_nodes(problem)
    n = len(problem.names)
    if merge:
        problem, node_tables = merge_classes(problem)
        components = component_tables(problem, node_tables)
    else:
        components = component_tables(problem)
    depth = max(len({v for t in comp for v in t.scope}) for comp in components)
    box_eps = (1.0 + epsilon) ** (1.0 / depth) - 1.0 if epsilon > 0 else 0.0
    if step_epsilon is not None:
        box_eps = float(step_epsilon)
    if memory_limit_bytes == "auto":
        memory_limit_bytes = default_limit_bytes()
    combiner = Combiner(sizes=problem.sizes, box_eps=box_eps, reuse=reuse,
                        memory_limit_bytes=memory_limit_bytes,
                        box_min_candidates=box_min_candidates if step_epsilon is not None else 0.0)
    if memo is not None and reuse:
        combiner._memo = memo
    done = [0]

    def tick() -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], n)

    if progress is not None:
        progress(0, n)
    results, applied = [], {}
    for tables in components:
        reducer = Reducer(combiner, tables, on_eliminate=tick, compose=step_epsilon is not None)
        while reducer.variables:
            v = reducer.pick()
            if v is None:
                v, candidates = reducer.pick_general()
                if candidates > GENERAL_MAX_CANDIDATES:
                    raise SolverMemoryError(_inseparable_message(problem, reducer, v, candidates))
            reducer.eliminate(v)
        results.append(reducer.result())
        for name, count in reducer.applied.items():
            applied[name] = applied.get(name, 0) + count
    root = sum_components(combiner, results)
    if report is not None:
        report.reductions = applied
        report.stats = combiner.stats
        report.box_depth = root.depth
        report.bound = (1.0 + box_eps) ** root.depth - 1.0 if box_eps > 0 else 0.0
    if root.size == 0:
        return []
    configs = reconstruct(root, np.arange(root.size), n)
    configs = np.stack([kept[v][configs[:, v]] for v in range(n)], axis=1)
    costs = original.costs(configs)
    scale = np.maximum(np.abs(root.cost), np.abs(costs)).max(initial=0.0)
    if not np.allclose(costs, root.cost, rtol=1e-9, atol=1e-12 * max(scale, 1.0)):
        raise RuntimeError("internal error: a reconstructed plan's cost differs from its frontier point")
    keep = pareto_select(costs)
    names = original.names
    return [Point(cost=costs[i], assignment=dict(zip(names, configs[i].tolist()))) for i in keep]


def _inseparable_message(problem, reducer: Reducer, v: int, candidates: float) -> str:
    """What the solve says when even the cheapest general elimination is too large."""
    joined = sorted(reducer.neighbours(v))
    shown = ", ".join(repr(problem.names[u]) for u in joined[:5]) + (", ..." if len(joined) > 5 else "")
    groups = np.prod([float(problem.sizes[u]) for u in joined])
    return (f"node {problem.names[v]!r} cannot be separated from the {len(joined)} nodes it shares "
            f"tables with ({shown}): eliminating it, the cheapest step left, would generate "
            f"{candidates:.3g} candidate points over {groups:.3g} joint configurations (the limit is "
            f"{GENERAL_MAX_CANDIDATES:.0e}); solve a smaller space (fewer configurations per operator, "
            "fewer devices) or a graph with fewer operators sharing inputs with many others")
