"""A small map-style dataset of token sequences, for examples and tests of training and validation
(``data:`` and ``validation.data:`` factories; your own data goes there the same way).

Example:
    >>> ds = random_tokens(num_samples=4, seq_len=8, vocab_size=16, seed=1)
    >>> len(ds), sorted(ds[0]), ds[0]["input_ids"].shape
    (4, ['input_ids', 'labels'], torch.Size([8]))
"""

from __future__ import annotations

import torch

__all__ = ["TokenSequences", "random_tokens"]


class TokenSequences(torch.utils.data.Dataset):
    """Samples ``{"input_ids": [T], "labels": [T]}`` drawn once from a seeded generator (labels equal
    the inputs: an HF causal LM shifts them itself)."""

    def __init__(self, tokens: torch.Tensor):
        self.tokens = tokens

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        row = self.tokens[i]
        return {"input_ids": row, "labels": row.clone()}


def random_tokens(num_samples: int, seq_len: int, vocab_size: int, seed: int = 0) -> TokenSequences:
    """``num_samples`` sequences of ``seq_len`` tokens in ``[0, vocab_size)`` (another seed: held-out data).

    Example:
        >>> a, b = random_tokens(2, 4, 10, seed=0), random_tokens(2, 4, 10, seed=1)
        >>> bool((a[0]["input_ids"] == b[0]["input_ids"]).all())
        False
    """
    g = torch.Generator().manual_seed(seed)
    return TokenSequences(torch.randint(0, vocab_size, (num_samples, seq_len), generator=g))
