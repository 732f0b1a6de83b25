"""Transformer building blocks shared by the GPT and BERT models.

Attention uses ``F.scaled_dot_product_attention`` with an explicit boolean mask (a non-persistent
buffer) instead of ``is_causal=True``: DTensor cannot shard CPU flash attention nor
``is_causal`` (see the executor notes), while the math path with an explicit mask shards over
batch and heads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SelfAttention(nn.Module):
    """Multi-head self-attention with separate q, k, v projections.

    Separate projections (same parameter count as GPT-2's fused ``c_attn``) let a column split of
    each projection become a head split of attention without redistribution (the Megatron-LM
    pattern): the projection's output features map onto the heads dim through the view.

    Example:
        >>> a = SelfAttention(width=16, heads=4, max_seq=8, causal=True)
        >>> a(torch.randn(2, 8, 16)).shape
        torch.Size([2, 8, 16])
    """

    def __init__(self, width: int, heads: int, max_seq: int, causal: bool, dropout: float = 0.0):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not divisible by heads {heads}")
        self.heads = heads
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.v = nn.Linear(width, width)
        self.proj = nn.Linear(width, width)
        self.dropout = dropout
        self.causal = causal
        if causal:
            self.register_buffer(
                "mask", torch.ones(max_seq, max_seq, dtype=torch.bool).tril(), persistent=False
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (
            proj(x).view(b, t, self.heads, c // self.heads).transpose(1, 2)
            for proj in (self.q, self.k, self.v)
        )
        mask = self.mask[:t, :t] if self.causal else None
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class FeedForward(nn.Module):
    """Linear -> GELU -> Linear (4x expansion by default)."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.fc = nn.Linear(width, hidden)
        self.proj = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """A transformer layer: pre-LayerNorm (GPT) or post-LayerNorm (BERT) residual blocks."""

    def __init__(
        self, width: int, heads: int, max_seq: int, causal: bool, pre_norm: bool, dropout: float = 0.1
    ):
        super().__init__()
        self.pre_norm = pre_norm
        self.ln1 = nn.LayerNorm(width)
        self.attn = SelfAttention(width, heads, max_seq, causal)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = FeedForward(width, 4 * width)
        self.drop1 = nn.Dropout(dropout)
        self.drop2 = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.drop1(self.attn(self.ln1(x)))
            return x + self.drop2(self.mlp(self.ln2(x)))
        x = self.ln1(x + self.drop1(self.attn(x)))
        return self.ln2(x + self.drop2(self.mlp(x)))
