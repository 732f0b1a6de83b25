"""How much memory a solve may keep, and the error raised past it.

FT keeps every table it computes (the back-pointers that rebuild plans), so an exact solve of a
large space can outgrow the machine; the kernel would then be killed by the operating system
without a word. :class:`frontier.combine.Combiner` counts the bytes of the tables it keeps and
raises :class:`SolverMemoryError` past the limit, with what to change.
"""

from __future__ import annotations

import os

#: Environment variable overriding the limit, in GiB (``0``: no limit).
ENV = "TENSOROPT_SOLVER_MEMORY_GIB"
#: Share of the memory available when the solve starts that its tables may take.
SHARE = 0.6


class SolverMemoryError(MemoryError):
    """The frontier tables of a solve outgrew its memory limit."""


def available_bytes() -> int | None:
    """Memory the system can still give (``MemAvailable`` of /proc/meminfo); None where unknown.

    Example:
        >>> n = available_bytes()
        >>> n is None or n > 0
        True
    """
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def default_limit_bytes() -> float | None:
    """The limit of a solve: ``$TENSOROPT_SOLVER_MEMORY_GIB`` GiB, else 60 % of the available memory.

    Example:
        >>> limit = default_limit_bytes()
        >>> limit is None or limit > 0
        True
    """
    env = os.environ.get(ENV)
    if env:
        try:
            gib = float(env)
        except ValueError:
            raise ValueError(f"{ENV}={env!r}: expected a number of GiB (0 for no limit)") from None
        return gib * 2**30 if gib > 0 else None
    free = available_bytes()
    return SHARE * free if free else None


def limit_message(kept_bytes: float, limit_bytes: float) -> str:
    """What :class:`SolverMemoryError` says: how much, and what would make the solve smaller.

    Example:
        >>> limit_message(3 * 2**30, 2 * 2**30).split(";")[0]
        'the frontier tables reached 3.0 GiB, past the solver limit of 2.0 GiB'
    """
    return (f"the frontier tables reached {kept_bytes / 2**30:.1f} GiB, past the solver limit of "
            f"{limit_bytes / 2**30:.1f} GiB; solve a smaller space (a larger epsilon, fewer "
            f"configurations per operator, fewer memory options) or raise the limit with {ENV}")
