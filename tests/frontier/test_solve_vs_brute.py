"""FT against brute-force enumeration on random DAGs: the frontier, point for point."""

from __future__ import annotations

import numpy as np
from frontier_graphs import cost_graphs
from hypothesis import HealthCheck, given, settings

import frontier
from frontier.reference import brute_force
from frontier.validate import load_problem

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _recomputed(G, assignment):
    """Cost of a plan summed straight from the graph's arrays."""
    total = sum(G.nodes[n]["cost"][s] for n, s in assignment.items())
    for u, v in G.edges:
        total = total + G.edges[u, v]["cost"][assignment[u], assignment[v]]
    return total


def _check_against_brute_force(G):
    got = frontier.solve(G)
    want = brute_force(G)
    k = G.nodes[next(iter(G.nodes))]["cost"].shape[1]
    got_c = np.array([p.cost for p in got]).reshape(len(got), k)
    want_c = np.array([p.cost for p in want]).reshape(len(want), k)
    assert len(got) == len(want), (got_c, want_c)
    np.testing.assert_allclose(got_c, want_c, rtol=1e-9, atol=1e-12)
    for p in got:
        assert set(p.assignment) == set(G.nodes)
        np.testing.assert_allclose(_recomputed(G, p.assignment), p.cost, rtol=1e-9, atol=1e-12)
    assert all(got_c[i, 0] <= got_c[i + 1, 0] for i in range(len(got) - 1))
    return got


@settings(max_examples=300, **SETTINGS)
@given(cost_graphs(k=2))
def test_two_objectives_match_brute_force(G):
    _check_against_brute_force(G)


@settings(max_examples=150, **SETTINGS)
@given(cost_graphs(k=3))
def test_three_objectives_match_brute_force(G):
    _check_against_brute_force(G)


@settings(max_examples=40, **SETTINGS)
@given(cost_graphs(k=2, max_nodes=9, max_configs=3, max_plans=20000, integer=True, inf_prob=0.0))
def test_larger_graphs_with_ties_match_brute_force(G):
    got = _check_against_brute_force(G)
    # distinct vectors: no two returned points share a cost vector
    assert len({tuple(p.cost) for p in got}) == len(got)


def test_infeasible_everywhere_gives_empty_frontier():
    import networkx as nx

    G = nx.DiGraph()
    G.add_node("a", cost=np.array([[1.0, 1.0], [2.0, 0.0]]))
    G.add_node("b", cost=np.array([[1.0, 1.0]]))
    G.add_edge("a", "b", cost=np.full((2, 1, 2), np.inf))
    assert frontier.solve(G) == []
    assert brute_force(G) == []


def test_single_objective_is_the_minimum():
    import networkx as nx

    G = nx.DiGraph()
    G.add_node("a", cost=np.array([[3.0], [1.0]]))
    G.add_node("b", cost=np.array([[2.0], [5.0]]))
    G.add_edge("a", "b", cost=np.array([[[0.0], [0.0]], [[4.0], [0.0]]]))
    (p,) = frontier.solve(G)
    assert p.cost.tolist() == [5.0] and p.assignment == {"a": 0, "b": 0}
    assert len(load_problem(G).names) == 2
