"""A tiny regressor with an MSE loss (the batch-split mse_loss of tests/executor/test_mse_loss.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Regressor(nn.Module):
    """x [B, 8] -> linear -> gelu -> linear -> [B, 4]; ``F.mse_loss`` against the target [B, 4].

    ``reduction``: ``mean`` or ``sum``; ``scale``: when not 1, the loss is multiplied by it, so the
    loss feeds an operator (summed across ranks in forward) instead of being the graph's output.

    Example:
        >>> float(Regressor()(torch.zeros(2, 8), torch.zeros(2, 4))) >= 0
        True
    """

    def __init__(self, reduction: str = "mean", scale: float = 1.0):
        super().__init__()
        self.reduction, self.scale = reduction, scale
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(self.fc2(F.gelu(self.fc1(x))), target, reduction=self.reduction)
        return loss if self.scale == 1.0 else loss * self.scale
