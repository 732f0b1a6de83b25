"""benchmarks/reproduce.py end to end on one small case: FT is never beaten by a baseline of its own space."""

from __future__ import annotations

import pytest
from reproduce import Case, plot, run_case, tables


@pytest.fixture(scope="module")
def case() -> Case:
    return run_case("alexnet", "h100x8", 8, mcmc_s=0.5, log=lambda s: None)


def test_ft_is_at_least_as_fast_as_every_baseline(case):
    ft_time, ft_memory = case.chosen["ft"]
    assert ft_memory <= case.budget_bytes
    for name in ("dp", "megatron", "mcmc"):
        time_s, memory = case.chosen[name]
        assert memory <= case.budget_bytes
        assert ft_time <= time_s * (1 + 1e-9), f"{name} {time_s} beats FT {ft_time}"
        assert case.speedup(name) >= 1 - 1e-9
        assert 0 <= case.memory_saved(name) < 1


def test_ft_frontier_reaches_below_data_parallel_memory(case):
    # Every strategy's frontier is made of real plans; DP's single plan replicates all weights,
    # so it needs more memory than FT's leanest plan.
    assert len(case.points["dp"]) >= 1
    assert min(m for _, m in case.points["ft"]) < min(m for _, m in case.points["dp"])


def test_tables_and_plot(case, tmp_path):
    text = tables([case])
    assert "| alexnet | h100x8 | 8 | 256 |" in text
    assert "fc:" in text
    (png,) = plot([case], tmp_path)
    assert png.name == "reproduce_alexnet.png" and png.stat().st_size > 10_000
