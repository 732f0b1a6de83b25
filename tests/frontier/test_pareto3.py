"""The compiled prunes (frontier/pareto3.py for K = 3, frontier/pareto_scan.py for K >= 4) against the
definition and the pairwise prune."""

from __future__ import annotations

import numpy as np
import pytest

from frontier import pareto
from frontier.pareto3 import prune3
from frontier.pareto_scan import prune_scan


def _definition(cost, group):
    """Indices of the rows no other row of their group dominates, and the first of equal rows."""
    keep = []
    for i in range(len(cost)):
        same = group == group[i]
        le = (cost <= cost[i]).all(axis=1) & same
        lt = (cost < cost[i]).any(axis=1)
        dominated = (le & lt).any() or (le & ~lt)[:i].any()
        if not dominated:
            keep.append(i)
    return keep


@pytest.mark.parametrize("seed", range(12))
def test_prune3_equals_the_definition_with_ties_and_groups(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    levels = int(rng.integers(2, 12))  # few levels: many ties in every objective
    cost = rng.integers(0, levels, size=(n, 3)).astype(float)
    group = rng.integers(0, int(rng.integers(1, 6)), size=n)
    got = prune3(cost, group)
    assert sorted(got.tolist()) == _definition(cost, group)
    # ordered by (group, c0, c1, c2)
    keys = [(group[i], *cost[i]) for i in got]
    assert keys == sorted(keys)


@pytest.mark.parametrize("seed", range(4))
def test_pareto_select_k3_equals_the_pairwise_prune(seed, monkeypatch):
    rng = np.random.default_rng(100 + seed)
    n = 5000
    t = rng.random(n)
    cost = np.stack([t, rng.random(n) * (2 - t), np.round(rng.random(n) * 40) / 40], axis=1)
    cost[rng.random(n) < 0.02, 1] = np.inf  # infeasible rows are never kept
    group = rng.integers(0, 7, size=n)
    fast = pareto.pareto_select(cost, group)
    monkeypatch.setattr(pareto, "COMPILED_PRUNE3", False)
    slow = pareto.pareto_select(cost, group)
    assert fast.tolist() == slow.tolist()
    assert np.isfinite(cost[fast]).all() and len(fast) > 10


@pytest.mark.parametrize("seed", range(12))
def test_prune_scan_equals_the_definition_with_ties_and_groups(seed):
    rng = np.random.default_rng(200 + seed)
    n = int(rng.integers(1, 400))
    k = int(rng.integers(1, 7))
    levels = int(rng.integers(2, 12))
    cost = rng.integers(0, levels, size=(n, k)).astype(float)
    group = rng.integers(0, int(rng.integers(1, 6)), size=n)
    got = prune_scan(cost, group)
    assert sorted(got.tolist()) == _definition(cost, group)
    keys = [(group[i], *cost[i]) for i in got]
    assert keys == sorted(keys)


@pytest.mark.parametrize("seed", range(4))
def test_pareto_select_k4_equals_the_pairwise_prune(seed, monkeypatch):
    """The pipeline DP's shape: (max t, sum t, max d, max w), anti-correlated, with ties and groups."""
    rng = np.random.default_rng(300 + seed)
    n = 6000
    t = rng.random(n)
    cost = np.stack([t, rng.random(n) * (2 - t) + t, np.round(rng.random(n) * 8) / 8,
                     rng.random(n) * (2 - t)], axis=1)
    cost[rng.random(n) < 0.02, 3] = np.inf
    group = rng.integers(0, 5, size=n)
    fast = pareto.pareto_select(cost, group)
    monkeypatch.setattr(pareto, "COMPILED_PRUNE_SCAN", False)
    slow = pareto.pareto_select(cost, group)
    assert fast.tolist() == slow.tolist()
    assert np.isfinite(cost[fast]).all() and len(fast) > 50
