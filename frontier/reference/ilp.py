"""Single-objective integer program (the method of Alpa and its successors), solved by HiGHS.

    min  sum_v sum_s c_v[s]_o x_{v,s} + sum_(u,v) sum_{s,t} c_uv[s,t]_o y_{uv,s,t}
    s.t. sum_s x_{v,s} = 1                                  for every node v
         sum_t y_{uv,s,t} = x_{u,s},  sum_s y_{uv,s,t} = x_{v,t}   for every edge, s, t
         (same sums with objective k) <= budget_k           for every budgeted objective k
         x binary, 0 <= y <= 1

With x binary the marginal constraints force ``y_{uv,s,t} = x_{u,s} x_{v,t}``, so the
linearisation is exact. Infinite costs fix their variable to 0.
"""

from __future__ import annotations

import highspy
import networkx as nx
import numpy as np

from frontier.point import Point
from frontier.validate import load_problem


def ilp_min_cost(
    G: nx.DiGraph, objective: int = 0, budgets: dict[int, float] | None = None, time_limit_s: float = 600.0
) -> Point | None:
    """The plan minimising ``objective`` subject to ``cost[k] <= budgets[k]``, or None if infeasible.

    Args:
        G: cost graph in :func:`frontier.solve`'s format.
        objective: index of the objective to minimise.
        budgets: objective index -> upper bound on that objective's total.
        time_limit_s: HiGHS time limit (the answer is then the best found, maybe not optimal).

    Returns:
        A :class:`~frontier.point.Point` with the plan's recomputed cost vector.

    Example:
        >>> import networkx as nx, numpy as np
        >>> G = nx.DiGraph()
        >>> G.add_node("a", cost=np.array([[1.0, 4.0], [3.0, 1.0]]))
        >>> ilp_min_cost(G, budgets={1: 2.0}).assignment
        {'a': 1}
    """
    problem = load_problem(G)
    budgets = budgets or {}
    sizes = problem.sizes
    x_off = np.r_[0, np.cumsum(sizes)]
    blocks = [(x_off[i], c) for i, c in enumerate(problem.node_cost)]
    edges = [(e, c) for e, c in zip(problem.edges, problem.edge_cost) if np.any(c != 0)]
    y_off = [int(x_off[-1])]
    for (u, v), _ in edges:
        y_off.append(y_off[-1] + sizes[u] * sizes[v])
    blocks += [(y_off[i], c.reshape(-1, c.shape[-1])) for i, (_, c) in enumerate(edges)]
    n_cols = y_off[-1]
    coef = np.zeros((n_cols, problem.num_objectives))
    upper = np.ones(n_cols)
    for off, c in blocks:
        finite = np.isfinite(c).all(axis=1)
        coef[off : off + len(c)] = np.where(finite[:, None], c, 0.0)
        upper[off : off + len(c)] = finite
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("time_limit", float(time_limit_s))
    empty_i, empty_f = np.zeros(0, np.int32), np.zeros(0)
    h.addCols(
        n_cols, coef[:, objective], np.zeros(n_cols), upper, 0, np.zeros(n_cols, np.int32), empty_i, empty_f
    )
    n_x = int(x_off[-1])
    h.changeColsIntegrality(n_x, np.arange(n_x, dtype=np.int32), np.ones(n_x, dtype=np.uint8))
    rows: list[tuple[np.ndarray, np.ndarray, float, float]] = []
    for v in range(len(sizes)):
        rows.append((np.arange(x_off[v], x_off[v + 1]), np.ones(sizes[v]), 1.0, 1.0))
    for i, ((u, v), _) in enumerate(edges):
        grid = np.arange(sizes[u] * sizes[v]).reshape(sizes[u], sizes[v]) + y_off[i]
        for s in range(sizes[u]):
            rows.append((np.r_[grid[s], x_off[u] + s], np.r_[np.ones(sizes[v]), -1.0], 0.0, 0.0))
        for t in range(sizes[v]):
            rows.append((np.r_[grid[:, t], x_off[v] + t], np.r_[np.ones(sizes[u]), -1.0], 0.0, 0.0))
    for k, budget in budgets.items():
        nz = np.flatnonzero(coef[:, k])
        rows.append((nz, coef[nz, k], -highspy.kHighsInf, float(budget)))
    starts = np.r_[0, np.cumsum([len(r[0]) for r in rows])[:-1]].astype(np.int32)
    index = np.concatenate([r[0] for r in rows]).astype(np.int32)
    value = np.concatenate([r[1] for r in rows]).astype(np.float64)
    lower = np.array([r[2] for r in rows], dtype=np.float64)
    upper_rows = np.array([r[3] for r in rows], dtype=np.float64)
    h.addRows(len(rows), lower, upper_rows, len(index), starts, index, value)
    h.run()
    if h.getModelStatus() == highspy.HighsModelStatus.kInfeasible:
        return None
    col = np.asarray(h.getSolution().col_value)
    if len(col) < n_cols:
        return None
    configs = np.array([[int(np.argmax(col[x_off[v] : x_off[v + 1]])) for v in range(len(sizes))]])
    cost = problem.costs(configs)[0]
    return Point(cost=cost, assignment={n: int(s) for n, s in zip(problem.names, configs[0])})
