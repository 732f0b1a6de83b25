"""Model zoo: published parameter counts, capture of every preset, small real forwards, user models."""

from __future__ import annotations

import sys
import textwrap
import warnings

import pytest
import torch

from tensoropt.capture import CaptureWarning, capture
from tensoropt.models import PRESETS, build_model, example_inputs


def _gpt_params(layers: int, width: int, vocab: int, seq: int) -> int:
    """GPT-2 layout: per layer 12 d^2 + 13 d (qkv, proj, fc, proj, two LayerNorms), tied head."""
    return layers * (12 * width**2 + 13 * width) + (vocab + seq) * width + 2 * width


@pytest.mark.parametrize(
    ("name", "overrides", "expected"),
    [
        ("alexnet", {}, 61_100_840),  # torchvision's AlexNet
        ("vgg16", {}, 138_357_544),  # Simonyan & Zisserman, configuration D
        ("resnet50", {}, 25_557_032),
        ("wide-resnet", {}, 68_883_240),  # wide_resnet50_2
        ("gpt2-small", {"vocab_size": 50257}, 124_439_808),  # GPT-2 small as released
        ("gpt2-small", {}, _gpt_params(12, 768, 50304, 1024)),
        ("gpt-1.3b", {}, _gpt_params(24, 2048, 50304, 2048)),
    ],
)
def test_published_parameter_counts_on_meta(name, overrides, expected):
    model, _ = build_model(name, device="meta", **overrides)
    assert sum(p.numel() for p in model.parameters()) == expected


def test_bert_base_is_about_110m():
    model, _ = build_model("bert-base", device="meta")
    n = sum(p.numel() for p in model.parameters())
    # BERT-base without pooler, with the MLM head transform and decoder bias: 109.5M
    assert 108e6 < n < 111e6


# transformer presets are captured with 2 of their layers (same width, heads, vocabulary and
# sequence length): every layer is the same subgraph, and the full parameter counts are checked above
_DEPTH = {"gpt2-small": {"layers": 2}, "gpt-1.3b": {"layers": 2}, "bert-base": {"layers": 2}}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_captures_on_meta(name):
    model, spec = build_model(name, device="meta", **_DEPTH.get(name, {}))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureWarning)  # every zoo operator has a parallel rule
        g = capture(model, example_inputs(spec, 2, device="meta"))
    assert "opaque" not in {d["kind"] for _, d in g.nx.nodes(data=True)}
    assert g.num_params() == sum(p.numel() for p in model.parameters())
    (loss,) = g.outputs
    assert g.nx.nodes[loss]["out_shape"] == ()
    assert g.nx.nodes[loss]["kind"] in ("cross_entropy", "elementwise")
    assert g.total_flops() > 0


@pytest.mark.parametrize(
    ("name", "overrides", "batch"),
    [
        ("mlp", {"in_features": 16, "hidden": (32,), "num_classes": 5}, 4),
        ("gpt", {"layers": 2, "width": 32, "heads": 4, "seq_len": 16, "vocab_size": 64}, 2),
        ("bert-base", {"layers": 1, "width": 32, "heads": 4, "seq_len": 16, "vocab_size": 64}, 2),
    ],
)
def test_small_models_train_and_capture_on_cpu(name, overrides, batch):
    torch.manual_seed(0)
    model, spec = build_model(name, **overrides)
    inputs = example_inputs(spec, batch)
    loss = model(*inputs)
    assert loss.shape == () and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    g = capture(model, inputs)
    assert g.num_params() == sum(p.numel() for p in model.parameters())


def test_small_resnet_with_downsampling_trains_and_captures():
    from tensoropt.models.resnet import ResNet

    model = ResNet(layers=(1, 1, 1, 1), num_classes=10)
    inputs = (torch.randn(2, 3, 32, 32), torch.tensor([1, 7]))
    model(*inputs).backward()
    g = capture(model, inputs)
    kinds = [d["kind"] for _, d in g.nx.nodes(data=True)]
    assert kinds.count("conv2d") == 1 + 4 * 4  # stem, 3 per bottleneck, 4 projection shortcuts
    assert g.num_params() == sum(p.numel() for p in model.parameters())


def test_user_model_factory(tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(
        textwrap.dedent("""
        import torch
        from torch import nn

        class Tiny(nn.Module):
            def __init__(self, width):
                super().__init__()
                self.fc = nn.Linear(width, 3)
                self.width = width

            def forward(self, x, y):
                return nn.functional.cross_entropy(self.fc(x), y)

            def example_inputs(self, batch_size):
                return torch.randn(batch_size, self.width), torch.zeros(batch_size, dtype=torch.long)

        def make(width=4):
            return Tiny(width)
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    model, spec = build_model("my_models:make", width=6)
    assert spec.task == "custom" and model.width == 6
    g = capture(model, example_inputs(spec, 5, model=model))
    assert g.nx.nodes["linear"]["out_shape"] == (5, 3)
    sys.modules.pop("my_models", None)


def test_bad_model_names_are_explained():
    with pytest.raises(ValueError, match="unknown model 'resnet51'.*resnet50"):
        build_model("resnet51")
    with pytest.raises(ValueError, match="cannot import module 'no_such_pkg.models'"):
        build_model("no_such_pkg.models:make")
    with pytest.raises(ValueError, match="has no callable 'nope'"):
        build_model("tensoropt.models.resnet:nope")
    _, spec = build_model("tensoropt.models.resnet:resnet50", device="meta", num_classes=10)
    with pytest.raises(ValueError, match="example_inputs"):
        example_inputs(spec, 2)
