"""Models that make tensor constants in ``forward`` (lifted by torch.export), for the executor tests.

Two HuggingFace architectures whose ``forward`` builds a tensor from Python data, and a small
reproducer of each way of doing it:

* ``torch.tensor(value, device=x.device)``: GPT-Neo's attention mask value (:func:`gpt_neo`,
  :class:`ScalarConstant`);
* a list index, ``x[..., [-2]]``: Falcon's split of its fused query/key/value (:func:`falcon`,
  :class:`ListIndexConstant`);

and one whose constant has no value before the weights exist (:class:`MetaConstant`).
"""

from __future__ import annotations

import importlib

import torch
from torch import nn


def gpt_neo(**config) -> nn.Module:
    """``GPTNeoForCausalLM`` from ``GPTNeoConfig(**config)`` (``use_cache`` off)."""
    transformers = importlib.import_module("transformers")
    return transformers.GPTNeoForCausalLM(transformers.GPTNeoConfig(use_cache=False, **config))


def falcon(**config) -> nn.Module:
    """``FalconForCausalLM`` from ``FalconConfig(**config)`` (``use_cache`` off)."""
    transformers = importlib.import_module("transformers")
    return transformers.FalconForCausalLM(transformers.FalconConfig(use_cache=False, **config))


class ScalarConstant(nn.Module):
    """A causal mask filled with ``torch.tensor(finfo.min, device=...)``, as GPT-Neo does."""

    def __init__(self, width: int = 16, classes: int = 4):
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, classes)

    def forward(self, x):
        h = self.fc1(x)
        low = torch.tensor(torch.finfo(h.dtype).min, dtype=h.dtype, device=h.device)
        h = torch.where(h > 0, h, low * 0 + h * 0.1)
        return self.fc2(h)


class ListIndexConstant(nn.Module):
    """Columns picked with a Python list index (a lifted int64 constant), as Falcon does."""

    def __init__(self, width: int = 16, classes: int = 4):
        super().__init__()
        self.fc1 = nn.Linear(width, width + 2)
        self.fc2 = nn.Linear(width + 1, classes)

    def forward(self, x):
        h = self.fc1(x)
        h = torch.cat([h[..., :-2], h[..., [-2]] * h[..., [-1]]], dim=-1)
        return self.fc2(h)


class MetaConstant(nn.Module):
    """A constant made on the meta device itself: it can have no value, whatever the executor does."""

    def __init__(self, width: int = 16, classes: int = 4):
        super().__init__()
        self.fc = nn.Linear(width, classes)

    def forward(self, x):
        scale = torch.tensor([2.0], device="meta").to(x.device)
        return self.fc(x) * scale
