"""Small models and hand-built plans shared by the estimator tests and benchmarks/estimator_accuracy.py.

A plan maps node name -> Configuration on a 1-axis mesh of 2 devices (layouts as strings).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from tensoropt.configspace.configuration import Configuration

HERE = Path(__file__).resolve().parent

R, S0, S1, S2 = ("R",), ("S(0)",), ("S(1)",), ("S(2)",)


def cfg(label, inputs, output, params=(), partial=(), sync=(), splits=()):
    """A Configuration from short layout tuples (``splits``: dims split over axis 0)."""
    return Configuration(
        label,
        tuple((d, (0,)) for d in splits),
        tuple(inputs),
        tuple(params),
        output,
        tuple(partial),
        tuple(sync),
    )


class MLP(nn.Module):
    """Linear -> ReLU -> Linear -> cross entropy."""

    def __init__(self, d_in=32, hidden=64, classes=16):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_in, hidden), nn.Linear(hidden, classes)

    def forward(self, x, y):
        return F.cross_entropy(self.fc2(torch.relu(self.fc1(x))), y)


def mlp_inputs(batch=16, d_in=32, classes=16):
    return (torch.randn(batch, d_in), torch.randint(0, classes, (batch,)))


def mlp_plans() -> dict[str, dict[str, Configuration]]:
    """Data parallel, Megatron (column then row) and replicated plans for :class:`MLP` on 2 devices."""
    dp = {
        "x": cfg("batch=2", [], S0, splits=["batch"]),
        "y": cfg("batch=2", [], S0, splits=["batch"]),
        "linear": cfg(
            "batch=2",
            [S0],
            S0,
            [("fc1.weight", R), ("fc1.bias", R)],
            sync=[("fc1.weight", (0,)), ("fc1.bias", (0,))],
            splits=["batch"],
        ),
        "relu": cfg("batch=2", [S0], S0, splits=["batch"]),
        "linear_1": cfg(
            "batch=2",
            [S0],
            S0,
            [("fc2.weight", R), ("fc2.bias", R)],
            sync=[("fc2.weight", (0,)), ("fc2.bias", (0,))],
            splits=["batch"],
        ),
        "cross_entropy_loss": cfg("batch=2", [S0, S0], R, partial=(0,), splits=["batch"]),
    }
    tp = {
        "x": cfg("replicate", [], R),
        "y": cfg("replicate", [], R),
        "linear": cfg("out=2", [R], S1, [("fc1.weight", S0), ("fc1.bias", S0)], splits=["out"]),
        "relu": cfg("out=2", [S1], S1, splits=["out"]),
        "linear_1": cfg("in=2", [S1], R, [("fc2.weight", S1), ("fc2.bias", R)], partial=(0,), splits=["in"]),
        "cross_entropy_loss": cfg("replicate", [R, R], R),
    }
    mixed = dict(dp)
    mixed["linear_1"] = cfg("out=2", [R], S1, [("fc2.weight", S0), ("fc2.bias", S0)], splits=["out"])
    mixed["cross_entropy_loss"] = cfg("replicate", [R, R], R)
    return {"dp": dp, "tp": tp, "dp-then-col": mixed}


class CNN(nn.Module):
    """conv -> batch_norm -> relu -> max_pool -> flatten -> linear -> cross entropy."""

    def __init__(self, channels=8, classes=10, size=8):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels)
        self.fc = nn.Linear(channels * (size // 2) ** 2, classes)

    def forward(self, x, y):
        h = F.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return F.cross_entropy(self.fc(h.flatten(1)), y)


def cnn_inputs(batch=8, size=8, classes=10):
    return (torch.randn(batch, 3, size, size), torch.randint(0, classes, (batch,)))


class Block(nn.Module):
    """Pre-norm transformer block: attention (sdpa, explicit causal mask, dropout) + GELU MLP."""

    def __init__(self, d=32, heads=4, seq=8, p=0.1, causal=False):
        super().__init__()
        self.heads, self.p, self.causal = heads, p, causal
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(p)
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).tril())

    def forward(self, x):
        b, t, d = x.shape
        h = self.ln1(x)
        q, k, v = (
            m(h).view(b, t, self.heads, d // self.heads).transpose(1, 2) for m in (self.q, self.k, self.v)
        )
        if self.causal:  # the form tensoropt's executor runs on a mesh
            a = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p, is_causal=True)
        else:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask[:t, :t], dropout_p=self.p)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class TinyGPT(nn.Module):
    """Token + position embedding, one block, final norm, LM head, cross entropy."""

    def __init__(self, vocab=64, d=32, heads=4, seq=8, p_attn=0.1, causal=False):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.zeros(seq, d))
        self.block = Block(d, heads, seq, p_attn, causal)
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx, y):
        x = self.block(self.tok(idx) + self.pos[: idx.shape[1]])
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def gpt_inputs(batch=4, seq=8, vocab=64):
    return (torch.randint(0, vocab, (batch, seq)), torch.randint(0, vocab, (batch, seq)))


def _dp(node: dict) -> Configuration:
    """Batch split on dim 0 of every tensor; parameters replicated with their gradients all-reduced."""
    if node["kind"] == "input":
        return cfg("batch=2", [], S0, splits=["batch"])
    out = R if not node["out_shape"] else S0
    params = [(k, R) for k in node["params"]]
    sync = [(k, (0,)) for k in node["params"]]
    return cfg(
        "batch=2",
        [S0] * len(node["inputs"]),
        out,
        params,
        partial=(0,) if out == R else (),
        sync=sync,
        splits=["batch"],
    )


def _rep(node: dict) -> Configuration:
    return cfg("replicate", [R] * len(node["inputs"]), R, [(k, R) for k in node["params"]])


def _col(node: dict, out_dim: int) -> Configuration:
    """Column-parallel linear: replicated input, weight/bias split on out, output split on ``out_dim``."""
    return cfg("out=2", [R], (f"S({out_dim})",), [(k, S0) for k in node["params"]], splits=["out"])


def _row(node: dict, in_dim: int) -> Configuration:
    """Row-parallel linear: input split on ``in_dim``, weight split on in, partial output all-reduced."""
    params = [(k, S1 if k.endswith("weight") else R) for k in node["params"]]
    return cfg("in=2", [(f"S({in_dim})",)], R, params, partial=(0,), splits=["in"])


def cnn_plans(g) -> dict[str, dict[str, Configuration]]:
    """Data parallel; conv output channels split + row-parallel fc; data parallel convs + replicated fc."""
    nodes = g.nodes
    dp = {n: _dp(nodes[n]) for n in g}
    convout = {n: _rep(nodes[n]) for n in g}
    convout["conv2d"] = cfg("out=2", [R], S1, [("conv.weight", S0), ("conv.bias", S0)], splits=["out"])
    convout["batch_norm"] = cfg("out=2", [S1], S1, [("bn.weight", S0), ("bn.bias", S0)], splits=["out"])
    convout["relu"] = cfg("out=2", [S1], S1, splits=["out"])
    convout["max_pool2d"] = cfg("out=2", [S1], S1, splits=["out"])
    convout["linear"] = _row(nodes["linear"], 1)
    dp_rep_fc = dict(dp)
    dp_rep_fc["linear"] = _rep(nodes["linear"])
    dp_rep_fc["cross_entropy_loss"] = _rep(nodes["cross_entropy_loss"])
    dp_rep_fc["y"] = _rep(nodes["y"])
    return {"dp": dp, "conv-out+fc-row": convout, "dp-conv+rep-fc": dp_rep_fc}


def gpt_plans(g) -> dict[str, dict[str, Configuration]]:
    """Data parallel; Megatron tensor parallel (heads + MLP); data-parallel attention with a TP MLP."""
    nodes = g.nodes
    dp = {n: _dp(nodes[n]) for n in g}
    tp = {n: _rep(nodes[n]) for n in g}
    for n in ("linear", "linear_1", "linear_2"):
        tp[n] = _col(nodes[n], 2)
    tp["scaled_dot_product_attention"] = cfg("heads=2", [S1, S1, S1], S1, splits=["heads"])
    tp["linear_3"] = _row(nodes["linear_3"], 2)
    tp["linear_4"] = _col(nodes["linear_4"], 2)
    tp["gelu"] = cfg("out=2", [S2], S2, splits=["out"])
    tp["linear_5"] = _row(nodes["linear_5"], 2)
    mixed = dict(dp)
    for n in ("layer_norm_1", "linear_4", "gelu", "linear_5", "dropout", "add_2"):
        mixed[n] = tp[n]
    mixed["add_2"] = cfg("replicate", [R, R], R)
    return {"dp": dp, "megatron-tp": tp, "dp-attn+tp-mlp": mixed}


def run_executor(spec, plans: dict[str, dict], mesh, nproc: int, steps: int) -> dict[str, dict]:
    """Train each plan (name -> node -> Configuration) for ``steps`` steps on ``nproc`` processes with
    tensoropt's executor (``spec``: an executor TrainSpec); returns plan name -> measured metrics."""
    from tensoropt.launch import LaunchOptions, launch_workers

    with tempfile.TemporaryDirectory(prefix="tensoropt-acc-") as tmp:
        runs = []
        for i, (name, plan) in enumerate(plans.items()):
            doc = {
                "id": name,
                "mesh": mesh.to_json(),
                "placements": {n: c.to_json() for n, c in plan.items()},
            }
            runs.append({"plan": doc, "metrics": str(Path(tmp) / f"m{i}.json"), "params_out": None})
        env = {
            "PYTHONPATH": os.pathsep.join(
                [str(HERE), str(HERE.parent.parent), os.environ.get("PYTHONPATH", "")]
            )
        }
        rc = launch_workers(
            {"spec": spec.to_json(), "runs": runs, "steps": steps},
            LaunchOptions(nproc, timeout_s=900),
            env=env,
        )
        out = {}
        for i, name in enumerate(plans):
            f = Path(tmp) / f"m{i}.json"
            if f.is_file():
                out[name] = json.loads(f.read_text())["measured"]
        if rc != 0:
            print(f"  executor exited with {rc}; {len(out)} of {len(plans)} plans measured", file=sys.stderr)
        return out
