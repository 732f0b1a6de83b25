"""Layout strings of the plan (``"R"``, ``"S(d)"``, ``"P"``) <-> DTensor placements.

A layout is one placement string per mesh axis (see
:mod:`tensoropt.configspace.configuration`). The executor compares the placements DTensor
really produced with the layouts the plan names, so every comparison normalises negative
shard dims first.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

from tensoropt.configspace.configuration import Configuration, Layout, shard_dim


def to_placements(layout: Sequence[str]) -> tuple[Placement, ...]:
    """DTensor placements of a layout.

    Example:
        >>> to_placements(("S(0)", "R", "P"))
        (Shard(dim=0), Replicate(), Partial(sum))
    """
    out: list[Placement] = []
    for p in layout:
        d = shard_dim(p)
        if d is not None:
            out.append(Shard(d))
        elif p == "R":
            out.append(Replicate())
        elif p == "P":
            out.append(Partial())
        else:
            raise ValueError(f"unknown placement {p!r} in layout {tuple(layout)}; "
                             "expected 'R', 'S(d)' or 'P'")
    return tuple(out)


def to_layout(placements: Sequence[Placement], ndim: int | None = None) -> Layout:
    """Layout strings of DTensor placements (negative shard dims normalised with ``ndim``).

    Example:
        >>> to_layout((Shard(-1), Replicate()), ndim=2)
        ('S(1)', 'R')
    """
    out = []
    for p in placements:
        if isinstance(p, Shard):
            d = p.dim + ndim if (p.dim < 0 and ndim is not None) else p.dim
            out.append(f"S({d})")
        elif p.is_partial():
            out.append("P")
        else:
            out.append("R")
    return tuple(out)


def raw_output_layout(config: Configuration) -> Layout:
    """The output layout before the operator's own partial-sum reduction.

    Example:
        >>> c = Configuration("in=2", (("in", (0,)),), (("S(1)",),), (), ("R",), partial_axes=(0,))
        >>> raw_output_layout(c)
        ('P',)
    """
    return tuple("P" if axis in config.partial_axes else p for axis, p in enumerate(config.output))


def without_partial(layout: Layout) -> Layout:
    """The layout with every ``"P"`` replaced by ``"R"`` (a valid redistribution target).

    Example:
        >>> without_partial(("P", "S(0)"))
        ('R', 'S(0)')
    """
    return tuple("R" if p == "P" else p for p in layout)


def normalise(layout: Sequence[str], ndim: int) -> Layout:
    """Layout with negative shard dims made non-negative.

    Example:
        >>> normalise(("S(-1)", "R"), 3)
        ('S(2)', 'R')
    """
    out = []
    for p in layout:
        if p.startswith("S(-"):
            out.append(f"S({int(p[2:-1]) + ndim})")
        else:
            out.append(p)
    return tuple(out)
