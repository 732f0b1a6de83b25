"""Aten operators called through their Python bindings (tensoropt.executor.program.direct_calls).

A binding replaces a node only where it dispatches the node's own overload with the same arguments:
the values must be the program's bit for bit (a conv + batch norm + pool + linear + cross-entropy
step, forward and backward, running statistics written in place), and a binding that would reach
another overload (a Scalar argument wrapped into a tensor), a collective, its wait and a Python
callable keep their targets. The replayed program of a trainer runs the bindings: most of its
forward's operators no longer go through ``OpOverload`` (the count fails without the pass).
"""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from tensoropt.executor.program.direct_calls import binding_of, direct_calls

aten = torch.ops.aten
C10D = torch.ops._c10d_functional


def _overloads(gm: fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)]


def _conv_step(x, labels, w1, b1, gamma, beta, mean, var, w2, b2):
    """A conv + batch norm (training: running statistics updated in place) + relu + pool + linear +
    cross-entropy forward, and the gradients of every weight, as one traced program."""
    h = F.conv2d(x, w1, b1, padding=1)
    h = F.batch_norm(h, mean, var, gamma, beta, training=True, momentum=0.1)
    h = F.max_pool2d(F.relu(h), 2)
    loss = F.cross_entropy(F.linear(h.flatten(1), w2, b2), labels)
    return (loss, *torch.autograd.grad(loss, (w1, b1, gamma, beta, w2, b2)))


def _inputs():
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(8, 3, 3, 3, generator=g), torch.randn(8, generator=g),
               torch.rand(8, generator=g) + 0.5, torch.randn(8, generator=g), torch.zeros(8), torch.ones(8),
               torch.randn(4, 8 * 4 * 4, generator=g), torch.randn(4, generator=g)]
    for i in (0, 1, 2, 3, 6, 7):
        weights[i].requires_grad_(True)
    return [torch.randn(6, 3, 8, 8, generator=g), torch.randint(0, 4, (6,), generator=g), *weights]


def test_bindings_give_every_value_and_buffer_bit_for_bit():
    args = _inputs()
    with torch.enable_grad():
        gm = make_fx(_conv_step)(*[a.detach().clone().requires_grad_(a.requires_grad) for a in args])
    fast = direct_calls(gm)
    assert fast is not gm and not any(callable(n.target) and not isinstance(n.target, torch._ops.OpOverload)
                                      for n in gm.graph.nodes if n.op == "call_function"
                                      and getattr(n.target, "__name__", "") != "getitem")  # gm unchanged
    direct = {getattr(n.target, "__name__", "") for n in fast.graph.nodes if n.op == "call_function"
              and not isinstance(n.target, torch._ops.OpOverload)}
    assert {"convolution", "native_batch_norm", "relu", "max_pool2d_with_indices"} <= direct, direct
    assert len(_overloads(fast)) < len(_overloads(gm)) * 0.7, (_overloads(fast), len(_overloads(gm)))
    outs = []
    for program in (gm, fast):
        copies = [a.detach().clone() for a in args]  # the running statistics are written in place
        with torch.no_grad():
            outs.append((program(*copies), copies))
    (a, a_in), (b, b_in) = outs
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert all(torch.equal(x, y) for x, y in zip(a_in, b_in))  # mean, var updated alike
    assert not torch.equal(a_in[6], args[6])  # the running mean did move


def test_another_overload_a_collective_and_a_python_callable_keep_their_targets():
    g = fx.Graph()
    x = g.placeholder("x")
    scalar = g.call_function(aten.add.Scalar, (x, 2.0))  # torch.add(x, 2.0) dispatches add.Tensor
    reduced = g.call_function(C10D.all_reduce.default, (scalar, "sum", "0"))
    waited = g.call_function(C10D.wait_tensor.default, (reduced,))
    py = g.call_function(torch.Tensor.relu, (waited,))
    neg = g.call_function(aten.neg.default, (py,))
    g.output(neg)
    for n in (x, scalar, reduced, waited, py, neg):
        n.meta["val"] = torch.empty(3)
    gm = fx.GraphModule(torch.nn.Module(), g)
    assert [binding_of(n) for n in (scalar, reduced, waited, py)] == [None] * 4
    assert binding_of(neg) is torch.neg
    fast = direct_calls(gm)
    targets = [n.target for n in fast.graph.nodes if n.op == "call_function"]
    assert targets == [aten.add.Scalar, C10D.all_reduce.default, C10D.wait_tensor.default, torch.Tensor.relu,
                       torch.neg]
    assert direct_calls(fx.symbolic_trace(torch.nn.Identity())).graph is not None  # nothing to change


def test_a_node_without_traced_values_keeps_its_overload():
    g = fx.Graph()
    x = g.placeholder("x")  # no meta["val"]: the binding cannot be checked
    g.output(g.call_function(aten.neg.default, (x,)))
    gm = fx.GraphModule(torch.nn.Module(), g)
    assert direct_calls(gm) is gm


def test_the_replayed_program_runs_the_bindings(monkeypatch):
    """A trainer's replayed step (the toy CNN, one process) with ``replay.DIRECT_CALLS`` on (off by
    default): most operators run through a binding, and the step still equals the interpreter's
    (tests/executor/test_replay.py checks the losses too)."""
    from hand_plans import SPECS

    from tensoropt.executor.program import replay

    monkeypatch.setattr(replay, "DIRECT_CALLS", True)

    from tensoropt.executor.job.plan import ExecPlan
    from tensoropt.training.trainer import Trainer

    single = ExecPlan.from_json({"id": "single", "mesh": {"shape": [], "levels": []}, "placements": {}})
    trainer = Trainer(SPECS["cnn"], single, mode="replay")
    trainer.train(2)
    lowered, call = trainer.program.program(trainer._placeholder_values(trainer.batch(0)))
    assert len(_overloads(call)) < len(_overloads(lowered.gm)) * 0.7, _overloads(call)
    assert trainer.program.stats()["nodes"] == sum(1 for n in call.graph.nodes if n.op == "call_function")
