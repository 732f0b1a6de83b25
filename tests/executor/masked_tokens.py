"""Token sequences whose labels carry ``-100`` (ignored) positions, as a padded batch of a causal LM has.

Example:
    >>> ds = masked_tokens(num_samples=4, seq_len=8, vocab_size=16)
    >>> int((ds[1]["labels"] == -100).sum()) > 0
    True
"""

from __future__ import annotations

import torch

from tensoropt.models.contract import IGNORE_INDEX
from tensoropt.training.data import TokenSequences


class MaskedTokens(TokenSequences):
    """:class:`TokenSequences` with each sample's labels after its own length set to ``-100``."""

    def __init__(self, tokens: torch.Tensor, lengths: torch.Tensor):
        super().__init__(tokens)
        self.lengths = lengths

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        sample = super().__getitem__(i)
        sample["labels"][int(self.lengths[i]):] = IGNORE_INDEX
        return sample


def masked_tokens(num_samples: int, seq_len: int, vocab_size: int, seed: int = 0) -> MaskedTokens:
    """``num_samples`` sequences; sample ``i`` keeps labels up to a drawn length in ``[2, seq_len]``
    (odd samples shorter than ``seq_len``), the rest ``-100``.

    Example:
        >>> ds = masked_tokens(2, 8, 16)
        >>> bool((ds[1]["labels"][-3:] == -100).all()), bool((ds[1]["input_ids"] >= 0).all())
        (True, True)
    """
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab_size, (num_samples, seq_len), generator=g)
    lengths = torch.randint(2, seq_len + 1, (num_samples,), generator=g)
    lengths[1::2] = torch.clamp(lengths[1::2], max=seq_len - 3)
    return MaskedTokens(tokens, lengths)
