"""Configuration counts at P=8 on 2 nodes x 4 GPUs, derived by hand, and placements of known splits.

Mesh.for_cluster(8, devices_per_node=4) has axes (2, 2, 2) with levels (node, gpu, gpu). The node
axis goes to one of the d parallel dims or to none: d + 1 ways. The two interchangeable gpu axes
are handed out as counts c_1..c_d with sum <= 2: C(d + 2, 2) ways (stars and bars). Without
divisibility limits an operator with d parallel dims therefore has (d + 1) * C(d + 2, 2)
configurations.
"""

from __future__ import annotations

from math import comb

import pytest
import torch
from torch import nn

from tensoropt.capture import capture
from tensoropt.configspace import configurations, rules
from tensoropt.configspace.configuration import Mesh
from tensoropt.models.transformer import SelfAttention

MESH = Mesh.for_cluster(8, devices_per_node=4)


def _hand_count(d: int) -> int:
    return (d + 1) * comb(d + 2, 2)


def _configs(model, *inputs):
    g = capture(model, inputs)
    return g, configurations(g, MESH)


def test_mesh_is_two_by_four():
    assert MESH.shape == (2, 2, 2) and MESH.levels == ("node", "gpu", "gpu")


def test_linear_3d_has_batch_seq_out_in():
    _, cs = _configs(nn.Linear(16, 16), torch.randn(8, 8, 16))
    # d = 4 (batch, seq, out, in), every size divisible by 8: 5 * 15
    assert len(cs["linear"]) == _hand_count(4) == 75


def test_linear_with_small_batch_drops_indivisible_splits():
    _, cs = _configs(nn.Linear(16, 16), torch.randn(2, 8, 16))
    # batch = 2 allows degree 2 only. Excluded: batch holds the node axis and >= 1 gpu axis
    # (gpu counts with c_batch = 1 and the other three sum <= 1: 4 ways; c_batch = 2: 1 way) -> 5;
    # batch holds both gpu axes but not the node axis (node axis: none or one of 3 others) -> 4.
    assert len(cs["linear"]) == 75 - 5 - 4 == 66
    assert all("batch=4" not in c.label and "batch=8" not in c.label for c in cs["linear"])


def test_conv2d_batch_and_channel_splits():
    _, cs = _configs(nn.Conv2d(8, 16, 3, padding=1), torch.randn(8, 8, 6, 6))
    assert len(cs["conv2d"]) == _hand_count(3) == 40  # batch, out, in


def test_conv2d_batch_only_when_channel_splits_disabled(monkeypatch):
    monkeypatch.setattr(rules, "CONV_CHANNEL_SPLITS_ENABLED", set())
    _, cs = _configs(nn.Conv2d(8, 16, 3, padding=1), torch.randn(8, 8, 6, 6))
    assert len(cs["conv2d"]) == 2 * 3  # node axis or not; 0, 1 or 2 gpu axes
    assert {c.label for c in cs["conv2d"]} == {
        "replicate",
        "batch=2",
        "batch=4",
        "batch=2[nodes=2]",
        "batch=4[nodes=2]",
        "batch=8[nodes=2]",
    }


def test_grouped_conv_splits_batch_only():
    _, cs = _configs(nn.Conv2d(8, 16, 3, groups=2), torch.randn(8, 8, 6, 6))
    assert len(cs["conv2d"]) == 6


def test_attention_batch_and_heads():
    g, cs = _configs(SelfAttention(64, 8, max_seq=16, causal=True), torch.randn(8, 16, 64))
    (sdpa,) = [n for n in g.nx.nodes if g.nx.nodes[n]["kind"] == "sdpa"]
    assert len(cs[sdpa]) == _hand_count(2) == 18


def test_attention_score_matmul_has_five_dims():
    class Scores(nn.Module):
        def forward(self, q, k):
            return q @ k.transpose(-2, -1)

    g, cs = _configs(Scores(), torch.randn(8, 8, 16, 8), torch.randn(8, 8, 16, 8))
    # batch, heads, seq (query rows), out (key columns), in (head dim, a reduction)
    assert len(cs["matmul"]) == _hand_count(5) == 126


def test_linear_placements_of_known_labels():
    _, cs = _configs(nn.Linear(16, 32), torch.randn(8, 16))
    by_label = {c.label: c for c in cs["linear"]}
    c = by_label["batch=2[nodes=2],out=4"]
    assert c.splits == (("batch", (0,)), ("out", (1, 2)))
    assert c.inputs == (("S(0)", "R", "R"),)
    assert dict(c.params) == {"weight": ("R", "S(0)", "S(0)"), "bias": ("R", "S(0)", "S(0)")}
    assert c.output == ("S(0)", "S(1)", "S(1)")
    assert c.partial_axes == ()
    assert dict(c.grad_sync_axes) == {"weight": (0,), "bias": (0,)}
    c = by_label["in=2"]
    assert c.inputs == (("R", "S(1)", "R"),)
    assert dict(c.params) == {"weight": ("R", "S(1)", "R"), "bias": ("R", "R", "R")}
    assert c.output == ("R", "R", "R") and c.partial_axes == (1,) and c.grad_sync_axes == ()


@pytest.mark.parametrize("p", [2, 4, 8, 16, 64])
def test_single_level_mesh_counts(p):
    mesh = Mesh.for_cluster(p, devices_per_node=p)
    g = capture(nn.Linear(64, 64), (torch.randn(64, 64),))
    n = len(mesh.shape)
    # 3 dims (batch, out, in) share n interchangeable axes: C(n + 3, 3)
    assert len(configurations(g, mesh)["linear"]) == comb(n + 3, 3)


def test_limits_for_large_meshes():
    g = capture(nn.Linear(16, 16), (torch.randn(8, 8, 16),))
    # whole levels: the node axis and the gpu pair each go to one of 4 dims or none: 5 * 5
    assert len(configurations(g, MESH, whole_levels=True)["linear"]) == 25
    # one split dim at most: replicate, or one of 4 dims with (node axis or not) x (0-2 gpu axes) - 1
    assert len(configurations(g, MESH, max_split_dims=1)["linear"]) == 1 + 4 * (2 * 3 - 1)
    big = Mesh.for_cluster(1024, devices_per_node=8)
    g = capture(nn.Linear(1024, 1024), (torch.randn(1024, 1024),))
    assert len(configurations(g, big, whole_levels=True)["linear"]) == 4 * 4  # (batch, out, in, none)^2
