"""A tiny model with ``torch.stack`` and ``max(dim)`` (rotary ``rotate_every_two`` stacks; maxout
units take a max over a stacked dim), for tests/executor/test_stack_max.py's workers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class StackMax(nn.Module):
    """fc1 -> stack([h, 2h - 1], dim=-1) -> max over the stacked dim -> fc2 -> cross entropy.

    Example:
        >>> m = StackMax()
        >>> float(m(torch.randn(4, 8), torch.tensor([0, 1, 2, 3]))) > 0
        True
    """

    def __init__(self, width: int = 8, hidden: int = 16, classes: int = 4):
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        pair = torch.stack([h, h * 2 - 1], dim=-1)
        return F.cross_entropy(self.fc2(pair.max(dim=-1).values), labels)
