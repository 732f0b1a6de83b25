"""A solve whose tables outgrow the memory limit stops with a clear error instead of being killed."""

from __future__ import annotations

import numpy as np
import pytest
from test_reuse_progress import load_bench

import frontier
from frontier.memory_limit import ENV, SolverMemoryError, default_limit_bytes


def _graph():
    return load_bench().transformer_graph(2, 8)


def test_a_solve_past_its_limit_raises_and_says_what_to_change():
    report = frontier.SolveReport()
    points = frontier.solve(_graph(), report=report)
    kept = report.stats.kept_bytes
    assert points and kept > 0
    with pytest.raises(SolverMemoryError, match=f"past the solver limit.*epsilon.*{ENV}"):
        frontier.solve(_graph(), memory_limit_bytes=kept / 2)
    again = frontier.solve(_graph(), memory_limit_bytes=kept * 2)  # enough: the same frontier
    assert np.array_equal(np.array([p.cost for p in again]), np.array([p.cost for p in points]))


def test_the_limit_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(ENV, "0.5")
    assert default_limit_bytes() == 0.5 * 2**30
    monkeypatch.setenv(ENV, "0")
    assert default_limit_bytes() is None
    monkeypatch.setenv(ENV, "lots")
    with pytest.raises(ValueError, match=ENV):
        default_limit_bytes()
    monkeypatch.setenv(ENV, "1e-6")  # about 1 KiB: the solve stops
    with pytest.raises(SolverMemoryError):
        frontier.solve(_graph())
