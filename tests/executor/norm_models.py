"""Small models of group norm (PoolFormer's norm: ``nn.GroupNorm`` on NCHW activations)."""

from __future__ import annotations

import torch
from torch import nn


class GroupNormNet(nn.Module):
    """x [B, 3, 8, 8] -> conv -> GroupNorm(1 group, PoolFormer's) -> gelu -> conv -> GroupNorm(2 groups,
    no affine) -> mean over space -> linear -> logits [B, classes].

    Example:
        >>> GroupNormNet()(torch.randn(2, 3, 8, 8)).shape
        torch.Size([2, 4])
    """

    def __init__(self, classes: int = 4, channels: int = 8):
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1)
        self.norm1 = nn.GroupNorm(1, channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.norm2 = nn.GroupNorm(2, channels, affine=False)
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.gelu(self.norm1(self.conv1(x)))
        h = self.norm2(self.conv2(h))
        return self.head(h.mean((2, 3)))
