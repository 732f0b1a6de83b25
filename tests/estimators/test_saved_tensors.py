"""The saved-activation rules of estimators.memory, checked against what autograd really saves.

Each case is a tiny module (an op behind a Linear or with its own parameters so it takes part in
backward); the estimate (cost graph on 1 device) must equal the bytes measured with
``saved_tensors_hooks`` over unique storages, plus parameters, gradients and optimizer state.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from estimators.measure import measure_model_memory
from tensoropt.capture import capture
from tensoropt.cost_graph import cost_graph


def plan_memory(cg) -> float:
    return sum(cg.nodes[n]["memory_bytes"][0] for n in cg) + sum(
        cg.edges[e]["memory_bytes"][0, 0] for e in cg.edges
    )


class Pre(nn.Module):
    """x -> Linear -> fn(h, ...) : fn's operands need gradients."""

    def __init__(self, fn, d=8, out=8, extra=None):
        super().__init__()
        self.lin, self.fn = nn.Linear(d, out), fn
        self.extra = extra

    def forward(self, x):
        return self.fn(self.lin(x))


def _attn(p, causal=False):
    mask = None if causal else torch.ones(6, 6, dtype=torch.bool).tril()

    def f(h):  # h: (2, 6, 16) -> heads 2 x 8
        q = h.view(2, 6, 2, 8).transpose(1, 2)
        return F.scaled_dot_product_attention(
            q, q * 2.0, q + 1.0, attn_mask=mask, dropout_p=p, is_causal=causal
        )

    return f


class AttnProj(nn.Module):
    """Fused causal attention whose output feeds an output projection through transpose + reshape."""

    def __init__(self):
        super().__init__()
        self.qkv, self.o = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        q = self.qkv(x).view(2, 6, 2, 8).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        return self.o(a.transpose(1, 2).reshape(2, 6, 16))


CASES = {
    "sdpa_fused_output_shared_with_projection": (AttnProj(), (2, 6, 16)),
    "relu": (Pre(torch.relu), (4, 8)),
    "gelu": (Pre(F.gelu), (4, 8)),
    "silu": (Pre(F.silu), (4, 8)),
    "tanh": (Pre(torch.tanh), (4, 8)),
    "sigmoid": (Pre(torch.sigmoid), (4, 8)),
    "softmax": (Pre(lambda h: torch.softmax(h, -1)), (4, 8)),
    "log_softmax": (Pre(lambda h: torch.log_softmax(h, -1)), (4, 8)),
    "mul_two": (Pre(lambda h: h * h.sin()), (4, 8)),
    "mul_scalar": (Pre(lambda h: h * 3.0), (4, 8)),
    "add": (Pre(lambda h: h + h.exp()), (4, 8)),
    "dropout": (Pre(lambda h: F.dropout(h, 0.3, True)), (4, 8)),
    "linear_chain_shares_relu": (
        nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.Linear(8, 4)),
        (4, 8),
    ),
    "layer_norm": (nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8)), (4, 3, 8)),
    "conv_bn_relu_maxpool": (
        nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2)),
        (2, 3, 8, 8),
    ),
    "group_norm_avgpool": (
        nn.Sequential(nn.Conv2d(3, 4, 3), nn.GroupNorm(2, 4), nn.AvgPool2d(2)),
        (2, 3, 8, 8),
    ),
    "adaptive_avg_1x1": (nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1)), (2, 3, 8, 8)),
    "adaptive_avg_2x2": (nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(2)), (2, 3, 8, 8)),
    "sdpa_math_mask": (Pre(_attn(0.0), d=16, out=16), (2, 6, 16)),
    "sdpa_math_mask_dropout": (Pre(_attn(0.2), d=16, out=16), (2, 6, 16)),
    "sdpa_fused_mask": (Pre(_attn(0.0), d=16, out=16), (2, 6, 16)),
    "sdpa_fused_causal": (Pre(_attn(0.0, causal=True), d=16, out=16), (2, 6, 16)),
    "sdpa_auto_causal_dropout": (Pre(_attn(0.2, causal=True), d=16, out=16), (2, 6, 16)),
    "bmm": (Pre(lambda h: torch.bmm(h, h.transpose(1, 2))), (2, 4, 8)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_saved_bytes_match_autograd(name):
    torch.manual_seed(0)
    model, shape = CASES[name]
    x = torch.randn(*shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = capture(model, (x,))
    math = "_math_" in name
    cg = cost_graph(
        g, "cpu-local", 1, configurations={}, optimizer="adamw", sdpa_backend="math" if math else "auto"
    )
    with sdpa_kernel(SDPBackend.MATH) if math else contextlib.nullcontext():
        measured = measure_model_memory(model, (x,), "adamw")
    assert plan_memory(cg) == measured["total"], (name, measured)


def test_embedding_and_cross_entropy():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = nn.Embedding(20, 8), nn.Linear(8, 20)

        def forward(self, idx, y):
            return F.cross_entropy(self.head(self.emb(idx)).flatten(0, 1), y.flatten())

    torch.manual_seed(0)
    m, inputs = M(), (torch.randint(0, 20, (3, 5)), torch.randint(0, 20, (3, 5)))
    cg = cost_graph(capture(m, inputs), "cpu-local", 1, configurations={}, optimizer="sgd")
    assert plan_memory(cg) == measure_model_memory(m, inputs, "sgd")["total"]
