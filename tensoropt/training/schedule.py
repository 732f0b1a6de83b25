"""The learning-rate schedule of ``lr_scheduler``: linear warmup, then a constant, linear or cosine decay.

Step ``s`` (from 0; the ``s``-th optimizer update) uses ``lr * f(s)``:

* warmup, ``s < W``: ``f = (s + 1) / (W + 1)`` (torchtitan's linear warmup);
* then, with ``p = min(1, (s - W) / D)`` (``D``: ``decay_steps``, default the rest of the run) and
  ``r = min_lr_ratio``: constant ``f = 1``; linear ``f = 1 - (1 - r) p``; cosine
  ``f = r + (1 - r) (1 + cos(pi p)) / 2``.

:func:`make_scheduler` wraps :func:`lr_multiplier` in a ``torch.optim.lr_scheduler.LambdaLR``, whose
``state_dict()`` (its step count) goes into checkpoints, so a resumed run continues the curve.

Example:
    >>> f = schedule_function(warmup_steps=2, decay="linear", decay_steps=4, min_lr_ratio=0.5)
    >>> [round(f(s), 4) for s in range(7)]
    [0.3333, 0.6667, 1.0, 0.875, 0.75, 0.625, 0.5]
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

__all__ = ["lr_multiplier", "make_scheduler", "schedule_function"]


def lr_multiplier(step: int, *, warmup_steps: int, decay: str, decay_steps: int,
                  min_lr_ratio: float) -> float:
    """The factor of ``lr`` at update ``step`` (the formula in the module docstring).

    Example:
        >>> lr_multiplier(10, warmup_steps=0, decay="cosine", decay_steps=20, min_lr_ratio=0.1)
        0.55
    """
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    progress = min(1.0, (step - warmup_steps) / max(1, decay_steps))
    if decay == "constant":
        return 1.0
    if decay == "linear":
        return 1.0 - (1.0 - min_lr_ratio) * progress
    if decay == "cosine":
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"lr_scheduler.decay: {decay!r} is not constant | linear | cosine")


def schedule_function(*, warmup_steps: int = 0, decay: str = "constant", decay_steps: int | None = None,
                      min_lr_ratio: float = 0.0, total_steps: int | None = None) -> Callable[[int], float]:
    """``step -> factor`` for ``LambdaLR`` (``decay_steps`` empty: ``total_steps - warmup_steps``).

    Example:
        >>> round(schedule_function(decay="cosine", total_steps=10)(5), 6)
        0.5
    """
    if decay_steps is None:
        decay_steps = max(1, (total_steps or 1) - warmup_steps)
    return functools.partial(lr_multiplier, warmup_steps=warmup_steps, decay=decay, decay_steps=decay_steps,
                             min_lr_ratio=min_lr_ratio)


def make_scheduler(optimizer: torch.optim.Optimizer, section,
                   total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` over ``optimizer`` following the job's ``lr_scheduler`` section.

    Args:
        optimizer: its groups' ``lr`` is the peak rate (``optimizer.lr``).
        section: a :class:`tensoropt.config.LrSchedulerConfig`.
        total_steps: ``training.steps`` (the default decay length is the rest of the run).

    Example:
        >>> from tensoropt.config import LrSchedulerConfig
        >>> w = torch.nn.Parameter(torch.zeros(1)); opt = torch.optim.SGD([w], lr=1.0)
        >>> sched = make_scheduler(opt, LrSchedulerConfig(warmup_steps=1), 10)
        >>> opt.param_groups[0]["lr"], (opt.step(), sched.step(), opt.param_groups[0]["lr"])[2]
        (0.5, 1.0)
    """
    f = schedule_function(warmup_steps=section.warmup_steps, decay=section.decay,
                          decay_steps=section.decay_steps, min_lr_ratio=section.min_lr_ratio,
                          total_steps=total_steps)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, f)
