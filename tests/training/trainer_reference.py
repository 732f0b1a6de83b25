"""The plain 1-process PyTorch loop the trainer's loop must equal (same job, same initial weights)."""

from __future__ import annotations

import math

import torch

from tensoropt.config import Job, effective_optimizer
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.job_model import resolve_job
from tensoropt.training.loop import GlobalBatches
from tensoropt.training.optimizer import build_optimizer
from tensoropt.training.schedule import make_scheduler


def reference(job: Job, micro_batches: int, steps: int, final_state: dict | None = None) -> list[dict]:
    """Every step's loss (mean over micro-batches), learning rate and pre-clipping gradient norm
    (``torch.nn.utils.clip_grad_norm_``) of the job trained in one process; ``final_state``, when
    given, receives the trained model's ``state_dict()``. With ``validation``, the records of the
    steps it validates after also hold ``val_loss``: the mean loss of ``validation.steps`` held-out
    global batches, forward only."""
    job = resolve_job(job)
    spec = TrainSpec.from_job(job)
    model = spec.build_model()  # the executor's seeded initial weights, whole
    model.train()
    batches = GlobalBatches(job)
    opt = build_optimizer(model.named_parameters(), effective_optimizer(job))
    sched = make_scheduler(opt, job.lr_scheduler, steps)
    rows = job.training.global_batch_size // micro_batches
    max_norm = job.training.max_grad_norm or math.inf
    out = []
    for step in range(steps):
        lr = opt.param_groups[0]["lr"]
        batch = batches(step)
        loss = 0.0
        for i in range(micro_batches):
            args = [batch[n][i * rows:(i + 1) * rows] for n in batches.names]
            value = model(*args)
            value = value.loss if hasattr(value, "loss") else value
            (value / micro_batches).backward()
            loss += float(value.detach()) / micro_batches
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
        opt.step()
        sched.step()
        opt.zero_grad()
        out.append({"step": step + 1, "loss": loss, "lr": lr, "grad_norm": norm})
        every = job.validation.every if job.validation is not None else 0
        if every and ((step + 1) % every == 0 or step + 1 == steps):
            out[-1]["val_loss"] = _held_out_loss(model, job)
    if final_state is not None:
        final_state.update({k: v.detach().clone() for k, v in model.state_dict().items()})
    return out


def _held_out_loss(model: torch.nn.Module, job: Job) -> float:
    """The mean forward-only loss of ``validation.steps`` held-out global batches."""
    held_out = GlobalBatches(job, job.validation.data)
    total = 0.0
    with torch.no_grad():
        for i in range(job.validation.steps):
            batch = held_out(i)
            value = model(*[batch[n] for n in held_out.names])
            total += float(value.loss if hasattr(value, "loss") else value)
    return total / job.validation.steps
