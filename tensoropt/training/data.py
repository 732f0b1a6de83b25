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
    the inputs: an HF causal LM shifts them itself). ``ignored``: per sample, how many of its last
    labels are -100 (padding a token-mean loss leaves out)."""

    def __init__(self, tokens: torch.Tensor, ignored: torch.Tensor | None = None):
        self.tokens = tokens
        self.ignored = ignored

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        row = self.tokens[i]
        labels = row.clone()
        if self.ignored is not None and int(self.ignored[i]) > 0:
            labels[-int(self.ignored[i]):] = -100
        return {"input_ids": row, "labels": labels}


def random_tokens(num_samples: int, seq_len: int, vocab_size: int, seed: int = 0,
                  max_padding: int = 0) -> TokenSequences:
    """``num_samples`` sequences of ``seq_len`` tokens in ``[0, vocab_size)`` (another seed: held-out data).
    ``max_padding`` > 0: each sample's last 0..``max_padding`` labels (drawn per sample) are -100,
    as padded sequences are, so batches hold different numbers of counted tokens.

    Example:
        >>> a, b = random_tokens(2, 4, 10, seed=0), random_tokens(2, 4, 10, seed=1)
        >>> bool((a[0]["input_ids"] == b[0]["input_ids"]).all())
        False
        >>> padded = random_tokens(64, 8, 10, max_padding=6)
        >>> sorted({int((padded[i]["labels"] == -100).sum()) for i in range(64)})
        [0, 1, 2, 3, 4, 5, 6]
    """
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab_size, (num_samples, seq_len), generator=g)
    if not 0 <= max_padding < seq_len:
        raise ValueError(f"random_tokens: max_padding {max_padding} must be in [0, seq_len {seq_len})")
    ignored = torch.randint(0, max_padding + 1, (num_samples,), generator=g) if max_padding else None
    return TokenSequences(tokens, ignored)
