"""Every combine kernel gives exactly the plain result: the compiled staircase merge (the
default for two objectives), the numpy bounded kernel and chunked expansion."""

from __future__ import annotations

from frontier_graphs import cost_graphs
from hypothesis import HealthCheck, given, settings
from test_solve_vs_brute import _check_against_brute_force

import frontier.combine as combine

SETTINGS = dict(
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)


@settings(max_examples=80, **SETTINGS)
@given(G=cost_graphs(k=2))
def test_bounded_kernel_everywhere_matches_brute_force(monkeypatch, G):
    monkeypatch.setattr(combine, "COMPILED_KERNEL", False)
    monkeypatch.setattr(combine, "BOUNDED_MIN", 0)
    _check_against_brute_force(G)


@settings(max_examples=60, **SETTINGS)
@given(G=cost_graphs())
def test_tiny_expansion_chunks_match_brute_force(monkeypatch, G):
    monkeypatch.setattr(combine, "COMPILED_KERNEL", False)
    monkeypatch.setattr(combine, "CHUNK_POINTS", 5)
    _check_against_brute_force(G)
