"""Checks of the solver's input, with errors that name the node or edge and the fix."""

from __future__ import annotations

import networkx as nx
import numpy as np

from frontier.problem import Problem


def load_problem(graph: nx.DiGraph, epsilon: float = 0.0) -> Problem:
    """Validate ``graph`` and return its cost tables numbered in a topological order.

    Args:
        graph: DAG whose nodes carry ``"cost"`` arrays ``(C_n, K)`` and whose edges carry
            ``"cost"`` arrays ``(C_u, C_v, K)``.
        epsilon: the approximation factor asked for (must be finite and >= 0; > 0 needs
            non-negative costs).

    Returns:
        The :class:`~frontier.problem.Problem`.

    Raises:
        ValueError: naming the offending node or edge (wrong shape, cycle, NaN or -inf
            cost, zero configurations, a node with no finite configuration, ...).

    Example:
        >>> import networkx as nx, numpy as np
        >>> g = nx.DiGraph()
        >>> g.add_node("x", cost=np.zeros((0, 2)))
        >>> load_problem(g)
        Traceback (most recent call last):
        ...
        ValueError: node 'x': "cost" has 0 configurations; give every node at least one configuration
    """
    if not isinstance(graph, nx.DiGraph) or graph.is_multigraph():
        raise ValueError(
            f"expected a networkx.DiGraph, got {type(graph).__name__}; merge parallel edges first"
        )
    if graph.number_of_nodes() == 0:
        raise ValueError("the graph has no nodes; there is nothing to plan")
    if not (np.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    if not nx.is_directed_acyclic_graph(graph):
        cycle = nx.find_cycle(graph)
        path = " -> ".join(repr(u) for u, _ in cycle) + f" -> {cycle[0][0]!r}"
        raise ValueError(f"the graph has a cycle: {path}; the solver needs a DAG (break the cycle)")
    insertion = {n: i for i, n in enumerate(graph.nodes)}
    names = list(nx.lexicographical_topological_sort(graph, key=insertion.__getitem__))
    number = {n: i for i, n in enumerate(names)}
    node_cost = [_node_cost(graph, n) for n in names]
    k = node_cost[0].shape[1]
    for n, c in zip(names, node_cost):
        if c.shape[1] != k:
            raise ValueError(
                f'node {n!r}: "cost" has {c.shape[1]} objectives but node {names[0]!r} has {k}; '
                "every cost vector needs the same objectives"
            )
    edges, edge_cost = [], []
    for u, v in graph.edges:
        c = _edge_cost(graph, u, v, node_cost[number[u]].shape[0], node_cost[number[v]].shape[0], k)
        edges.append((number[u], number[v]))
        edge_cost.append(c)
    if epsilon > 0:
        for where, c in [(f"node {n!r}", c) for n, c in zip(names, node_cost)] + [
            (f"edge {e!r}", c) for e, c in zip(graph.edges, edge_cost)
        ]:
            if (c < 0).any():
                raise ValueError(
                    f"{where}: negative cost; epsilon > 0 needs non-negative costs (use epsilon=0)"
                )
    return Problem(names=names, node_cost=node_cost, edges=edges, edge_cost=edge_cost)


def _node_cost(graph: nx.DiGraph, n) -> np.ndarray:
    """The checked ``(C, K)`` cost array of node ``n``."""
    if "cost" not in graph.nodes[n]:
        raise ValueError(f'node {n!r} has no "cost" attribute; give it a (configurations, objectives) array')
    c = _as_float(graph.nodes[n]["cost"], f"node {n!r}")
    if c.ndim != 2:
        raise ValueError(f'node {n!r}: "cost" has shape {c.shape}; expected (configurations, objectives)')
    if c.shape[0] == 0:
        raise ValueError(
            f'node {n!r}: "cost" has 0 configurations; give every node at least one configuration'
        )
    if c.shape[1] == 0:
        raise ValueError(f'node {n!r}: "cost" has 0 objectives; give at least one objective')
    _check_values(c, f"node {n!r}")
    if not np.isfinite(c).all(axis=1).any():
        raise ValueError(f"node {n!r}: every configuration has an infinite cost, so no plan is feasible")
    return c


def _edge_cost(graph: nx.DiGraph, u, v, cu: int, cv: int, k: int) -> np.ndarray:
    """The checked ``(C_u, C_v, K)`` cost array of edge ``(u, v)``."""
    if "cost" not in graph.edges[u, v]:
        raise ValueError(f'edge ({u!r}, {v!r}) has no "cost" attribute; give it a ({cu}, {cv}, {k}) array')
    c = _as_float(graph.edges[u, v]["cost"], f"edge ({u!r}, {v!r})")
    if c.shape != (cu, cv, k):
        raise ValueError(
            f'edge ({u!r}, {v!r}): "cost" has shape {c.shape}; expected ({cu}, {cv}, {k}) '
            "= (configurations of the source, configurations of the target, objectives)"
        )
    _check_values(c, f"edge ({u!r}, {v!r})")
    return c


def _as_float(value, where: str) -> np.ndarray:
    """``value`` as a float64 array, or a ValueError naming ``where``."""
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f'{where}: "cost" is not a numeric array ({exc})') from exc


def _check_values(c: np.ndarray, where: str) -> None:
    """Reject NaN and -inf (+inf marks an infeasible configuration and is allowed)."""
    if np.isnan(c).any():
        idx = tuple(int(i) for i in np.argwhere(np.isnan(c))[0])
        raise ValueError(f'{where}: "cost" has NaN at index {idx}; every cost must be a number')
    if np.isneginf(c).any():
        idx = tuple(int(i) for i in np.argwhere(np.isneginf(c))[0])
        raise ValueError(
            f'{where}: "cost" has -inf at index {idx}; use +inf to mark an infeasible configuration'
        )
