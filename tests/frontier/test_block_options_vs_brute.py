"""FT against brute force on graphs shaped like the block options' (issue 26): every operator of a
block has (split x option) configurations, edges inside a block are ``+inf`` between different
options (block-diagonal tables), two identical blocks (their interior eliminations reused), a
residual edge across each block. This is the path the kernel's shortcuts take (one-point groups
shifted instead of merged, joint configurations where a table has no row skipped) and the
dominance filter's (rows compared per pattern of infinite columns)."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

import frontier
from frontier import combine as combine_module
from frontier.reference import brute_force

SPLITS, OPTIONS = 2, 3


def _block_graph(seed: int, integer: bool, alike: bool = False) -> nx.DiGraph:
    """pre -> [a0 -> b0 -> c0] -> [a1 -> b1 -> c1] -> post, residual pre -> c0 and c0 -> c1; the
    blocks' nodes have SPLITS x OPTIONS configurations, both blocks the same costs. ``alike``: ``c`` (the
    block's last ``add``) costs the same under options 1 and 2 and leaves the block alike under them (as
    ``block_recompute`` and ``block_selective`` of an ``add``), on a grid of 1/16 (exact sums: equal plans
    reached by two paths tie exactly)."""
    rng = np.random.default_rng(seed)
    draw = (lambda *shape: rng.integers(0, 4, size=shape).astype(float)) if integer else \
        (lambda *shape: rng.integers(0, 64, size=shape) / 16) if alike else (lambda *shape: rng.random(shape))
    n = SPLITS * OPTIONS
    option = np.repeat(np.arange(OPTIONS), SPLITS)
    inner = option[:, None] != option[None, :]
    G = nx.DiGraph()
    G.add_node("pre", cost=draw(SPLITS, 2))
    G.add_node("post", cost=draw(SPLITS, 2))
    node_costs = {name: draw(n, 2) for name in "abc"}
    edge_costs = {pair: draw(n, n, 2) for pair in ("ab", "bc")}
    entry, cross, exit_ = draw(SPLITS, n, 2), draw(n, n, 2), draw(n, SPLITS, 2)
    if alike or rng.random() < 0.5:  # a node whose options cost the same (an add under both block options)
        node_costs["c"][SPLITS:2 * SPLITS] = node_costs["c"][2 * SPLITS:]
    if alike:
        cross[2 * SPLITS:] = cross[SPLITS:2 * SPLITS]
        exit_[2 * SPLITS:] = exit_[SPLITS:2 * SPLITS]
    for i in range(2):
        for name in "abc":
            G.add_node(f"{name}{i}", cost=node_costs[name])
        for u, v in ("ab", "bc"):
            G.add_edge(f"{u}{i}", f"{v}{i}", cost=np.where(inner[..., None], np.inf, edge_costs[u + v]))
    G.add_edge("pre", "a0", cost=entry)
    G.add_edge("pre", "c0", cost=entry)
    G.add_edge("c0", "a1", cost=cross)
    G.add_edge("c0", "c1", cost=cross)
    G.add_edge("c1", "post", cost=exit_)
    return G


@pytest.mark.parametrize("seed", range(12))
def test_block_option_graphs_match_brute_force(seed):
    G = _block_graph(seed, integer=seed % 2 == 0)
    got, want = frontier.solve(G), brute_force(G)
    got_c = np.array([p.cost for p in got])
    want_c = np.array([p.cost for p in want])
    assert got_c.shape == want_c.shape, (got_c, want_c)
    np.testing.assert_allclose(got_c, want_c, rtol=1e-9, atol=1e-12)
    for p in got:  # a real plan: one option per block
        for i in range(2):
            options = {p.assignment[f"{name}{i}"] // SPLITS
                       for name in "abc"}
            assert len(options) == 1, p.assignment


@pytest.mark.parametrize("seed", range(8))
def test_block_graphs_whose_options_leave_the_block_alike_match_brute_force(monkeypatch, seed):
    """The options of ``c`` that leave the block alike give equal slices in every table reaching ``c`` from
    the next block: those combines compute one group of each equal pair and copy it
    (:mod:`frontier.equal_slices`, here in every combine however small)."""
    monkeypatch.setattr(combine_module, "COPIES_MIN_CANDIDATES", 0)
    G = _block_graph(seed, integer=seed % 2 == 0, alike=True)
    report = frontier.SolveReport()
    got, want = frontier.solve(G, report=report), brute_force(G)
    assert report.stats.copied > 0  # the path under test ran
    got_c, want_c = np.array([p.cost for p in got]), np.array([p.cost for p in want])
    assert got_c.shape == want_c.shape, (got_c, want_c)
    np.testing.assert_allclose(got_c, want_c, rtol=1e-9, atol=1e-12)
    for p in got:  # a real plan (solve checks each plan's cost against its point): one option per block
        for i in range(2):
            assert len({p.assignment[f"{name}{i}"] // SPLITS for name in "abc"}) == 1, p.assignment
