"""The benchmark's core runs end to end on a tiny graph."""

from __future__ import annotations

from test_reuse_progress import load_bench


def test_quick_benchmark_core_on_a_tiny_graph():
    bench = load_bench()
    G = bench.transformer_graph(2, 3, seed=0)
    row = bench.run_case("tiny", G, 3, baselines=True, ilp=True, eps=True, noreuse=True, budget_s=0.3)
    assert row.points > 0 and row.eps_points is not None and 0 < row.eps_points <= row.points
    assert row.ilp_ok == "yes"
    assert 0 < row.nsga_hv <= 1 + 1e-12 and 0 < row.mcmc_hv <= 1 + 1e-12
    table = bench.format_table([row])
    assert "| tiny |" in table and "FT exact" in table
