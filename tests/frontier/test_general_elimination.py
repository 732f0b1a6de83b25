"""Graphs no series/parallel reduction applies to, as real models make them: the general fallback
stays small and exact.

* Weight-tied layers (ALBERT: every operator of layer 2 reads its twin's weights in layer 1, so
  the cost graph has a tie edge per twin pair): a ladder. A topological cut carried every tied
  operator of layer 1 through layer 2 (the tiny ALBERT at 2 devices: 155 M candidates, 9 minutes).
* A selective scan exported step by step (Mamba): each step's output edged to one ``stack`` with a
  single configuration, and hubs (the projected B, C, the discretised A) read by every step.
"""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from test_solve_vs_brute import _check_against_brute_force

import frontier
from frontier.driver import GENERAL_MAX_CANDIDATES


def ladder_graph(rungs: int, configs: int, seed: int = 0) -> nx.DiGraph:
    """Two chains ``a0 -> ... -> a{n-1} -> b0 -> ... -> b{n-1}`` with a tie edge ``ai -> bi``
    (integer costs, two objectives; free on the diagonal of every edge, like a layout match)."""
    rng = np.random.default_rng(seed)
    g = nx.DiGraph()
    names = [f"a{i}" for i in range(rungs)] + [f"b{i}" for i in range(rungs)]
    for n in names:
        g.add_node(n, cost=rng.integers(0, 9, (configs, 2)).astype(float))

    def edge(u, v):
        c = rng.integers(0, 5, (configs, configs, 2)).astype(float)
        c[np.arange(configs), np.arange(configs)] = 0.0
        g.add_edge(u, v, cost=c)

    for u, v in zip(names, names[1:]):
        edge(u, v)
    for i in range(rungs):
        edge(f"a{i}", f"b{i}")
    return g


def scan_graph(steps: int, configs: int, seed: int = 0) -> nx.DiGraph:
    """A scan: hub ``h`` read by every step ``s_i``; a state chain ``x0 -> x1 -> ...`` with
    ``x_i -> s_i``; every ``s_i`` edged to ``stack``, which has one configuration."""
    rng = np.random.default_rng(seed)
    g = nx.DiGraph()

    def node(n, c=configs):
        g.add_node(n, cost=rng.integers(0, 9, (c, 2)).astype(float))

    def edge(u, v):
        cu, cv = len(g.nodes[u]["cost"]), len(g.nodes[v]["cost"])
        g.add_edge(u, v, cost=rng.integers(0, 5, (cu, cv, 2)).astype(float))

    node("h")
    for i in range(steps):
        node(f"x{i}")
        node(f"s{i}")
    node("stack", 1)
    for i in range(steps):
        if i:
            edge(f"x{i - 1}", f"x{i}")
        edge("h", f"s{i}")
        edge(f"x{i}", f"s{i}")
        edge(f"s{i}", "stack")
    return g


@pytest.mark.parametrize("seed", range(3))
def test_tied_ladder_matches_brute_force(seed):
    _check_against_brute_force(ladder_graph(4, 3, seed))


@pytest.mark.parametrize("seed", range(3))
def test_scan_into_one_configuration_node_matches_brute_force(seed):
    _check_against_brute_force(scan_graph(4, 3, seed))


@pytest.mark.timeout(120)
def test_tied_ladder_work_grows_with_its_width_not_its_length():
    """12 rungs of 5 configurations: a topological cut reaches 5^12 joint configurations; the
    cheapest-first order joins at most a few variables."""
    report = frontier.SolveReport()
    points = frontier.solve(ladder_graph(12, 5), report=report)
    assert points and report.reductions.get("general elimination", 0) > 0
    assert report.stats.candidates < 2_000_000, report.stats


@pytest.mark.timeout(120)
def test_scan_of_32_steps_stays_small():
    report = frontier.SolveReport()
    points = frontier.solve(scan_graph(32, 4), report=report)
    assert points
    assert report.stats.candidates < 2_000_000, report.stats


@pytest.mark.timeout(60)
def test_inseparable_graph_stops_at_once_naming_a_node():
    """Every pair of 14 nodes of 6 configurations shares an edge: any elimination joins 6^14
    configurations. The solve refuses before computing anything, naming the node and the way out."""
    g = nx.DiGraph()
    rng = np.random.default_rng(0)
    for i in range(14):
        g.add_node(f"op{i}", cost=rng.random((6, 2)))
    for i in range(14):
        for j in range(i + 1, 14):
            g.add_edge(f"op{i}", f"op{j}", cost=rng.random((6, 6, 2)))
    report = frontier.SolveReport()
    with pytest.raises(frontier.SolverMemoryError, match=r"node 'op\d+' cannot be separated .*"
                       r"fewer configurations per operator") as err:
        frontier.solve(g, report=report)
    assert f"{GENERAL_MAX_CANDIDATES:.0e}" in str(err.value)
