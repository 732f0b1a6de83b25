"""For random budgets the fastest frontier point under the budget equals the integer program's optimum."""

from __future__ import annotations

import numpy as np
from frontier_graphs import cost_graphs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import frontier
from frontier.reference import ilp_min_cost


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cost_graphs(k=2, max_nodes=8, max_configs=4, integer=True), st.floats(0.0, 1.0))
def test_fastest_point_under_budget_matches_ilp(G, where):
    points = frontier.solve(G)
    if not points:
        assert ilp_min_cost(G, budgets={1: 1e9}) is None
        return
    memory = np.array([p.cost[1] for p in points])
    # integer costs: a budget half-way between integers never ties a plan's memory
    budget = np.floor(memory.min() - 1 + where * (memory.max() - memory.min() + 2)) + 0.5
    best = ilp_min_cost(G, objective=0, budgets={1: budget})
    fits = [p for p in points if p.cost[1] <= budget]
    if not fits:
        assert best is None
        return
    assert best is not None and best.cost[1] <= budget
    assert best.cost[0] == min(p.cost[0] for p in fits)
