"""FlexFlow-style MCMC search: Metropolis moves that change one node's configuration.

FlexFlow minimises one simulated cost; to trace a frontier the chain minimises a
weighted sum of the normalised objectives, cycling the weight, and keeps an archive of
every non-dominated plan it visits.
"""

from __future__ import annotations

import time

import networkx as nx
import numpy as np

from frontier.pareto import pareto_select
from frontier.point import Point
from frontier.validate import load_problem


def mcmc_frontier(
    G: nx.DiGraph, time_budget_s: float, beta: float = 200.0, steps_per_weight: int = 2000, seed: int = 0
) -> list[Point]:
    """An approximate Pareto frontier from Metropolis search within ``time_budget_s`` seconds.

    Args:
        G: cost graph in :func:`frontier.solve`'s format.
        time_budget_s: wall-clock budget.
        beta: inverse temperature on the normalised scalarised cost (a move that is worse by
            1/beta of the start plan's cost is accepted with probability 1/e).
        steps_per_weight: proposals before the scalarisation weight changes.
        seed: random seed.

    Example:
        >>> import networkx as nx, numpy as np
        >>> G = nx.DiGraph()
        >>> G.add_node("a", cost=np.array([[1.0, 4.0], [3.0, 1.0], [4.0, 4.0]]))
        >>> sorted(p.assignment["a"] for p in mcmc_frontier(G, time_budget_s=0.2))
        [0, 1]
    """
    problem = load_problem(G)
    rng = np.random.default_rng(seed)
    n, k = len(problem.names), problem.num_objectives
    incident: list[list[tuple[np.ndarray, int, bool]]] = [[] for _ in range(n)]
    for (u, v), c in zip(problem.edges, problem.edge_cost):
        incident[u].append((c, v, True))
        incident[v].append((c, u, False))
    config = np.array(
        [int(np.argmin(np.where(np.isfinite(c).all(1), c.sum(1), np.inf))) for c in problem.node_cost]
    )
    total = problem.costs(config[None])[0]
    scale = np.where(np.isfinite(total) & (np.abs(total) > 0), np.abs(total), 1.0)
    weights = np.linspace(0.0, 1.0, 9) if k == 2 else rng.dirichlet(np.ones(k), size=16)
    front = total[None].copy()
    archive_cost, archive_cfg = [total.copy()], [config.copy()]
    deadline = time.perf_counter() + time_budget_s
    step = 0
    while time.perf_counter() < deadline:
        w = weights[(step // steps_per_weight) % len(weights)]
        w = np.array([1.0 - w, w]) if k == 2 else w
        for _ in range(steps_per_weight):
            v = int(rng.integers(n))
            s_new = int(rng.integers(len(problem.node_cost[v])))
            s_old = int(config[v])
            if s_new == s_old:
                continue
            new = problem.node_cost[v][s_new].copy()
            old = problem.node_cost[v][s_old].copy()
            for c, other, is_src in incident[v]:
                t = config[other]
                new += c[s_new, t] if is_src else c[t, s_new]
                old += c[s_old, t] if is_src else c[t, s_old]
            if not np.isfinite(new).all():
                continue
            if not np.isfinite(old).all():  # leaving an infeasible plan: always accept
                config[v] = s_new
                total = problem.costs(config[None])[0]
                continue
            delta = new - old
            change = float((delta / scale) @ w)
            if change <= 0 or rng.random() < np.exp(-beta * change):
                config[v] = s_new
                total = total + delta
                if np.isfinite(total).all() and not (front <= total).all(axis=1).any():
                    archive_cost.append(total.copy())
                    archive_cfg.append(config.copy())
                    front = np.vstack([front[~(total <= front).all(axis=1)], total])
        step += steps_per_weight
        if len(archive_cost) > 1024:
            keep = pareto_select(np.array(archive_cost))
            archive_cost = [archive_cost[i] for i in keep]
            archive_cfg = [archive_cfg[i] for i in keep]
    configs = np.array(archive_cfg)
    cost = problem.costs(configs)
    keep = pareto_select(cost)
    return [Point(cost=cost[i], assignment=dict(zip(problem.names, configs[i].tolist()))) for i in keep]
