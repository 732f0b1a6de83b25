"""Exact preprocessing: a node with one configuration is folded into its neighbours.

A node ``x`` left with a single configuration (after :func:`frontier.dominance.drop_dominated_configs`,
or because it has only one: a ``stack`` of per-step results, a replicated scalar) takes no decision,
so each of its edges is a cost of the neighbour alone::

    c_u[s_u] += c_ux[s_u, 0]        for every edge (u, x) or (x, u)

and the edge is removed. Every plan's cost is unchanged (the same terms, regrouped), so the
frontier is the same. Without it, such a node joins all its neighbours into one table: a Mamba
selective scan exported as 32 steps, each step's output edged to one ``stack``, is a graph no
reduction applies to, and the fallback carries every step's configuration until ``stack`` is
reached (4^32 joint configurations). Folded, each step is a plain series element.
"""

from __future__ import annotations

from frontier.problem import Problem


def fold_fixed_nodes(problem: Problem) -> Problem:
    """``problem`` with every edge touching a one-configuration node added to the other end's
    node cost (to ``u``'s where both ends have one) and removed.

    Example:
        >>> import numpy as np
        >>> p = Problem(names=["a", "b"], node_cost=[np.array([[1.0, 0.0], [0.0, 1.0]]),
        ...             np.array([[5.0, 5.0]])], edges=[(0, 1)],
        ...             edge_cost=[np.array([[[1.0, 0.0]], [[0.0, 2.0]]])])
        >>> folded = fold_fixed_nodes(p)
        >>> folded.edges, folded.node_cost[0].tolist()
        ([], [[2.0, 0.0], [0.0, 3.0]])
        >>> cfg = np.array([[0, 0], [1, 0]])
        >>> (folded.costs(cfg) == p.costs(cfg)).all()
        np.True_
    """
    sizes = problem.sizes
    if min(sizes) > 1:
        return problem
    node_cost = list(problem.node_cost)
    edges, edge_cost = [], []
    for (u, v), c in zip(problem.edges, problem.edge_cost):
        if sizes[v] == 1:
            node_cost[u] = node_cost[u] + c[:, 0, :]
        elif sizes[u] == 1:
            node_cost[v] = node_cost[v] + c[0, :, :]
        else:
            edges.append((u, v))
            edge_cost.append(c)
    return Problem(names=problem.names, node_cost=node_cost, edges=edges, edge_cost=edge_cost)

