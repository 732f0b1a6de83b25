"""Configurations with equal edge costs solved as one class (memory options of one split): exact."""

from __future__ import annotations

import numpy as np
from frontier_graphs import cost_graphs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_solve_vs_brute import _recomputed

import frontier
from frontier.reference import brute_force


def _with_option_copies(G, seed: int):
    """Each node gets copies of some configurations with the same edge costs and another own cost
    (as ZeRO variants of a split): cheaper in memory, dearer in time, sometimes dominated."""
    rng = np.random.default_rng(seed)
    H = G.copy()
    for v in G.nodes:
        cost = G.nodes[v]["cost"]
        copies = rng.integers(0, len(cost), size=int(rng.integers(0, 3)))
        extra = cost[copies] * rng.uniform(0.5, 1.5, size=(len(copies), cost.shape[1]))
        H.nodes[v]["cost"] = np.concatenate([cost, extra])
        for u in G.predecessors(v):
            c = H.edges[u, v]["cost"]
            H.edges[u, v]["cost"] = np.concatenate([c, c[:, copies]], axis=1)
        for w in G.successors(v):
            c = H.edges[v, w]["cost"]
            H.edges[v, w]["cost"] = np.concatenate([c, c[copies]], axis=0)
    return H


def _same_frontier(got, want, rtol=1e-9):
    """Each point of either set is weakly dominated, to ``rtol``, by a point of the other (sums taken
    in another order differ in the last bit: a plan one ulp better in one objective is a frontier
    point of one set and dominated in the other)."""
    a, b = (np.array([p.cost for p in s]) for s in (got, want))
    assert len(a) and len(b) or (len(a) == len(b) == 0)
    for x, y in ((a, b), (b, a)):
        for p in y:
            assert (x <= p + rtol * np.abs(p) + 1e-12).all(axis=1).any(), (p, x)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cost_graphs(), st.integers(0, 10_000))
def test_classes_give_the_exact_frontier(G, seed):
    H = _with_option_copies(G, seed)
    merged = frontier.solve(H)
    exact = brute_force(H)
    _same_frontier(merged, exact)
    for p in merged:  # real plans: the member configuration, with its own cost
        np.testing.assert_allclose(_recomputed(H, p.assignment), p.cost, rtol=1e-9, atol=1e-12)
    plain = frontier.solve(H, merge=False)
    assert [tuple(p.cost) for p in plain] == [tuple(p.cost) for p in merged]


def test_option_copies_are_merged_and_the_member_is_chosen():
    import networkx as nx

    G = nx.DiGraph()
    G.add_node("a", cost=np.array([[1.0, 4.0], [2.0, 2.0], [3.0, 1.0]]))  # 1, 2: the same edges
    G.add_node("b", cost=np.array([[0.0, 0.0], [0.0, 0.0]]))
    G.add_edge("a", "b", cost=np.array([[[0.0, 0.0], [5.0, 0.0]], [[5.0, 0.0], [0.0, 0.0]],
                                        [[5.0, 0.0], [0.0, 0.0]]]))
    points = frontier.solve(G)
    assert [(p.cost.tolist(), p.assignment["a"]) for p in points] == [
        ([1.0, 4.0], 0), ([2.0, 2.0], 1), ([3.0, 1.0], 2)]
