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
@pytest.mark.parametrize("prune, objectives", [(prune3, (3, 3)), (prune_scan, (1, 6))])
def test_prune_equals_the_definition_with_ties_and_groups(prune, objectives, seed):
    rng = np.random.default_rng(seed if prune is prune3 else 200 + seed)
    n = int(rng.integers(1, 400))
    k = int(rng.integers(objectives[0], objectives[1] + 1))
    levels = int(rng.integers(2, 12))  # few levels: many ties in every objective
    cost = rng.integers(0, levels, size=(n, k)).astype(float)
    group = rng.integers(0, int(rng.integers(1, 6)), size=n)
    got = prune(cost, group)
    assert sorted(got.tolist()) == _definition(cost, group)
    # ordered by (group, c0, c1, ...)
    keys = [(group[i], *cost[i]) for i in got]
    assert keys == sorted(keys)


def _three_objectives(rng, n):
    t = rng.random(n)
    cost = np.stack([t, rng.random(n) * (2 - t), np.round(rng.random(n) * 40) / 40], axis=1)
    cost[rng.random(n) < 0.02, 1] = np.inf  # infeasible rows are never kept
    return cost, rng.integers(0, 7, size=n)


def _pipeline_states(rng, n):
    """The pipeline DP's shape: (max t, sum t, max d, max w), anti-correlated, with ties and groups."""
    t = rng.random(n)
    cost = np.stack([t, rng.random(n) * (2 - t) + t, np.round(rng.random(n) * 8) / 8,
                     rng.random(n) * (2 - t)], axis=1)
    cost[rng.random(n) < 0.02, 3] = np.inf
    return cost, rng.integers(0, 5, size=n)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("flag, sets, least_kept", [("COMPILED_PRUNE3", _three_objectives, 10),
                                                     ("COMPILED_PRUNE_SCAN", _pipeline_states, 50)])
def test_pareto_select_compiled_equals_the_pairwise_prune(flag, sets, least_kept, seed, monkeypatch):
    cost, group = sets(np.random.default_rng(100 + seed), 6000)
    fast = pareto.pareto_select(cost, group)
    monkeypatch.setattr(pareto, flag, False)
    slow = pareto.pareto_select(cost, group)
    assert fast.tolist() == slow.tolist()
    assert np.isfinite(cost[fast]).all() and len(fast) > least_kept
