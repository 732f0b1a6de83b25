"""A BERT-style encoder trained with the masked-language-model loss (BERT-base layout)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tensoropt.models.transformer import Block


class BERT(nn.Module):
    """Post-LN encoder with token/position/segment embeddings and a tied MLM head.

    ``forward(tokens, labels)`` returns the cross-entropy of predicting ``labels`` at every
    position (the MLM objective with every position scored, so shapes are static).

    Example:
        >>> m = BERT(vocab_size=64, seq_len=8, layers=1, width=16, heads=2)
        >>> tokens = torch.randint(0, 64, (2, 8))
        >>> m(tokens, tokens).shape
        torch.Size([])
    """

    def __init__(
        self,
        vocab_size: int = 30522,
        seq_len: int = 512,
        layers: int = 12,
        width: int = 768,
        heads: int = 12,
        type_vocab: int = 2,
        dropout: float = 0.1,
    ):
        super().__init__()
        self.vocab_size = vocab_size
        self.word = nn.Embedding(vocab_size, width)
        self.position = nn.Embedding(seq_len, width)
        self.segment = nn.Embedding(type_vocab, width)
        self.register_buffer("segment_ids", torch.zeros(seq_len, dtype=torch.long), persistent=False)
        self.ln_emb = nn.LayerNorm(width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            Block(width, heads, seq_len, causal=False, pre_norm=False, dropout=dropout) for _ in range(layers)
        )
        self.transform = nn.Linear(width, width)
        self.ln_head = nn.LayerNorm(width)
        self.decoder = nn.Linear(width, vocab_size)
        self.decoder.weight = self.word.weight

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        pos = torch.arange(t, device=tokens.device)
        x = self.word(tokens) + self.position(pos) + self.segment(self.segment_ids[:t])
        x = self.drop(self.ln_emb(x))
        for block in self.blocks:
            x = block(x)
        logits = self.decoder(self.ln_head(F.gelu(self.transform(x))))
        return F.cross_entropy(logits.view(-1, self.vocab_size), labels.view(-1))
