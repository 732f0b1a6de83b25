"""The recompute transient: a chain of recomputing operators rebuilds its values at once in backward.

The executor rebuilds a recomputed value from its producer's recipe and keeps each rebuilt value
until every consumer's backward has read it, so a connected chain of recomputing operators is
alive at once (estimators.breakdown.recompute_chains); the plan's peak adds the largest chain.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from estimators.breakdown import plan_breakdown
from tensoropt.capture import capture
from tensoropt.cost_graph import cost_graph


class Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.c(nn.functional.gelu(self.b(nn.functional.gelu(self.a(x)))))


@pytest.fixture(scope="module")
def cg():
    g = capture(Chain(), (torch.randn(64, 16),))
    return cost_graph(g, "cpu-local", 1, memory_options=["recompute"])


def _plan(cg, recomputed: set[str]) -> dict[str, int]:
    out = {}
    for n in cg:
        labels = cg.nodes[n]["configs"]
        out[n] = labels.index("replicate,recompute") if n in recomputed else labels.index("replicate")
    return out


def _rebuilt(cg, n: str) -> float:
    return float(cg.nodes[n]["recompute_bytes"][cg.nodes[n]["configs"].index("replicate,recompute")])


def test_rebuilt_bytes_are_the_output_and_the_new_saved_tensors(cg):
    # gelu rebuilds its output (64 x 32 floats); what its backward saves (its input) is kept
    assert _rebuilt(cg, "gelu") == 64 * 32 * 4
    assert all(cg.nodes[n]["recompute_bytes"][cg.nodes[n]["configs"].index("replicate")] == 0 for n in cg)


def test_a_connected_chain_is_one_transient_and_separate_chains_are_not_summed(cg):
    chain = {"gelu", "linear_1", "gelu_1"}
    b = plan_breakdown(cg, _plan(cg, chain))
    assert b["recompute_transient_bytes"] == pytest.approx(sum(_rebuilt(cg, n) for n in chain))
    rows = {r["node"]: r for r in b["layers"]}
    assert {rows[n]["recompute_chain_bytes"] for n in chain} == {b["recompute_transient_bytes"]}
    assert rows["linear"]["recompute_chain_bytes"] == 0
    apart = plan_breakdown(cg, _plan(cg, {"gelu", "gelu_1"}))  # linear_1 kept between them
    one = max(_rebuilt(cg, "gelu"), _rebuilt(cg, "gelu_1"))
    assert apart["recompute_transient_bytes"] == pytest.approx(one)
    plain = plan_breakdown(cg, _plan(cg, set()))
    assert plain["recompute_transient_bytes"] == 0
    # recomputing keeps less, and the peak adds the chain back
    assert b["memory_bytes"] < plain["memory_bytes"]
    assert b["peak_memory_bytes"] >= b["memory_bytes"] + b["recompute_transient_bytes"]
