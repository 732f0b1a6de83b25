"""Dim maps of folded views: a shard of a mapped dim really is a shard of the dim it maps to."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tensoropt.capture import capture, operand_roles
from tensoropt.capture.export import export_program
from tensoropt.capture.views import compose, reshape_map, view_dim_map


def _shard_passes(x: torch.Tensor, y: torch.Tensor, i: int, j: int, k: int) -> bool:
    """Does chunking x along i into k pieces, then applying the view, equal chunking y along j?"""
    xs = x.chunk(k, dim=i)
    ys = y.chunk(k, dim=j)
    local_shape = list(y.shape)
    local_shape[j] //= k
    return all(torch.equal(a.reshape(local_shape), b) for a, b in zip(xs, ys))


@pytest.mark.parametrize(
    ("in_shape", "out_shape", "expected"),
    [
        ((2, 3, 4, 5), (2, 60), [0, 1, None, None]),
        ((2, 8, 32), (2, 8, 4, 8), [0, 1, 2]),
        ((2, 8, 4, 8), (2, 8, 32), [0, 1, 2, None]),
        ((4, 6), (4, 1, 6), [0, 2]),
        ((4, 1, 6), (4, 6), [0, None, 1]),
        ((6, 4), (4, 6), [0, None]),
        ((2, 8, 50), (16, 50), [0, None, 1]),
    ],
)
def test_reshape_map_cases(in_shape, out_shape, expected):
    assert reshape_map(in_shape, out_shape) == expected


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 3, 4, 6]), min_size=1, max_size=4), st.randoms(use_true_random=False))
def test_reshape_map_shards_pass_through(dims, rnd):
    # merge or split random adjacent groups and check every mapped dim with every divisor degree
    in_shape = tuple(dims)
    out_shape: list[int] = []
    i = 0
    while i < len(in_shape):
        span = rnd.randint(1, len(in_shape) - i)
        out_shape.append(math.prod(in_shape[i : i + span]))
        i += span
    if rnd.random() < 0.5 and out_shape[0] % 2 == 0:
        out_shape = [2, out_shape[0] // 2, *out_shape[1:]]
    x = torch.arange(math.prod(in_shape)).reshape(in_shape)
    y = x.reshape(out_shape)
    for i, j in enumerate(reshape_map(in_shape, tuple(out_shape))):
        if j is None:
            continue
        for k in range(2, in_shape[i] + 1):
            if in_shape[i] % k == 0 and out_shape[j] % k == 0:
                assert _shard_passes(x, y, i, j, k), (in_shape, out_shape, i, j, k)


def test_permute_select_slice_split_maps():
    assert view_dim_map("aten.permute.default", (None, [0, 2, 3, 1]), (2, 3, 4, 5), (2, 4, 5, 3)) == [
        0,
        3,
        1,
        2,
    ]
    assert view_dim_map("aten.select.int", (None, 1, 0), (2, 3, 4), (2, 4)) == [0, None, 1]
    assert view_dim_map("aten.slice.Tensor", (None, 2, 1, 4), (2, 3, 8), (2, 3, 3)) == [0, 1, None]
    assert view_dim_map("aten.slice.Tensor", (None, 2, 0, 99), (2, 3, 8), (2, 3, 8)) == [0, 1, 2]
    assert view_dim_map("aten.split.Tensor", (None, 4, 2), (2, 3, 12), (2, 3, 4)) == [0, 1, None]
    assert view_dim_map("aten.expand.default", (None, [5, 2, 3]), (2, 3), (5, 2, 3)) == [1, 2]
    assert view_dim_map("aten.t.default", (None,), (2, 3), (3, 2)) == [1, 0]
    assert compose([0, 2, 1], [1, 0, None]) == [1, None, 0]


def test_chunk_unbind_feed_several_operands():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 12)

        def forward(self, x):
            a, b, c = self.fc(x).chunk(3, dim=-1)
            p, q = torch.stack([a, b]).unbind(0)
            return p * q + c

    g = capture(Net(), (torch.randn(2, 4),))
    # stack is a compute op (kind "stack"); chunk pieces flow as separate operands of it and of add
    add = [n for n in g.compute_nodes() if g.nx.nodes[n]["op"] == "aten.add.Tensor"][0]
    assert g.nx.nodes[add]["inputs"][1]["source"] == "linear"
    assert g.nx.nodes[add]["inputs"][1]["views"] == ["aten.chunk.default", "operator.getitem"]
    mul = [n for n in g.compute_nodes() if g.nx.nodes[n]["op"] == "aten.mul.Tensor"][0]
    assert [e["views"][0] for e in g.nx.nodes[mul]["inputs"]] == ["aten.unbind.int"] * 2
    assert [e["dim_map"] for e in g.nx.nodes[mul]["inputs"]] == [[None, 0, 1]] * 2


def test_operand_roles_mark_static_operands_as_buffers():
    from tensoropt.models import build_model, example_inputs

    model, spec = build_model("gpt", layers=1, width=16, heads=2, seq_len=8, vocab_size=32)
    inputs = example_inputs(spec, 2)
    roles = operand_roles(export_program(model, inputs))
    g = capture(model, inputs)
    for node, r in roles.items():
        assert r == [o["role"] for o in g.nx.nodes[node]["operands"]]
        assert r.count("input") == len(g.nx.nodes[node]["inputs"])
    sdpa = [n for n in roles if g.nx.nodes[n]["kind"] == "sdpa"][0]
    assert roles[sdpa] == ["input", "input", "input", "buffer"]  # q, k, v, causal mask
    pos = [n for n in roles if g.nx.nodes[n]["kind"] == "embedding" and g.nx.nodes[n]["module"] == "wpe"][0]
    assert roles[pos] == ["param", "buffer"]  # the position table and arange
