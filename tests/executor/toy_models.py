"""Small models for the executor tests (each takes (inputs, labels) and returns the loss)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    """linear -> relu -> linear -> cross entropy."""

    def __init__(self, in_features: int = 8, hidden: int = 16, num_classes: int = 4):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x, y):
        return F.cross_entropy(self.fc2(F.relu(self.fc1(x))), y)


class CNN(nn.Module):
    """conv -> batch norm -> relu -> max pool -> flatten -> linear -> cross entropy."""

    def __init__(self, channels: int = 4, num_classes: int = 4):
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(channels)
        self.fc = nn.Linear(channels * 4 * 4, num_classes)

    def forward(self, x, y):
        h = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return F.cross_entropy(self.fc(h.flatten(1)), y)


class GPT(nn.Module):
    """One pre-norm transformer block with causal attention, tied embeddings."""

    def __init__(self, vocab_size: int = 16, width: int = 8, heads: int = 2, seq_len: int = 4):
        super().__init__()
        vocab, dim = vocab_size, width
        self.heads = heads
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq_len, dim)
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)
        self.lnf = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx, labels):
        b, t = idx.shape
        h = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        q, k, v = self.qkv(self.ln1(h)).split(h.shape[-1], dim=2)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.proj(a.transpose(1, 2).reshape(b, t, -1))
        h = h + self.out(F.gelu(self.fc(self.ln2(h))))
        logits = self.head(self.lnf(h))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


def mlp_dataset(step: int, global_batch_size: int, seed: int):
    """A dataset factory for the MLP: a fixed linear rule, different samples per step."""
    gen = torch.Generator().manual_seed(seed * 7919 + step)
    x = torch.randn(global_batch_size, 8, generator=gen)
    return x, (x[:, :4].argmax(dim=1))


def mlp_dataset_ignored(step: int, global_batch_size: int, seed: int):
    """:func:`mlp_dataset` with the first quarter of the labels ignored (-100): the ranks of a
    batch split hold different numbers of valid labels."""
    x, y = mlp_dataset(step, global_batch_size, seed)
    y[: global_batch_size // 4] = -100
    return x, y


class CLSHead(nn.Module):
    """linear over (batch, tokens, features) -> the first token's row -> linear -> cross entropy (a ViT's
    classifier head: the head reads one row of each sample)."""

    def __init__(self, features: int = 8, num_classes: int = 4):
        super().__init__()
        self.body = nn.Linear(features, features)
        self.head = nn.Linear(features, num_classes)

    def forward(self, x, y):
        return F.cross_entropy(self.head(self.body(x)[:, 0]), y)
