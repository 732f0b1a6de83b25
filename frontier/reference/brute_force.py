"""Brute force: enumerate every plan, evaluate all of them, keep the Pareto set."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np

from frontier.pareto import pareto_select
from frontier.point import Point
from frontier.validate import load_problem

#: Refuse graphs with more plans than this (enumeration is exponential).
MAX_PLANS = 5_000_000
_BATCH = 200_000


def brute_force(G: nx.DiGraph, max_plans: int = MAX_PLANS) -> list[Point]:
    """The exact Pareto frontier by enumerating all ``prod(C_n)`` plans (small graphs only).

    Same output format as :func:`frontier.solve`: one point per distinct non-dominated
    cost vector, sorted by objective 0.

    Example:
        >>> import networkx as nx, numpy as np
        >>> G = nx.DiGraph()
        >>> G.add_node("a", cost=np.array([[1.0, 2.0], [2.0, 1.0], [3.0, 3.0]]))
        >>> [p.cost.tolist() for p in brute_force(G)]
        [[1.0, 2.0], [2.0, 1.0]]
    """
    problem = load_problem(G)
    sizes = problem.sizes
    total = math.prod(sizes)
    if total > max_plans:
        raise ValueError(f"the graph has {total} plans, more than max_plans={max_plans}; use frontier.solve")
    best_cost, best_cfg = [], []
    for lo in range(0, total, _BATCH):
        configs = np.stack(np.unravel_index(np.arange(lo, min(lo + _BATCH, total)), sizes), axis=1)
        costs = problem.costs(configs)
        keep = pareto_select(costs)
        best_cost.append(costs[keep])
        best_cfg.append(configs[keep])
    costs, configs = np.concatenate(best_cost), np.concatenate(best_cfg)
    keep = pareto_select(costs)
    return [
        Point(cost=costs[i], assignment={n: int(s) for n, s in zip(problem.names, configs[i])}) for i in keep
    ]
