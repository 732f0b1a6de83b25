"""Models whose ops have no parallel rule (captured opaque) and no DTensor sharding strategy."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Patches(nn.Module):
    """x [B, 16] -> linear -> [B, 4, 4, 4] -> pixel_shuffle -> [B, 1, 8, 8] -> unfold (im2col) ->
    [B, 4, 16] -> linear per patch -> flatten -> logits [B, classes].

    ``aten.pixel_shuffle`` and ``aten.im2col`` have no parallel rule and no DTensor sharding strategy
    (only DTensor's experimental decomposition path, which fails for im2col's backward); gradients
    reach the first linear only through them.

    Example:
        >>> Patches()(torch.randn(2, 16)).shape
        torch.Size([2, 4])
    """

    def __init__(self, classes: int = 4):
        super().__init__()
        self.inp = nn.Linear(16, 64)
        self.patch = nn.Linear(4, 8)
        self.head = nn.Linear(8 * 16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x)).view(-1, 4, 4, 4)
        h = F.pixel_shuffle(h, 2)                      # [B, 1, 8, 8]
        h = F.unfold(h, kernel_size=2, stride=2)       # [B, 4, 16]
        h = torch.tanh(self.patch(h.transpose(1, 2)))  # [B, 16, 8]
        return self.head(h.flatten(1))
