"""Byte sizes as people write them ("40GiB", "40 GB", "4e10") and as tables show them."""

from __future__ import annotations

import math
import re
from typing import Any

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*$")
SIZE_FORM = 'a size in bytes: an integer (17179869184), "4e10", or with a unit ("40GiB", "40 GiB", "40GB")'
"""How an error message describes an acceptable size."""


def parse_size(value: Any) -> int:
    """Parse a byte count: an int, a float with an integral value, or a string with a unit.

    Units: B, KB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB (powers of 1024); case and a
    space before the unit do not matter.

    Raises:
        ValueError: unparsable, negative, zero or fractional sizes.

    Example:
        >>> parse_size("40GiB"), parse_size("40 GB"), parse_size("4e10"), parse_size(17179869184)
        (42949672960, 40000000000, 40000000000, 17179869184)
    """
    if isinstance(value, bool):
        raise ValueError(f"got a boolean ({value})")
    if isinstance(value, int):
        number, scale = float(value), 1
        exact = value
    elif isinstance(value, float):
        number, scale, exact = value, 1, None
    elif isinstance(value, str):
        m = _SIZE_RE.match(value)
        if not m or m.group(2).lower() not in _SIZE_UNITS:
            raise ValueError(f"cannot parse {value!r} as a size")
        number, scale, exact = float(m.group(1)), _SIZE_UNITS[m.group(2).lower()], None
        if re.fullmatch(r"[+-]?\d+", m.group(1)):
            exact = int(m.group(1)) * scale
    else:
        raise ValueError(f"got {type(value).__name__} {value!r}")
    if exact is None:
        if not math.isfinite(number):
            raise ValueError(f"got {value!r}")
        total = number * scale
        if abs(total - round(total)) > 1e-6 * max(1.0, abs(total)):
            raise ValueError(f"{value!r} is not a whole number of bytes")
        exact = int(round(total))
    if exact < 0:
        raise ValueError(f"negative size {value!r}")
    if exact == 0:
        raise ValueError(f"size {value!r} is zero")
    return exact


def format_size(num_bytes: float) -> str:
    """Readable binary size, e.g. for tables.

    Example:
        >>> format_size(42949672960), format_size(1536), format_size(12)
        ('40.0 GiB', '1.5 KiB', '12 B')
    """
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
