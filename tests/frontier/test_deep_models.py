"""Deep models of identical residual blocks: block interiors are reduced before the sweep, and
large eliminations alone may be boxed with a bound that still holds (issue 18)."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from frontier_graphs import cost_graphs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_solve_vs_brute import _check_against_brute_force

import frontier
import frontier.reductions as reductions
from frontier.reference import brute_force


def residual_model(blocks: int, configs: int, seed: int = 0) -> nx.DiGraph:
    """A Llama-like chain: per block ``x -> norm -> (gate, up) -> mul -> down -> x'`` and the
    residual skip ``x -> x'``; every block has the same cost tables (drawn once)."""
    rng = np.random.default_rng(seed)
    inner = ["norm", "gate", "up", "mul", "down"]
    wiring = [("x", "norm"), ("norm", "gate"), ("norm", "up"), ("gate", "mul"), ("up", "mul"),
              ("mul", "down"), ("down", "y"), ("x", "y")]
    node_cost = {n: rng.uniform(0.0, 4.0, (configs, 2)) for n in ["x", *inner]}
    edge_cost = {e: rng.uniform(0.0, 2.0, (configs, configs, 2)) * (rng.random((configs, configs, 1)) < 0.6)
                 for e in wiring}
    G = nx.DiGraph()
    G.add_node("x0", cost=node_cost["x"])
    for b in range(blocks):
        name = {"x": f"x{b}", "y": f"x{b + 1}", **{n: f"{n}{b}" for n in inner}}
        for n in inner:
            G.add_node(name[n], cost=node_cost[n])
        G.add_node(name["y"], cost=node_cost["x"])
        for u, v in wiring:
            G.add_edge(name[u], name[v], cost=edge_cost[(u, v)])
    return G


def test_a_small_residual_model_matches_brute_force():
    _check_against_brute_force(residual_model(2, 2, seed=1))


def test_block_interiors_go_before_the_sweep(monkeypatch):
    """With a local limit below the block interior's cost, the old order swept through every
    unreduced block (a two-variable table per block); the interior now goes first, once, and the
    frontier is the same."""
    G = residual_model(8, 4, seed=2)
    monkeypatch.setattr(reductions, "LOCAL_LIMIT", 50)
    new = frontier.SolveReport()
    got = frontier.solve(G, report=new)
    monkeypatch.setattr(reductions, "LOCAL_MAX", 50)  # the order before: the sweep first
    old = frontier.SolveReport()
    want = frontier.solve(G, report=old)
    assert len(got) == len(want)  # the same frontier (sums in another order: last-bit differences)
    np.testing.assert_allclose([p.cost for p in got], [p.cost for p in want], rtol=1e-12)
    assert new.stats.candidates < old.stats.candidates
    assert new.stats.kept_bytes < old.stats.kept_bytes


def test_boxing_only_large_eliminations_keeps_the_small_ones_exact():
    G = residual_model(10, 4, seed=3)
    exact = frontier.solve(G)
    everywhere, large = frontier.SolveReport(), frontier.SolveReport()
    frontier.solve(G, step_epsilon=0.01, report=everywhere)
    # a threshold above every elimination: nothing boxed, the exact frontier
    none = frontier.SolveReport()
    same = frontier.solve(G, step_epsilon=0.01, box_min_candidates=1e12, report=none)
    assert none.box_depth == 0 and none.bound == 0.0
    assert len(same) == len(exact)
    np.testing.assert_allclose([p.cost for p in same], [p.cost for p in exact], rtol=1e-12)
    # a threshold in between: fewer boxing steps on the deepest path than boxing everywhere
    approx = frontier.solve(G, step_epsilon=0.01, box_min_candidates=200, report=large)
    assert 0 < large.box_depth < everywhere.box_depth
    got = np.array([p.cost for p in approx])
    for p in exact:
        assert ((got <= p.cost * (1 + large.bound) + 1e-9).all(axis=1)).any()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cost_graphs(), st.sampled_from([0.05, 0.3]), st.sampled_from([0, 4, 20]))
def test_the_tracked_bound_holds_with_a_candidate_threshold(G, step, threshold):
    report = frontier.SolveReport()
    approx = frontier.solve(G, step_epsilon=step, box_min_candidates=threshold, report=report)
    exact = brute_force(G)
    assert report.bound == pytest.approx((1 + step) ** report.box_depth - 1)
    assert (len(approx) == 0) == (len(exact) == 0)
    k = next(iter(G.nodes.values()))["cost"].shape[1]
    got = np.array([p.cost for p in approx]).reshape(len(approx), k)
    for p in exact:
        assert ((got <= p.cost * (1 + report.bound) + 1e-9).all(axis=1)).any()


def test_identical_layers_are_composed_by_doubling_with_a_bounded_solve():
    """With step_epsilon, a chain of identical layers is composed level by level (memoised): the
    boxing depth, and with it the bound, grows by about one per doubling of the layers (a sweep
    would add one per layer on each side)."""
    depth = {}
    for blocks in (8, 32):
        report = frontier.SolveReport()
        frontier.solve(residual_model(blocks, 4, seed=3), step_epsilon=0.01, report=report)
        depth[blocks] = report.box_depth
        assert report.stats.reused > blocks  # the layers' compositions come from the memo
    assert depth[32] - depth[8] <= 3
