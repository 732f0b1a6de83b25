"""Scheduling passes over the replayed program (tensoropt.executor.program.graph_passes), on small FX graphs.

The passes change where collectives and their waits run, never what the program computes: the
2-process replay-vs-interpreter parity tests (tests/executor/test_replay.py) run every pass on
real plans; here each pass's rule is checked on its own, including the cases it must leave alone.
"""

from __future__ import annotations

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from tensoropt.executor.program.graph_passes import (
    MAX_MOVED_NODES,
    cut_shape_reads,
    hoist_collectives,
    reinplace_collectives,
    sink_waits,
)

aten = torch.ops.aten
C10D = torch.ops._c10d_functional


def _gm(graph: fx.Graph) -> fx.GraphModule:
    graph.lint()
    return fx.GraphModule(torch.nn.Module(), graph)


def _names(gm: fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes]


def test_reinplace_rewrites_only_a_fresh_tensor_nothing_else_reads():
    g = fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    bucket = g.call_function(aten.cat.default, ([a, b],))
    r1 = g.call_function(C10D.all_reduce.default, (bucket, "sum", "0"))
    shared = g.call_function(aten.cat.default, ([a, b],))
    r2 = g.call_function(C10D.all_reduce.default, (shared, "sum", "0"))
    r3 = g.call_function(C10D.all_reduce.default, (a, "sum", "0"))  # a graph input: the caller's tensor
    outs = [g.call_function(C10D.wait_tensor.default, (r,)) for r in (r1, r2, r3)]
    g.output((*outs, shared))  # `shared` is read after its collective: must not be overwritten
    gm = _gm(g)
    assert reinplace_collectives(gm) == 1
    assert r1.target is C10D.all_reduce_.default
    assert r2.target is C10D.all_reduce.default and r3.target is C10D.all_reduce.default
    assert "all_reduce_" in gm.code


def _count_then_forward(extra_in_count: int = 0, impure: bool = False) -> tuple[fx.GraphModule, fx.Node]:
    """x -> relu -> mm (forward), labels -> ne -> sum -> all_reduce (a label count) recorded after it."""
    g = fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("labels")
    h = g.call_function(aten.relu.default, (x,))
    h = g.call_function(aten.mm.default, (h, h))
    c = g.call_function(aten.ne.Scalar, (y, -100))
    for _ in range(extra_in_count):
        c = g.call_function(aten.abs.default, (c,))
    if impure:
        c = g.call_function(aten.add_.Tensor, (c, 1))
    c = g.call_function(aten.sum.default, (c,))
    r = g.call_function(C10D.all_reduce.default, (c, "sum", "0"))
    r.meta["val"] = torch.empty((), dtype=torch.int64)
    w = g.call_function(C10D.wait_tensor.default, (r,))
    g.output((g.call_function(aten.div.Tensor, (h, w)),))
    return _gm(g), r


def test_hoist_moves_a_label_count_and_its_collective_before_forward():
    gm, r = _count_then_forward()
    assert hoist_collectives(gm) == 1
    names = _names(gm)
    assert names.index(r.name) < names.index("relu_default")  # issued before forward's first op
    assert names.index("sum_default") < names.index(r.name)  # after what it reads
    assert names[:2] == ["x", "labels"]  # placeholders stay first (the program's arguments)


def test_hoist_leaves_impure_or_long_chains_where_they_are():
    for gm, _ in (_count_then_forward(impure=True), _count_then_forward(extra_in_count=MAX_MOVED_NODES)):
        before = _names(gm)
        assert hoist_collectives(gm) == 0
        assert _names(gm) == before


def test_hoist_leaves_an_all_gather_where_it_is_however_small():
    # ZeRO-3's all-gather of a parameter shard: issued at the start, its result would be held all step
    # (and dozens in flight at once abort gloo: tensoropt.executor.ops.gloo_gathers)
    g = fx.Graph()
    x, shard = g.placeholder("x"), g.placeholder("weight_shard")
    h = g.call_function(aten.relu.default, (x,))
    gathered = g.call_function(C10D.all_gather_into_tensor.default, (shard, 2, "0"))
    gathered.meta["val"] = torch.empty(128, 1024)  # 512 KiB
    w = g.call_function(C10D.wait_tensor.default, (gathered,))
    g.output((g.call_function(aten.mm.default, (h, w)),))
    gm = _gm(g)
    before = _names(gm)
    assert hoist_collectives(gm) == 0
    assert _names(gm) == before
    gathered.meta["val"] = torch.empty(8)  # the same collective, small: still where it was
    assert hoist_collectives(gm) == 0
    assert _names(gm) == before


def test_sink_moves_the_loss_values_wait_after_backward():
    def step(x, w):
        loss_sum = (x @ w).sum()
        total = C10D.all_reduce.default(loss_sum.reshape(1), "sum", "0")  # the loss's value, all-reduced
        loss = C10D.wait_tensor.default(total).reshape(()) / 4
        grad_w = x.t() @ torch.ones_like(loss).expand(x.shape[0], w.shape[1])  # backward: seed from the shape
        return loss, grad_w

    gm = make_fx(step, tracing_mode="fake")(torch.ones(3, 2), torch.ones(2, 2))
    assert sink_waits(gm) == 1
    order = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "aten.ones_like.default" not in order and "aten.full.default" in order
    assert order.index("_c10d_functional.wait_tensor.default") > max(
        i for i, t in enumerate(order) if t == "aten.mm.default")  # backward's matmul runs before the wait


def test_cut_shape_reads_keeps_values_and_skips_other_layouts():
    gm = make_fx(lambda x: (torch.ones_like(x.sum()) * 3, torch.zeros_like(x.t())))(torch.ones(2, 3))
    expected = gm(torch.full((2, 3), 2.0))
    assert cut_shape_reads(gm) == 1  # the transposed zeros_like keeps its strides: left alone
    got = gm(torch.full((2, 3), 2.0))
    assert all(torch.equal(a, b) and a.stride() == b.stride() for a, b in zip(got, expected))


def test_hoist_leaves_a_large_all_reduce_where_it_is():
    gm, r = _count_then_forward()
    r.meta["val"] = torch.empty(128, 1024)  # 512 KiB: held from the start of the step if issued there
    before = _names(gm)
    assert hoist_collectives(gm) == 0
    assert _names(gm) == before
