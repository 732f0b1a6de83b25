"""Identical blocks are reduced once and reused; progress is reported; order of reductions."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path

import networkx as nx
import numpy as np
from frontier_graphs import build_graph
from test_solve_vs_brute import _check_against_brute_force, _recomputed

import frontier

_BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "frontier_bench.py"


def load_bench():
    """The benchmark module (not a package), loaded from its path."""
    if "frontier_bench" in sys.modules:
        return sys.modules["frontier_bench"]
    spec = importlib.util.spec_from_file_location("frontier_bench", _BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["frontier_bench"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_repeated_blocks_are_reused_and_give_the_same_frontier():
    G = load_bench().transformer_graph(6, 5, seed=3)
    reused, fresh = frontier.SolveReport(), frontier.SolveReport()
    with_memo = frontier.solve(G, report=reused)
    without = frontier.solve(G, reuse=False, report=fresh)
    assert reused.stats.reused > 0 and fresh.stats.reused == 0
    assert reused.stats.candidates < fresh.stats.candidates
    assert [p.cost.tolist() for p in with_memo] == [p.cost.tolist() for p in without]
    for p in with_memo[:: max(1, len(with_memo) // 10)]:
        assert set(p.assignment) == set(G.nodes)
        np.testing.assert_allclose(_recomputed(G, p.assignment), p.cost, rtol=1e-9)


def test_small_transformer_matches_brute_force():
    G = load_bench().transformer_graph(1, 2, seed=1)
    _check_against_brute_force(G)


def test_progress_counts_every_node_once():
    G = build_graph(7, "random", 7, 3, 2)
    calls = []
    frontier.solve(G, progress=lambda done, total: calls.append((done, total)))
    assert calls[0] == (0, 7) and calls[-1] == (7, 7)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert all(t == 7 for _, t in calls)


def test_dense_graph_uses_general_elimination_fallback():
    G = nx.DiGraph()
    rng = np.random.default_rng(0)
    for v in range(5):
        G.add_node(v, cost=rng.integers(0, 5, (3, 2)).astype(float))
    for u, v in itertools.combinations(range(5), 2):  # K5: every node has four neighbours
        G.add_edge(u, v, cost=rng.integers(0, 5, (3, 3, 2)).astype(float))
    report = frontier.SolveReport()
    frontier.solve(G, report=report)
    assert report.reductions.get("general elimination", 0) > 0
    _check_against_brute_force(G)


def test_each_reduction_is_exercised():
    seen = {}
    for family in ("chain", "series_parallel", "random", "disconnected", "dense"):
        for seed in range(10):
            report = frontier.SolveReport()
            frontier.solve(build_graph(seed, family, 7, 3, 2), report=report)
            for name, count in report.reductions.items():
                seen[name] = seen.get(name, 0) + count
    for name in ("edge elimination", "node elimination", "merge/contract", "triangle", "general elimination",
                 "final"):
        assert seen.get(name, 0) > 0, (name, seen)
