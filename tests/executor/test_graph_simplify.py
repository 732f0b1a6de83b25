"""Simplifying passes over the replayed program (tensoropt.executor.program.graph_simplify), on small
traced steps.

Each pass must leave every value the program computes as it was: here each rule is checked on its
own, with the cases it must leave alone; the 2-process replay-vs-interpreter parity tests
(tests/executor/test_replay.py) and the HF jobs' parity with one process (tests/hf) run both passes
on real plans.
"""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from tensoropt.executor.program.graph_simplify import (
    MAX_FOLDED_BYTES,
    drop_aliases,
    drop_unread,
    fold_constants,
    simplify,
)

aten = torch.ops.aten
C10D = torch.ops._c10d_functional


def _targets(gm: fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def _attention_step(q: torch.Tensor, w: torch.Tensor):
    """A causal attention layer's forward and a gradient, its mask built from ``arange`` as HF Llama's is."""
    t = q.shape[-2]
    pos = torch.arange(t)
    mask = torch.where(pos[None, :] <= pos[:, None], 0.0, float("-inf"))[None, None]
    h = q @ w
    out = F.scaled_dot_product_attention(h, h, h, attn_mask=mask)
    return out, out.sum(-1) * torch.ones(t).cumsum(0)


def test_fold_constants_computes_a_causal_mask_once_and_keeps_the_values():
    q, w = torch.randn(2, 2, 8, 4), torch.randn(4, 4)
    gm = make_fx(_attention_step)(q, w)
    before = _targets(gm)
    expected = gm(q, w)
    assert fold_constants(gm) == 2  # the mask and the cumsum'd weights
    after = _targets(gm)
    assert "aten.arange.default" in before and "aten.arange.default" not in after
    assert "aten.where.self" not in after and "aten.cumsum.default" not in after
    assert len(after) < len(before) - 4
    q2, w2 = torch.randn(2, 2, 8, 4), torch.randn(4, 4)  # other inputs: the folded values still hold
    for got, want in zip(gm(q2, w2), make_fx(_attention_step)(q2, w2)(q2, w2)):
        assert torch.equal(got, want)
    for got, want in zip(gm(q, w), expected):
        assert torch.equal(got, want)


def test_fold_constants_leaves_random_undefined_written_and_returned_values():
    def step(x):
        noise = torch.rand(3)  # a new draw every step
        buf = torch.empty(3)  # no defined value
        acc = torch.zeros(3)
        acc.add_(x)  # written in place every step: folding it would accumulate across steps
        ones = torch.ones(3)  # returned: the caller may write it
        return x + noise + buf.fill_(1.0), acc, ones

    gm = make_fx(step)(torch.ones(3))
    assert fold_constants(gm) == 0
    assert {"aten.rand.default", "aten.empty.memory_format", "aten.zeros.default", "aten.ones.default"} \
        <= set(_targets(gm))
    first, second = gm(torch.ones(3))[1], gm(torch.ones(3))[1]
    assert torch.equal(first, second)  # the accumulator starts from zero each step


def test_fold_constants_leaves_a_constant_a_collective_reads_and_a_view_written_later():
    g = fx.Graph()
    x = g.placeholder("x")
    ones = g.call_function(aten.ones.default, ([4],), {"dtype": torch.float32})
    reduced = g.call_function(C10D.all_reduce.default, (ones, "sum", "0"))
    w = g.call_function(C10D.wait_tensor.default, (reduced,))
    zeros = g.call_function(aten.zeros.default, ([4],), {"dtype": torch.float32})
    view = g.call_function(aten.view.default, (zeros, [2, 2]))
    written = g.call_function(aten.add_.Tensor, (view, 1.0))  # writes `zeros` through its view
    g.output((g.call_function(aten.add.Tensor, (x, w)), written))
    gm = fx.GraphModule(torch.nn.Module(), g)
    assert fold_constants(gm) == 0
    assert _targets(gm).count("aten.ones.default") == 1 and "aten.zeros.default" in _targets(gm)


def test_fold_constants_keeps_at_most_max_bytes():
    n = MAX_FOLDED_BYTES // 4 + 1  # one float32 more than the budget
    gm = make_fx(lambda x: x + torch.arange(n, dtype=torch.float32).sin())(torch.zeros(n))
    assert fold_constants(gm) == 0 and "aten.sin.default" in _targets(gm)
    gm = make_fx(lambda x: x + torch.arange(n, dtype=torch.float32).sin())(torch.zeros(n))
    assert fold_constants(gm, max_bytes=4 * n) == 1
    assert torch.equal(gm(torch.zeros(n)), torch.arange(n, dtype=torch.float32).sin())
    # a small result of a large constant (a mask's sum) is not computed at trace time either
    gm = make_fx(lambda x: x + torch.arange(n, dtype=torch.float32).sin().sum())(torch.zeros(2))
    assert fold_constants(gm) == 0 and "aten.sin.default" in _targets(gm)
    assert fold_constants(gm, max_bytes=4 * n) == 1 and "aten.sin.default" not in _targets(gm)


def test_drop_aliases_keeps_storage_shape_and_strides():
    def step(x):
        y = x.t().detach()  # a transposed alias: strides must stay the transposed ones
        z = y.view(y.shape)  # same-shape view: dropped (same sizes and strides)
        return z * 2, x.view(3, 2), torch.ops.aten.alias(x)

    x = torch.arange(6.0).view(2, 3)
    gm = make_fx(step)(x)
    expected = gm(x)
    assert drop_aliases(gm) == 3  # detach, the same-shape view, alias
    assert "aten.detach.default" not in _targets(gm) and "aten.alias.default" not in _targets(gm)
    assert _targets(gm).count("aten.view.default") == 1  # the reshaping view stays
    got = gm(x)
    for a, b in zip(got, expected):
        assert torch.equal(a, b) and a.stride() == b.stride()
    assert got[2].data_ptr() == x.data_ptr()  # still the input's storage, as the alias was


def test_simplify_reports_every_pass():
    gm = make_fx(lambda x: x.detach() + torch.arange(3.0).exp())(torch.zeros(3))
    assert simplify(gm) == {"aliases": 1, "constants": 1, "unread": 0}
    assert _targets(gm) == ["aten.add.Tensor"]


def test_drop_unread_removes_unread_pure_results_and_keeps_writes_randoms_and_collectives():
    def step(x, buf):
        torch.empty_like(x, device="meta")  # what the DTensor trace leaves behind: read by nothing
        x.sin()  # unread and pure
        buf.add_(1)  # unread, but it writes a buffer
        torch.rand(2)  # unread, but it draws random numbers (the next draw depends on it)
        return x.cos()

    gm = make_fx(step)(torch.zeros(3), torch.zeros(1))
    cos = next(n for n in gm.graph.nodes if n.target is aten.cos.default)
    with gm.graph.inserting_before(cos):  # an unread collective: every rank issues it
        gm.graph.call_function(C10D.all_reduce.default, (cos.args[0], "sum", "0"))
    assert drop_unread(gm) == 2
    assert _targets(gm) == ["aten.add_.Tensor", "aten.rand.default", "_c10d_functional.all_reduce.default",
                            "aten.cos.default"]
