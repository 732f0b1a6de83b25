"""Models of the runtime benchmark (``benchmarks/runtime.py``): each ``forward(*inputs)`` returns the loss.

* :func:`block`: the issue's pre-norm transformer block (width 512, 8 heads, FFN 2048), MSE loss
  against a target of the same shape (Meta's autoparallel example);
* :func:`cnn`: conv + batch norm + relu + pool, twice, then a fully-connected head (16 x 16 images);
* :func:`hf`: a HuggingFace causal or masked LM built from a small config (``tensoropt.models.hf``,
  nothing downloaded), ``forward(input_ids, labels)`` returning its ``loss``.

Example:
    >>> m = block(width=16, heads=2, ffn=32)
    >>> float(m(torch.ones(2, 4, 16), torch.zeros(2, 4, 16))) >= 0
    True
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln1(x)), then + ffn(ln2(x)); loss = MSE to the target."""

    def __init__(self, width: int = 512, heads: int = 8, ffn: int = 2048):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, ffn)
        self.out = nn.Linear(ffn, width)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v)
        h = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        h = h + self.out(F.gelu(self.fc(self.ln2(h))))
        return F.mse_loss(h, target)


def block(width: int = 512, heads: int = 8, ffn: int = 2048) -> Block:
    """The issue's transformer block (see :class:`Block`).

    Example:
        >>> sum(p.numel() for p in block(width=8, heads=2, ffn=16).parameters())
        600
    """
    return Block(width, heads, ffn)


class CNN(nn.Module):
    """Two conv + batch norm + relu + max-pool stages, then a linear classifier; cross-entropy loss."""

    def __init__(self, channels: int = 32, num_classes: int = 10, image: int = 16):
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, 2 * channels, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(2 * channels)
        self.fc = nn.Linear(2 * channels * (image // 4) ** 2, num_classes)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return F.cross_entropy(self.fc(x.flatten(1)), labels)


def cnn(channels: int = 32, num_classes: int = 10, image: int = 16) -> CNN:
    """The conv + batch norm + pool + fc model (see :class:`CNN`).

    Example:
        >>> m = cnn(channels=4, num_classes=3, image=8)
        >>> float(m(torch.ones(2, 3, 8, 8), torch.tensor([0, 1]))) > 0
        True
    """
    return CNN(channels, num_classes, image)


class HFLoss(nn.Module):
    """A HuggingFace LM whose ``forward(input_ids, labels)`` returns the output's ``loss``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, labels=labels).loss


def hf(kind: str, **config) -> HFLoss:
    """``tensoropt.models.hf.<kind>(**config)`` (``gpt2``, ``bert``, ``llama``) returning its loss.

    Example:
        >>> m = hf("gpt2", n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
        >>> ids = torch.randint(0, 64, (2, 8)); float(m(ids, ids)) > 0
        True
    """
    from tensoropt.models import hf as hf_models

    return HFLoss(getattr(hf_models, kind)(**config))


class HFImageLoss(nn.Module):
    """A HuggingFace image classifier whose ``forward(pixel_values, labels)`` returns its ``loss``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values, labels=labels).loss


def hf_image(architecture: str, **config) -> HFImageLoss:
    """``tensoropt.models.hf_auto.build(architecture, **config)`` (an image classifier, e.g.
    ``ViTForImageClassification``, ``ResNetForImageClassification``) returning its loss.

    Example:
        >>> m = hf_image("ViTForImageClassification", hidden_size=16, num_hidden_layers=1,
        ...              num_attention_heads=2, intermediate_size=32, image_size=8, patch_size=4,
        ...              num_labels=3)
        >>> float(m(torch.randn(2, 3, 8, 8), torch.tensor([0, 2]))) > 0
        True
    """
    from tensoropt.models.hf_auto import build

    return HFImageLoss(build(architecture, **config))
