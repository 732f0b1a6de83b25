"""Thinning to few plans: the (1+e)-cover is a cover, is smallest, and the tracked solver bound holds."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from frontier_graphs import cost_graphs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import frontier
from frontier.cover import cover_to_count, epsilon_cover, grouped_cover
from frontier.reference import brute_force


def _staircase(rng, n):
    t = np.sort(rng.uniform(0.1, 2.0, n))
    m = np.sort(rng.uniform(1.0, 50.0, n))[::-1]
    keep = np.r_[True, (np.diff(t) > 0) & (np.diff(m) < 0)]
    return np.stack([t[keep], m[keep]], axis=1)


def _covers(cost, kept, eps):
    sub = cost[kept]
    return all(((sub <= p * (1 + eps) + 1e-12).all(axis=1)).any() for p in cost)


@pytest.mark.parametrize("seed", range(30))
def test_cover_covers_and_is_smallest(seed):
    rng = np.random.default_rng(seed)
    cost = _staircase(rng, int(rng.integers(2, 11)))
    eps = float(rng.choice([0.01, 0.05, 0.2, 1.0]))
    kept = epsilon_cover(cost, eps)
    assert kept[0] == 0 and kept[-1] == len(cost) - 1
    assert _covers(cost, kept, eps)
    # brute force: the least cover that keeps the fastest and the leanest point
    n = len(cost)
    inner = list(range(1, n - 1))
    least = next(
        2 + r
        for r in range(len(inner) + 1)
        for extra in itertools.combinations(inner, r)
        if _covers(cost, [0, *extra, n - 1], eps)
    )
    assert len(kept) <= max(least, 1 if n == 1 else 2) + 1


@pytest.mark.parametrize("seed", range(10))
def test_cover_to_count_meets_the_count_with_the_least_epsilon(seed):
    rng = np.random.default_rng(100 + seed)
    cost = _staircase(rng, 300)
    limit = int(rng.integers(3, 40))
    kept, eps = cover_to_count(cost, limit)
    assert len(kept) <= limit and _covers(cost, kept, eps)
    assert len(epsilon_cover(cost, eps * 0.98)) > limit  # a clearly smaller epsilon does not reach it


def test_cover_to_count_keeps_a_small_set_whole():
    cost = np.array([[1.0, 3.0], [2.0, 2.0]])
    kept, eps = cover_to_count(cost, 5)
    assert kept.tolist() == [0, 1] and eps == 0.0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cost_graphs(), st.sampled_from([0.01, 0.1, 0.5]))
def test_step_epsilon_bound_holds(G, step):
    """solve(step_epsilon=e) reports (1+e)^h - 1 over the boxing depth h it used; that bound holds."""
    report = frontier.SolveReport()
    approx = frontier.solve(G, step_epsilon=step, report=report)
    exact = brute_force(G)
    assert report.bound == pytest.approx((1 + step) ** report.box_depth - 1)
    assert report.box_depth <= G.number_of_nodes()
    assert (len(approx) == 0) == (len(exact) == 0)
    k = next(iter(G.nodes.values()))["cost"].shape[1]
    got = np.array([p.cost for p in approx]).reshape(len(approx), k)
    for p in exact:
        assert ((got <= p.cost * (1 + report.bound) + 1e-9).all(axis=1)).any()


def test_exact_solve_reports_no_bound():
    import networkx as nx

    G = nx.DiGraph()
    G.add_node("a", cost=np.array([[1.0, 2.0], [2.0, 1.0]]))
    report = frontier.SolveReport()
    frontier.solve(G, report=report)
    assert report.bound == 0.0 and report.box_depth == 0


@pytest.mark.parametrize("seed", range(20))
def test_grouped_cover_is_a_least_cover_of_each_group(seed):
    """The solver's boxing step: per group, a cover (every point within 1+e of a kept one of its
    group) with the least number of points (brute force)."""
    rng = np.random.default_rng(300 + seed)
    groups = [_staircase(rng, n) if n else np.zeros((0, 2)) for n in rng.integers(0, 9, 4)]
    cost = np.concatenate(groups)
    start = np.r_[0, np.cumsum([len(g) for g in groups])]
    eps = float(rng.choice([0.01, 0.05, 0.2]))
    kept = grouped_cover(cost, start, eps)
    assert (np.diff(kept) > 0).all()
    for g, part in enumerate(groups):
        mine = kept[(kept >= start[g]) & (kept < start[g + 1])] - start[g]
        assert _covers(part, mine, eps)
        least = next(r for r in range(len(part) + 1)
                     for sub in itertools.combinations(range(len(part)), r) if _covers(part, list(sub), eps))
        assert len(mine) == least
