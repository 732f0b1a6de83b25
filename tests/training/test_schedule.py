"""The schedule LambdaLR applies is the documented formula, step by step, and a resumed scheduler
continues the curve exactly."""

from __future__ import annotations

import math

import pytest
import torch

from tensoropt.config import LrSchedulerConfig
from tensoropt.training.schedule import make_scheduler


def formula(s: int, lr: float, warmup: int, decay: str, decay_steps: int, r: float) -> float:
    """docs/user-guide.md's lr_scheduler rows, written out again."""
    if s < warmup:
        return lr * (s + 1) / (warmup + 1)
    p = min(1.0, (s - warmup) / decay_steps)
    cosine = r + (1 - r) * (1 + math.cos(math.pi * p)) / 2
    shape = {"constant": 1.0, "linear": 1 - (1 - r) * p, "cosine": cosine}
    return lr * shape[decay]


def rates(section: LrSchedulerConfig, steps: int, lr: float = 3e-4, stop: int | None = None):
    """The rate each update of a ``steps``-step run uses (the first ``stop`` of them), and the scheduler."""
    w = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([w], lr=lr)
    sched = make_scheduler(opt, section, steps)
    out = []
    for _ in range(stop or steps):
        out.append(opt.param_groups[0]["lr"])  # the rate this update uses
        w.grad = torch.ones(2)
        opt.step()
        sched.step()
    return out, sched


@pytest.mark.parametrize("decay", ["constant", "linear", "cosine"])
@pytest.mark.parametrize("warmup, decay_steps, r", [(0, None, 0.0), (5, None, 0.1), (3, 10, 0.5)])
def test_rate_of_every_step_is_the_formula(decay, warmup, decay_steps, r):
    steps = 30
    section = LrSchedulerConfig(warmup_steps=warmup, decay=decay, decay_steps=decay_steps, min_lr_ratio=r)
    got, _ = rates(section, steps)
    expected = [formula(s, 3e-4, warmup, decay, decay_steps or steps - warmup, r) for s in range(steps)]
    assert got == pytest.approx(expected, rel=1e-12, abs=0)
    if decay_steps and decay != "constant":  # the decay ends at min_lr_ratio * lr and stays there
        assert got[warmup + decay_steps:] == pytest.approx([3e-4 * r] * (steps - warmup - decay_steps))


def test_a_resumed_scheduler_continues_the_curve():
    section = LrSchedulerConfig(warmup_steps=4, decay="cosine", min_lr_ratio=0.1)
    full, _ = rates(section, 20)
    first, sched = rates(section, 20, stop=8)  # killed after 8 of 20 steps
    state = sched.state_dict()
    w = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([w], lr=3e-4)
    resumed = make_scheduler(opt, section, 20)
    resumed.load_state_dict(state)
    for group in opt.param_groups:  # what loading the optimizer's state dict restores in a real resume
        group["lr"] = resumed.get_last_lr()[0]
    rest = []
    for _ in range(12):
        rest.append(opt.param_groups[0]["lr"])
        resumed.step()
    assert first + rest == pytest.approx(full, rel=1e-12)
