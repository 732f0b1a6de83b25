"""The one dtype table: dtype names (as torch spells them) and their bytes per element.

Everything that turns a dtype name into a size (capture's tensor bytes, the cost model's memory
and roofline traffic) or into a ``torch.dtype`` (the executor's synthetic inputs and model cast)
reads it here. It lives in ``estimators/`` (no torch at import time: :func:`torch_dtype` imports
torch when called) so that the cost model and ``tensoropt`` share it.
"""

from __future__ import annotations

DTYPE_BYTES = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "complex128": 16,
    "complex64": 8,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint64": 8,
    "uint32": 4,
    "uint16": 2,
    "uint8": 1,
    "bool": 1,
}
"""Bytes per element of each dtype name (``torch.<name>.itemsize``)."""

UNKNOWN_DTYPE_BYTES = 4
"""What :func:`itemsize` answers for a name not in :data:`DTYPE_BYTES` (a float32's size)."""


def itemsize(dtype) -> int:
    """Bytes per element of a dtype name or ``torch.dtype`` (:data:`UNKNOWN_DTYPE_BYTES` when unknown).

    Example:
        >>> itemsize("bfloat16"), itemsize("int64"), itemsize("torch.float32")
        (2, 8, 4)
    """
    return DTYPE_BYTES.get(str(dtype).replace("torch.", ""), UNKNOWN_DTYPE_BYTES)


def torch_dtype(name: str):
    """The ``torch.dtype`` of a name in :data:`DTYPE_BYTES`; ValueError naming the choices otherwise.

    Example:
        >>> torch_dtype("bfloat16")
        torch.bfloat16
    """
    if name not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(DTYPE_BYTES)}")
    import torch

    return getattr(torch, name)


def torch_dtypes() -> dict:
    """``{name: torch.dtype}`` for every name of the table.

    Example:
        >>> torch_dtypes()["int64"]
        torch.int64
    """
    return {name: torch_dtype(name) for name in DTYPE_BYTES}
