"""NSGA-II (pymoo) on the plan space: one integer variable per node, its configuration."""

from __future__ import annotations

import networkx as nx
import numpy as np

from frontier.pareto import pareto_select
from frontier.point import Point
from frontier.validate import load_problem


def nsga2_frontier(G: nx.DiGraph, time_budget_s: float, pop_size: int = 100, seed: int = 0) -> list[Point]:
    """An approximate Pareto frontier found by NSGA-II within ``time_budget_s`` seconds.

    Integer genes with simulated binary crossover and polynomial mutation, rounded (the
    usual pymoo recipe for integer problems). Infeasible (infinite-cost) plans get a
    large finite penalty during the search and are never returned.

    Example:
        >>> import networkx as nx, numpy as np
        >>> G = nx.DiGraph()
        >>> G.add_node("a", cost=np.array([[1.0, 4.0], [3.0, 1.0], [4.0, 4.0]]))
        >>> sorted(p.assignment["a"] for p in nsga2_frontier(G, time_budget_s=0.5, pop_size=8))
        [0, 1]
    """
    from pymoo.algorithms.moo.nsga2 import NSGA2
    from pymoo.core.problem import Problem as PymooProblem
    from pymoo.operators.crossover.sbx import SBX
    from pymoo.operators.mutation.pm import PM
    from pymoo.operators.repair.rounding import RoundingRepair
    from pymoo.operators.sampling.rnd import IntegerRandomSampling
    from pymoo.optimize import minimize
    from pymoo.termination.max_time import TimeBasedTermination

    problem = load_problem(G)
    sizes = np.array(problem.sizes)
    finite = np.concatenate([c[np.isfinite(c)] for c in problem.node_cost + problem.edge_cost])
    penalty = 10.0 * (np.abs(finite).sum() + 1.0)

    class Plans(PymooProblem):
        def __init__(self):
            super().__init__(
                n_var=len(sizes),
                n_obj=problem.num_objectives,
                xl=np.zeros(len(sizes)),
                xu=sizes - 1.0,
                vtype=int,
            )

        def _evaluate(self, x, out, *args, **kwargs):
            cost = problem.costs(np.clip(np.rint(x), 0, sizes - 1).astype(np.int64))
            out["F"] = np.where(np.isfinite(cost), cost, penalty)

    algorithm = NSGA2(
        pop_size=pop_size,
        sampling=IntegerRandomSampling(),
        crossover=SBX(prob=0.9, eta=15, vtype=float, repair=RoundingRepair()),
        mutation=PM(eta=20, vtype=float, repair=RoundingRepair()),
        eliminate_duplicates=True,
    )
    res = minimize(Plans(), algorithm, TimeBasedTermination(float(time_budget_s)), seed=seed, verbose=False)
    configs = np.clip(np.rint(res.pop.get("X")), 0, sizes - 1).astype(np.int64)
    cost = problem.costs(configs)
    keep = pareto_select(cost)
    return [Point(cost=cost[i], assignment=dict(zip(problem.names, configs[i].tolist()))) for i in keep]
