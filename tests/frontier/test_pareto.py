"""Pareto pruning against a quadratic reference, and the epsilon-box property."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import frontier.pareto as pareto
from frontier.pareto import box_representatives, pareto_select


def _reference(cost, group):
    """Set of (group, cost) that no other feasible row of the group dominates."""
    keep = set()
    for i in range(len(cost)):
        if not np.isfinite(cost[i]).all():
            continue
        same = (group == group[i]) & np.isfinite(cost).all(axis=1)
        dominated = same & (cost <= cost[i]).all(axis=1) & (cost < cost[i]).any(axis=1)
        if not dominated.any():
            keep.add((int(group[i]),) + tuple(cost[i]))
    return keep


@st.composite
def grouped_sets(draw):
    k = draw(st.integers(1, 4))
    n = draw(st.integers(0, 60))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    cost = rng.integers(0, draw(st.sampled_from([3, 8, 1000])), (n, k)).astype(float)
    if n and draw(st.booleans()):
        cost[rng.random(n) < 0.2, rng.integers(k)] = np.inf
    group = rng.integers(0, draw(st.integers(1, 4)), n)
    return cost, group


@settings(max_examples=300, deadline=None)
@given(grouped_sets())
def test_prune_matches_quadratic_reference(data):
    cost, group = data
    idx = pareto_select(cost, group)
    got = [(int(group[i]),) + tuple(cost[i]) for i in idx]
    assert len(got) == len(set(got)), "one row per distinct vector"
    assert set(got) == _reference(cost, group)
    assert got == sorted(got), "ordered by group, then objective 0, 1, ..."


@pytest.mark.parametrize("k", [2, 3])
def test_large_sets_with_prefilter_agree(monkeypatch, k):
    rng = np.random.default_rng(k)
    cost = rng.integers(0, 200, (6000, k)).astype(float)
    group = np.sort(rng.integers(0, 5, 6000))
    fast = pareto_select(cost, group)
    monkeypatch.setattr(pareto, "_PREFILTER_MIN", 10**12)
    slow = pareto_select(cost, group)
    assert sorted(map(tuple, np.c_[group[fast], cost[fast]])) == sorted(
        map(tuple, np.c_[group[slow], cost[slow]])
    )


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([0.01, 0.1, 0.5]))
def test_box_representatives_cover_every_row(seed, eps):
    rng = np.random.default_rng(seed)
    cost = rng.random((200, 2)) * 10 ** rng.integers(0, 3, (200, 2))
    cost[rng.random(200) < 0.1, 0] = 0.0
    group = rng.integers(0, 3, 200)
    reps = box_representatives(cost, group, eps)
    for i in range(len(cost)):
        same = reps[group[reps] == group[i]]
        assert ((cost[same] <= cost[i] * (1 + eps)).all(axis=1)).any()
