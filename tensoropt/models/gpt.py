"""A GPT-style decoder-only language model (GPT-2 layout: pre-LN, learned positions, tied head)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tensoropt.models.transformer import Block


class GPT(nn.Module):
    """Decoder-only transformer; ``forward(tokens, labels)`` returns the next-token loss.

    Args:
        vocab_size: vocabulary. seq_len: maximum sequence length (positions and causal mask).
        layers, width, heads: depth, model width and attention heads. dropout: dropout rate.
        tie_weights: share the token embedding with the output head (GPT-2 does).

    Example:
        >>> m = GPT(vocab_size=64, seq_len=8, layers=1, width=16, heads=2)
        >>> tokens = torch.randint(0, 64, (2, 8))
        >>> m(tokens, tokens).shape
        torch.Size([])
    """

    def __init__(
        self,
        vocab_size: int = 50257,
        seq_len: int = 1024,
        layers: int = 12,
        width: int = 768,
        heads: int = 12,
        dropout: float = 0.1,
        tie_weights: bool = True,
    ):
        super().__init__()
        self.vocab_size = vocab_size
        self.wte = nn.Embedding(vocab_size, width)
        self.wpe = nn.Embedding(seq_len, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            Block(width, heads, seq_len, causal=True, pre_norm=True, dropout=dropout) for _ in range(layers)
        )
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)
        if tie_weights:
            self.head.weight = self.wte.weight

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        pos = torch.arange(t, device=tokens.device)
        x = self.drop(self.wte(tokens) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, self.vocab_size), labels.view(-1))
