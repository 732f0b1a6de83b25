"""epsilon > 0: every true frontier point is (1 + epsilon)-covered by a real returned plan."""

from __future__ import annotations

import numpy as np
from frontier_graphs import cost_graphs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_solve_vs_brute import _recomputed

import frontier
from frontier.reference import brute_force


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cost_graphs(), st.sampled_from([0.01, 0.1, 0.3, 1.0]))
def test_epsilon_guarantee(G, eps):
    approx = frontier.solve(G, epsilon=eps)
    exact = brute_force(G)
    k = next(iter(G.nodes.values()))["cost"].shape[1]
    got = np.array([p.cost for p in approx]).reshape(len(approx), k)
    assert (len(approx) == 0) == (len(exact) == 0)
    for p in exact:
        assert ((got <= p.cost * (1 + eps) + 1e-9).all(axis=1)).any(), (p.cost, got)
    for q in approx:  # real plans with their real cost, and mutually non-dominated
        np.testing.assert_allclose(_recomputed(G, q.assignment), q.cost, rtol=1e-9, atol=1e-12)
        dominated = (got <= q.cost).all(axis=1) & (got < q.cost).any(axis=1)
        assert not dominated.any()
    assert len(approx) <= len(exact)
