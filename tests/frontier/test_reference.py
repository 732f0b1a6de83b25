"""The baselines return real plans that the exact frontier weakly dominates."""

from __future__ import annotations

import numpy as np
import pytest
from frontier_graphs import build_graph
from test_solve_vs_brute import _recomputed

import frontier
from frontier.reference import hypervolume_2d, mcmc_frontier, nsga2_frontier


@pytest.mark.parametrize("search", [nsga2_frontier, mcmc_frontier])
def test_baselines_are_real_and_dominated_by_ft(search):
    G = build_graph(11, "skip", 8, 4, 2, integer=False)
    exact = np.array([p.cost for p in frontier.solve(G)])
    found = search(G, time_budget_s=0.5)
    assert found
    for p in found:
        np.testing.assert_allclose(_recomputed(G, p.assignment), p.cost, rtol=1e-9)
        assert ((exact <= p.cost + 1e-9).all(axis=1)).any()
    ref = exact.max(axis=0) * 1.1
    ratio = hypervolume_2d(np.array([p.cost for p in found]), ref) / hypervolume_2d(exact, ref)
    assert 0 < ratio <= 1 + 1e-12


def test_hypervolume_of_a_staircase():
    # two boxes of 2x1 and 1x2 overlapping in a unit square: area 3
    assert hypervolume_2d(np.array([[1.0, 2.0], [2.0, 1.0]]), np.array([3.0, 3.0])) == 3.0
    # a dominated point adds nothing; a point outside the reference box is ignored
    assert hypervolume_2d(np.array([[1.0, 2.0], [2.0, 1.0], [2.5, 2.5], [4, 0]]), np.array([3.0, 3.0])) == 3.0
    assert hypervolume_2d(np.zeros((0, 2)), np.array([1.0, 1.0])) == 0.0
