"""Training data: the same global batch for a given (seed, step) on every rank and world size.

Each rank generates the full global batch and keeps its shard (per the input node's layout),
so a plan at 4 processes sees exactly the batch the 1-process run sees.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from estimators.dtypes import torch_dtypes
from tensoropt.models.registry import load_factory  # noqa: F401 - the one factory loader, re-exported

_DTYPES = torch_dtypes()
"""Input dtype names -> torch dtypes (the one table: :data:`estimators.dtypes.DTYPE_BYTES`)."""


@dataclass(frozen=True)
class InputSpec:
    """One model input, per sample.

    Attributes:
        shape: per-sample shape (the batch dim is prepended).
        dtype: ``"float32"``, ``"int64"``, ...
        high: for integer inputs, values are drawn from ``[0, high)`` (classes, vocabulary).
    """

    shape: tuple[int, ...]
    dtype: str = "float32"
    high: int | None = None

    def __post_init__(self):
        if self.dtype not in _DTYPES:
            raise ValueError(f"InputSpec.dtype: unknown dtype {self.dtype!r}; expected one of "
                             f"{sorted(_DTYPES)}")
        if not self.dtype.startswith("float") and not self.high:
            raise ValueError(f"InputSpec.high: integer input of shape {self.shape} needs a positive 'high'")

    @staticmethod
    def from_json(data: dict) -> InputSpec:
        """From ``{"shape": [...], "dtype": ..., "high": ...}``."""
        return InputSpec(tuple(int(s) for s in data["shape"]), data.get("dtype", "float32"), data.get("high"))


def synthetic_batch(specs: list[InputSpec], global_batch_size: int, seed: int, step: int) -> tuple:
    """The global batch of ``step``: identical on every rank for the same seed and step.

    Example:
        >>> specs = [InputSpec((3,)), InputSpec((), "int64", high=5)]
        >>> x, y = synthetic_batch(specs, 4, seed=0, step=7)
        >>> x.shape, y.shape, bool((synthetic_batch(specs, 4, 0, 7)[0] == x).all())
        (torch.Size([4, 3]), torch.Size([4]), True)
    """
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    out = []
    for spec in specs:
        shape = (global_batch_size, *spec.shape)
        dtype = _DTYPES[spec.dtype]
        if dtype.is_floating_point:
            out.append(torch.randn(shape, generator=gen).to(dtype))
        else:
            out.append(torch.randint(0, spec.high, shape, generator=gen, dtype=dtype))
    return tuple(out)
