"""Configuration counts at P=8 on 2 nodes x 4 GPUs, derived by hand, and placements of known splits.

Mesh.for_cluster(8, devices_per_node=4) has axes (2, 2, 2) with levels (node, gpu, gpu). The node
axis goes to one of the d parallel dims or to none: d + 1 ways. The two interchangeable gpu axes
are handed out as counts c_1..c_d with sum <= 2: C(d + 2, 2) ways (stars and bars). Without
divisibility limits an operator with d parallel dims therefore has (d + 1) * C(d + 2, 2)
configurations.
"""

from __future__ import annotations

import itertools
from math import comb

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tensoropt.capture import capture
from tensoropt.configspace import configurations, rules
from tensoropt.configspace.configuration import Mesh, make_label
from tensoropt.configspace.space import ParDim, enumerate_splits
from tensoropt.models.transformer import SelfAttention

MESH = Mesh.for_cluster(8, devices_per_node=4)


def _hand_count(d: int) -> int:
    return (d + 1) * comb(d + 2, 2)


def _configs(model, *inputs):
    g = capture(model, inputs)
    return g, configurations(g, MESH)


def test_mesh_is_two_by_four():
    assert MESH.shape == (2, 2, 2) and MESH.levels == ("node", "gpu", "gpu")


def test_linear_2d_has_batch_out_in():
    _, cs = _configs(nn.Linear(16, 16), torch.randn(8, 16))
    # d = 3 (batch, out, in), every size divisible by 8: 4 * 10
    assert len(cs["linear"]) == _hand_count(3) == 40


def test_linear_3d_seq_split_limits():
    _, cs = _configs(nn.Linear(16, 16), torch.randn(8, 8, 16))
    # d = 4 (batch, seq, out, in), but DTensor flattens [B, T] for the matmul, so seq takes at most
    # one axis and never goes with in. Count by the number s of axes seq takes:
    #   s = 0: node axis to none/batch/out/in (4) x gpu pair over (batch, out, in) (C(5, 3) = 10) = 40
    #   s = 1 on the node axis: gpu pair over (batch, out) only (C(4, 2) = 6)                      =  6
    #   s = 1 on a gpu axis: node axis to none/batch/out (3) x the other gpu axis to
    #         none/batch/out (3)                                                                  =  9
    assert len(cs["linear"]) == 40 + 6 + 9 == 55
    labels = [c.label for c in cs["linear"]]
    assert "batch=2,seq=2" in labels and "seq=2[nodes=2]" in labels
    assert not any("seq=4" in x or ("seq" in x and "in=" in x) for x in labels)


def test_linear_with_small_batch_drops_indivisible_splits():
    _, cs = _configs(nn.Linear(16, 16), torch.randn(2, 16))
    # batch = 2 allows degree 2 only, out of the 40 of (batch, out, in). Excluded: batch holds the
    # node axis and >= 1 gpu axis (c_batch = 1 with out + in <= 1: 3 ways; c_batch = 2: 1 way) -> 4;
    # batch holds both gpu axes but not the node axis (node axis: none, out or in) -> 3.
    assert len(cs["linear"]) == 40 - 4 - 3 == 33
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
    # batch, heads, seq (query rows), out (key columns), in (head dim, a reduction): 6 * 21 = 126,
    # but DTensor runs it as a bmm over B*H, so heads takes one axis at most. Excluded: heads on the
    # node axis and >= 1 gpu axis (c_heads = 1 with the other four summing <= 1: 5; c_heads = 2: 1)
    # and heads on both gpu axes without the node axis (node axis: none or one of 4 others: 5).
    assert len(cs["matmul"]) == _hand_count(5) - 6 - 5 == 115


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
    g = capture(nn.Linear(16, 16), (torch.randn(8, 16),))
    # whole levels: the node axis and the gpu pair each go to one of 3 dims or none: 4 * 4
    assert len(configurations(g, MESH, whole_levels=True)["linear"]) == 16
    # one split dim at most: replicate, or one of 3 dims with (node axis or not) x (0-2 gpu axes) - 1
    assert len(configurations(g, MESH, max_split_dims=1)["linear"]) == 1 + 3 * (2 * 3 - 1)
    big = Mesh.for_cluster(1024, devices_per_node=8)
    g = capture(nn.Linear(1024, 1024), (torch.randn(1024, 1024),))
    assert len(configurations(g, big, whole_levels=True)["linear"]) == 4 * 4  # (batch, out, in, none)^2


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from([1, 2, 4, 8, 16, 32, 6, 12]),
    st.sampled_from([1, 2, 4, 8]),
    st.lists(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16]), min_size=1, max_size=4),
)
def test_enumeration_matches_brute_force(p, per_node, sizes):
    """Every axis independently to one dim or none, deduplicated by interchangeable axes."""
    mesh = Mesh.for_cluster(p, devices_per_node=per_node)
    names = ["batch", "out", "in", "seq"][: len(sizes)]
    dims = [ParDim(n, s, (None,)) for n, s in zip(names, sizes)]
    seen = set()
    for choice in itertools.product(range(len(dims) + 1), repeat=len(mesh.shape)):
        degree = [1] * len(dims)
        key = []
        for axis, c in enumerate(choice):
            if c < len(dims):
                degree[c] *= mesh.shape[axis]
            key.append((mesh.levels[axis], mesh.shape[axis], c))
        if all(s % d == 0 for s, d in zip(sizes, degree)):
            seen.add(tuple(sorted(key)))
    splits = enumerate_splits(dims, mesh)
    assert len(splits) == len(seen)
    assert len({make_label(s, mesh) for s in splits}) == len(splits)
