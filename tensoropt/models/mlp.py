"""A multi-layer perceptron classifier whose forward returns the training loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    """Linear/ReLU stack with a classifier head; ``forward(x, labels)`` returns cross-entropy.

    Example:
        >>> m = MLP(in_features=8, hidden=(16,), num_classes=4)
        >>> m(torch.randn(2, 8), torch.tensor([0, 3])).shape
        torch.Size([])
    """

    def __init__(
        self, in_features: int = 1024, hidden: tuple[int, ...] = (4096, 4096), num_classes: int = 1000
    ):
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(self.body(x)), labels)
