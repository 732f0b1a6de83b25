"""Per-device memory: hand-derived bytes for single layers per configuration, and plan fidelity.

Fidelity: for an MLP, a small CNN and a small transformer under three plans each on 2 devices,
the cost graph's memory (params + grads + optimizer state + saved activations) equals what one
process measures at the plan's local-shard shapes (estimators.measure) within 2 %.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from est_plans import (
    CNN,
    MLP,
    TinyGPT,
    cfg,
    cnn_inputs,
    cnn_plans,
    gpt_inputs,
    gpt_plans,
    mlp_inputs,
    mlp_plans,
)
from torch import nn

from estimators.measure import measure_plan_memory
from estimators.memory import optimizer_factor
from tensoropt.capture import capture
from tensoropt.configspace.configuration import Mesh
from tensoropt.cost_graph import cost_graph

R, S0, S1, S2 = ("R",), ("S(0)",), ("S(1)",), ("S(2)",)
MESH = Mesh((2,), ("gpu",))


def plan_memory(cg) -> float:
    return sum(cg.nodes[n]["memory_bytes"][0] for n in cg) + sum(
        cg.edges[e]["memory_bytes"][0, 0] for e in cg.edges
    )


def priced(graph, plan, optimizer="adamw", sdpa_backend="auto", batch_norm="native"):
    """Predicted memory of one plan on 2 devices (native aten batch norm, like the local-shard run)."""
    confs = {k: [v] for k, v in plan.items()}
    cg = cost_graph(
        graph,
        "cpu-local",
        2,
        configurations=confs,
        optimizer=optimizer,
        sdpa_backend=sdpa_backend,
        batch_norm=batch_norm,
    )
    return plan_memory(cg)


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adamw"])
def test_linear_layer_per_configuration(optimizer):
    g = capture(nn.Linear(32, 64), (torch.randn(16, 32),))
    k = 2 + optimizer_factor(optimizer)  # params + grads + state
    w, b = 64 * 32, 64
    plans = {
        # batch split: full weight, half the input saved
        "batch": (
            {
                "input": cfg("b", [], S0),
                "linear": cfg(
                    "b", [S0], S0, [("weight", R), ("bias", R)], sync=[("weight", (0,)), ("bias", (0,))]
                ),
            },
            4 * (k * (w + b) + 8 * 32),
        ),
        # out split: half weight and bias, the whole input saved
        "out": (
            {"input": cfg("r", [], R), "linear": cfg("o", [R], S1, [("weight", S0), ("bias", S0)])},
            4 * (k * (w + b) // 2 + 16 * 32),
        ),
        # in split: half weight, whole bias, half the input (columns) saved
        "in": (
            {
                "input": cfg("r", [], S1),
                "linear": cfg("i", [S1], R, [("weight", S1), ("bias", R)], partial=(0,)),
            },
            4 * (k * (w // 2 + b) + 16 * 16),
        ),
    }
    for name, (plan, expected) in plans.items():
        assert priced(g, plan, optimizer) == expected, name


def test_conv_layer_per_configuration():
    g = capture(nn.Conv2d(3, 8, 3), (torch.randn(4, 3, 8, 8),))
    params = 8 * 3 * 9 + 8
    batch = {"x": cfg("b", [], S0), "conv2d": cfg("b", [S0], S0, [("weight", R), ("bias", R)])}
    out = {"x": cfg("r", [], R), "conv2d": cfg("o", [R], S1, [("weight", S0), ("bias", S0)])}
    assert priced(g, batch, "sgd") == 4 * (2 * params + 2 * 3 * 8 * 8)
    assert priced(g, out, "sgd") == 4 * (2 * params // 2 + 4 * 3 * 8 * 8)
    # moving the input from batch-split to replicated costs a new storage of the whole input
    moved = {"x": cfg("b", [], S0), "conv2d": out["conv2d"]}
    assert priced(g, moved, "sgd") == priced(g, out, "sgd")


class Attention(nn.Module):
    def __init__(self, d=16, heads=4, seq=8, p=0.0):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.heads, self.p = heads, p
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).tril())

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (
            m(x).view(b, t, self.heads, d // self.heads).transpose(1, 2) for m in (self.q, self.k, self.v)
        )
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, dropout_p=self.p)


@pytest.mark.parametrize("backend, dropout", [("math", 0.0), ("math", 0.1), ("auto", 0.1), ("auto", 0.0)])
def test_attention_per_configuration(backend, dropout):
    """Math path (forced, or CPU with dropout): q*s, k*s, weights, v (+ mask and dropped weights).
    Fused path (CPU without dropout): q, k, v, the output, logsumexp and the mask as a float bias."""
    b, t, d, h = 4, 8, 16, 4
    g = capture(Attention(d, h, t, dropout), (torch.randn(b, t, d),))
    lin = ["linear", "linear_1", "linear_2"]
    params = 3 * (d * d + d)
    for label, div in (("batch", 2), ("heads", 2), ("replicate", 1)):
        if label == "batch":
            plan = {"x": cfg("b", [], S0), "scaled_dot_product_attention": cfg("b", [S0] * 3, S0)}
            plan.update(
                {n: cfg("b", [S0], S0, [(f"{m}.weight", R), (f"{m}.bias", R)]) for n, m in zip(lin, "qkv")}
            )
            x_saved, p_local = b * t * d // 2, params
        elif label == "heads":
            plan = {"x": cfg("r", [], R), "scaled_dot_product_attention": cfg("h", [S1] * 3, S1)}
            plan.update(
                {n: cfg("o", [R], S2, [(f"{m}.weight", S0), (f"{m}.bias", S0)]) for n, m in zip(lin, "qkv")}
            )
            x_saved, p_local = b * t * d, params // 2
        else:
            plan = {
                n: cfg("r", [R] * len(g.nx.nodes[n]["inputs"]), R, [(k, R) for k in g.nx.nodes[n]["params"]])
                for n in g.nx
            }
            x_saved, p_local = b * t * d, params
        qkv = b * t * d // div  # one local q (or k, v)
        attn = b * h * t * t // div  # local attention weights
        if backend == "math" or dropout:
            sdpa = 2 * qkv + attn + qkv  # q*scale, k*scale, weights, v (v is linear_2's output)
            sdpa += 2 * attn if dropout else 0  # CPU: float mask + dropped weights
        else:
            sdpa = 3 * qkv + qkv + b * h * t // div + t * t  # q, k, v, output, logsumexp, float mask
        expected = 4 * (2 * p_local + 3 * x_saved // 3 + sdpa)  # x saved once by the three linears
        assert priced(g, plan, "sgd", backend) == expected, label


MODELS = {
    "mlp": (MLP, mlp_inputs, lambda g: mlp_plans()),
    "cnn": (CNN, cnn_inputs, cnn_plans),
    "transformer": (TinyGPT, gpt_inputs, gpt_plans),
}


@pytest.mark.parametrize("model", sorted(MODELS))
def test_plan_memory_within_two_percent_of_measured(model):
    cls, inputs, plans = MODELS[model]
    torch.manual_seed(0)
    example = inputs()
    g = capture(cls(), example)
    found = plans(g.nx)
    assert len(found) >= 3
    for name, plan in found.items():
        predicted = priced(g, plan)
        measured = measure_plan_memory(g, plan, MESH, example, "adamw")["total"]
        assert abs(predicted - measured) <= 0.02 * measured, (model, name, predicted, measured)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_plan_memory_within_two_percent_of_the_running_executor():
    """Acceptance: predicted per-device memory vs tensoropt's executor at 2 processes (gloo)."""
    import warnings

    from est_plans import run_executor

    from tensoropt.executor.job.data import InputSpec, synthetic_batch
    from tensoropt.executor.job.spec import TrainSpec

    models = {
        "MLP": ({}, (InputSpec((32,)), InputSpec((), "int64", 16)), 16, lambda g: mlp_plans()),
        "CNN": ({}, (InputSpec((3, 8, 8)), InputSpec((), "int64", 10)), 8, cnn_plans),
        "TinyGPT": (
            {"causal": True, "p_attn": 0.0},
            (InputSpec((8,), "int64", 64), InputSpec((8,), "int64", 64)),
            4,
            gpt_plans,
        ),
    }
    checked = 0
    for factory, (kwargs, inputs, batch, plans_of) in models.items():
        spec = TrainSpec(f"est_plans:{factory}", inputs, batch, kwargs, optimizer="adamw", steps=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            g = capture(spec.build_model(), synthetic_batch(list(inputs), batch, 0, 0))
        plans = plans_of(g.nx)
        measured = run_executor(spec, plans, MESH, 2, 1)
        assert set(measured) == set(plans), (
            f"{factory}: the executor ran {sorted(measured)} of {sorted(plans)}"
        )
        for name, plan in plans.items():
            confs = {k: [v] for k, v in plan.items()}
            predicted = plan_memory(cost_graph(g, "cpu-local", 2, configurations=confs))  # executor's BN
            real = measured[name]["memory_bytes"]
            assert abs(predicted - real) <= 0.02 * real, (factory, name, predicted, real)
            checked += 1
    assert checked >= 9
