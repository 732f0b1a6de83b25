"""Capture: node attributes, folded views and params, FLOPs in closed form, warnings and errors."""

from __future__ import annotations

import networkx as nx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tensoropt.capture import CaptureWarning, OpGraph, TraceError, capture, export_program
from tensoropt.models.transformer import SelfAttention


def _kinds(g: OpGraph) -> list[str]:
    return [g.nx.nodes[n]["kind"] for n in g.compute_nodes()]


def test_linear_node_attributes_and_flops():
    b, t, i, o = 3, 5, 16, 24
    g = capture(nn.Linear(i, o), (torch.randn(b, t, i),))
    node = g.nx.nodes["linear"]
    assert node["op"] == "aten.linear.default"
    assert node["kind"] == "linear"
    assert node["out_shape"] == (b, t, o)
    assert node["out_dtype"] == "float32"
    assert node["params"] == {"weight": (o, i), "bias": (o,)}
    assert node["flops"] == 2 * b * t * i * o
    assert node["inputs"][0]["source"] == "input"
    assert g.nx.edges["input", "linear"]["bytes"] == b * t * i * 4
    assert g.outputs == ["linear"]


def test_conv_flops_match_closed_form():
    n, cin, cout, h, w, k, stride, groups = 2, 8, 16, 15, 15, 3, 2, 2
    conv = nn.Conv2d(cin, cout, k, stride=stride, padding=1, groups=groups)
    g = capture(conv, (torch.randn(n, cin, h, w),))
    node = g.nx.nodes["conv2d"]
    hout = (h + 2 - k) // stride + 1
    assert node["out_shape"] == (n, cout, hout, hout)
    assert node["flops"] == 2 * n * cout * hout * hout * (cin // groups) * k * k
    assert node["attrs"] == {"stride": [2, 2], "padding": [1, 1], "dilation": [1, 1], "groups": 2}


class FusedQKV(nn.Module):
    """GPT-2's fused projection: q, k, v split off one linear."""

    def __init__(self, c: int, h: int, t: int):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(c, 3 * c)
        self.register_buffer("mask", torch.ones(t, t, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (y.view(b, t, self.h, c // self.h).transpose(1, 2) for y in self.qkv(x).split(c, dim=2))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask[:t, :t])


def test_attention_flops_and_fused_qkv_split_folded_into_one_edge():
    b, t, c, h = 2, 8, 32, 4
    g = capture(FusedQKV(c, h, t), (torch.randn(b, t, c),))
    sdpa = "scaled_dot_product_attention"
    node = g.nx.nodes[sdpa]
    d = c // h
    assert node["flops"] == 4 * b * h * t * t * d + 5 * b * h * t * t
    # q, k and v are three operands read from the one qkv linear through split/view/transpose
    assert g.nx.edges["linear", sdpa]["operands"] == [0, 1, 2]
    for entry in node["inputs"]:
        assert entry["views"][:2] == ["aten.split.Tensor", "operator.getitem"]
        # linear out [B, T, 3C] -> q [B, H, T, D]: batch stays 0, seq moves to 2, the split dim is cut
        assert entry["dim_map"] == [0, 2, None]
    assert node["buffers"] == {"mask": (t, t)}
    assert node["attrs"]["has_mask"] and not node["attrs"]["is_causal"]
    assert "alias" in g.nx.graph["static_ops"]


def test_separate_projections_map_features_onto_heads():
    b, t, c, h = 2, 8, 32, 4
    g = capture(SelfAttention(c, h, max_seq=t, causal=True), (torch.randn(b, t, c),))
    (sdpa,) = [n for n in g.nx.nodes if g.nx.nodes[n]["kind"] == "sdpa"]
    sources = [e["source"] for e in g.nx.nodes[sdpa]["inputs"]]
    assert [g.nx.nodes[s]["module"] for s in sources] == ["q", "k", "v"]
    for entry in g.nx.nodes[sdpa]["inputs"]:
        # projection out [B, T, C] -> [B, H, T, D]: the feature dim becomes the heads dim, so a
        # column split of the projection is a head split of attention (Megatron-LM)
        assert entry["dim_map"] == [0, 2, 1]


def test_flatten_dim_map_and_params_sum():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.bn = nn.BatchNorm2d(4)
            self.fc = nn.Linear(4 * 6 * 6, 5)

        def forward(self, x, y):
            z = torch.flatten(F.relu(self.bn(self.conv(x))), 1)
            return F.cross_entropy(self.fc(z), y)

    model = Net()
    g = capture(model, (torch.randn(2, 3, 6, 6), torch.tensor([1, 4])))
    assert _kinds(g) == ["conv2d", "batch_norm", "elementwise", "linear", "cross_entropy"]
    fc_in = g.nx.nodes["linear"]["inputs"][0]
    assert fc_in["views"] == ["aten.flatten.using_ints"]
    assert fc_in["dim_map"] == [0, 1, None, None]
    assert g.nx.nodes["batch_norm"]["buffers"] == {"bn.running_mean": (4,), "bn.running_var": (4,)}
    assert g.num_params() == sum(p.numel() for p in model.parameters())
    total = sum(
        torch.Size(s).numel()
        for _, d in g.nx.nodes(data=True)
        for k, s in d["params"].items()
        if k not in d["shared_params"]
    )
    assert total == sum(p.numel() for p in model.parameters())
    assert g.inputs == ["x", "y"]
    assert g.nx.nodes["y"]["kind"] == "input"
    assert g.outputs == ["cross_entropy_loss"]


def test_tied_weights_counted_once_and_marked_shared():
    from tensoropt.models import build_model, example_inputs

    model, spec = build_model("gpt", layers=1, width=16, heads=2, seq_len=8, vocab_size=32)
    g = capture(model, example_inputs(spec, 2))
    (wte,) = [n for n, d in g.nx.nodes(data=True) if d["module"] == "wte"]
    (key,) = g.nx.nodes[wte]["params"]  # torch.export names a tied parameter by one of its keys
    assert key in ("wte.weight", "head.weight")
    users = [n for n, d in g.nx.nodes(data=True) if key in d["params"]]
    assert len(users) == 2  # the token embedding and the output head
    shared = [n for n in users if key in g.nx.nodes[n]["shared_params"]]
    assert len(shared) == 1 and g.nx.nodes[shared[0]]["kind"] == "linear"
    assert g.num_params() == sum(p.numel() for p in model.parameters())
    other = "head.weight" if key == "wte.weight" else "wte.weight"
    assert g.nx.graph["tied_params"] == {other: key} and g.nx.graph["unused_params"] == {}


def test_unused_parameters_are_listed():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.used = nn.Linear(4, 2)
            self.spare = nn.Linear(4, 3)

        def forward(self, x):
            return self.used(x)

    g = capture(Net(), (torch.randn(2, 4),))
    assert g.nx.graph["unused_params"] == {"spare.weight": (3, 4), "spare.bias": (3,)}
    assert set(g.params) == {"used.weight", "used.bias"}


def test_every_tensor_path_from_inputs_reaches_the_loss():
    from tensoropt.models import build_model, example_inputs

    model, spec = build_model("bert-base", layers=1, width=16, heads=2, seq_len=8, vocab_size=32)
    g = capture(model, example_inputs(spec, 2))
    (loss,) = g.outputs
    for name in g.nx.nodes:
        if name != loss:
            assert nx.has_path(g.nx, name, loss), f"{name} does not reach the loss"
    for u, v, data in g.nx.edges(data=True):
        for i in data["operands"]:
            assert g.nx.nodes[v]["inputs"][i]["source"] == u
    # every activation operand is an edge; every param/buffer operand is recorded on the node
    for _, d in g.nx.nodes(data=True):
        roles = [o["role"] for o in d["operands"]]
        assert roles.count("input") == len(d["inputs"])
        assert {o["key"] for o in d["operands"] if o["role"] == "param"} == set(d["params"])


def test_opaque_operator_warns_with_op_and_module():
    class Cum(nn.Module):
        def forward(self, x):
            return torch.cumsum(x, dim=1)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.scan = Cum()
            self.fc = nn.Linear(6, 2)

        def forward(self, x):
            return self.fc(self.scan(x))

    with pytest.warns(CaptureWarning, match=r"aten\.cumsum\.default.*scan"):
        g = capture(Net(), (torch.randn(4, 6),))
    node = g.nx.nodes["cumsum"]
    assert node["kind"] == "opaque"
    assert node["flops"] == 24


def test_untraceable_model_raises_clear_error():
    class Branchy(nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow
                return x * 2
            return x

    with pytest.raises(TraceError) as info:
        capture(Branchy(), (torch.randn(3),))
    text = str(info.value)
    assert "Branchy" in text and "torch.cond" in text and "data-dependent" in text


def test_capture_rejects_non_module():
    with pytest.raises(TypeError, match="nn.Module"):
        export_program(lambda x: x, (torch.randn(2),))


def test_node_names_stable_across_runs_and_export_program_agrees():
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 2))
    x = (torch.randn(2, 4),)
    a, b = capture(model, x), capture(model, x)
    assert list(a.nx.nodes) == list(b.nx.nodes)
    ep_names = {n.name for n in export_program(model, x).graph.nodes}
    assert set(a.nx.nodes) <= ep_names


def test_matmul_family_and_elementwise_kinds():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 8))

        def forward(self, x):
            a = torch.matmul(x, self.w)
            b = torch.einsum("btc,bsc->bts", a, x)
            c = torch.bmm(b, x)
            return torch.cat([F.silu(c), torch.tanh(c)], dim=2).softmax(-1)

    g = capture(Net(), (torch.randn(2, 8, 8),))
    assert _kinds(g) == ["matmul", "matmul", "matmul", "elementwise", "elementwise", "cat", "softmax"]
    assert g.nx.nodes["matmul"]["params"] == {"w": (8, 8)}
    assert g.nx.nodes["einsum"]["flops"] == 2 * 2 * 8 * 8 * 8
    assert g.nx.nodes["cat"]["attrs"] == {"dim": 2}
    assert g.nx.nodes["softmax"]["attrs"] == {"dim": 2}
