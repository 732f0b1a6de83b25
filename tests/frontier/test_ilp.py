"""For random budgets the fastest frontier point under the budget equals the integer program's optimum."""

from __future__ import annotations

import numpy as np
from frontier_graphs import cost_graphs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_classes import _with_option_copies

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


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cost_graphs(k=2, max_nodes=7, max_configs=4, integer=True), st.integers(0, 10_000),
       st.floats(0.0, 1.0))
def test_with_memory_option_copies_the_fastest_point_under_budget_matches_ilp(G, seed, where):
    """Memory options (ZeRO variants of a split: the same edge costs, another own cost) are solved
    as classes; the frontier's fastest plan under a budget is still the integer program's optimum."""
    H = _with_option_copies(G, seed)
    points = frontier.solve(H)
    if not points:  # no finite plan: the integer program has none either
        assert ilp_min_cost(H, budgets={1: 1e9}) is None
        return
    memory = np.unique([p.cost[1] for p in points])
    # a budget strictly between two frontier memories (or above the largest): no tie with a plan
    i = min(int(where * len(memory)), len(memory) - 1)
    budget = (memory[i] + memory[i + 1]) / 2 if i + 1 < len(memory) else memory[i] * 1.5 + 1
    best = ilp_min_cost(H, objective=0, budgets={1: budget})
    fits = [p.cost[0] for p in points if p.cost[1] <= budget]
    assert best is not None and best.cost[1] <= budget * (1 + 1e-9)
    np.testing.assert_allclose(best.cost[0], min(fits), rtol=1e-6, atol=1e-9)
