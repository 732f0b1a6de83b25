"""A tiny language model whose head reads the token embedding's weight (a tied parameter), for the
tied-parameter pricing tests (importable by launched workers: ``tied_models:TiedLM``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH = 64, 16


class TiedLM(nn.Module):
    """Embedding, a nonlinearity, the head reading the embedding's weight, cross entropy."""

    def __init__(self, tie: bool = True):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        if tie:
            self.head.weight = self.emb.weight

    def forward(self, tokens, labels):
        logits = self.head(torch.tanh(self.emb(tokens)))
        return F.cross_entropy(logits.view(-1, VOCAB), labels.view(-1))
