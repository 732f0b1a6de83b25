"""The job's trainer keys on a pipelined run: optimizer groups, learning-rate schedule, clipping
across stages, metrics lines, validation and the exported model; and the worker that runs them:
``python -m tensoropt.training.pipelined RUN.json`` (the pipelined worker,
:mod:`tensoropt.pipeline_runtime.worker`, with this module's :class:`StageTrainer`).

What :mod:`tensoropt.training.loop` does for a plan run through ``tensoropt.parallelize``, done
for a rank holding one stage of a pipelined plan:

* ``optimizer`` (``no_decay`` groups, betas, eps, momentum): the stage's parameters, by the
  model's own names (:func:`tensoropt.training.optimizer.build_optimizer`);
* ``lr_scheduler``: ``LambdaLR`` of the same formula (:mod:`tensoropt.training.schedule`), counted
  from the step the run starts at (a resumed run continues the rate the checkpoint's step had);
* ``training.max_grad_norm``: the total norm over *every* stage's gradients, as
  ``torch.nn.utils.clip_grad_norm_`` computes it over the whole model: each stage's sum of squares,
  summed over the pipeline group after the data-parallel average (replicas hold equal gradients;
  a weight tied across stages counted once, on its first stage);
  every stage scales its gradients by ``max_norm / (norm + 1e-6)`` when that is below 1;
* ``metrics``: rank 0 writes ``metrics.jsonl`` (the contract's keys,
  :data:`tensoropt.training.metrics.METRIC_KEYS`) every ``log_every`` steps and the progress line;
  the step's loss is the last stage's, averaged over the replicas (one all-reduce of one number);
* ``validation``: every ``every`` steps (and after the last) the forward-only loss of ``steps``
  held-out global batches (the schedule's ``eval``), in ``validation.jsonl`` beside the metrics;
* ``checkpoint.export``: the consolidated model, gathered stage by stage to rank 0 and written by
  :func:`tensoropt.parallel.save.save_model` (``config.json`` beside it for an HF model).

Example:
    >>> # not run here: needs the process group of a pipelined run (tests/pipeline_runtime)
    >>> trainer = StageTrainer(runtime, job)  # doctest: +SKIP
    >>> trainer.start(first_step=30, total_steps=60)  # doctest: +SKIP
"""

from __future__ import annotations

import math
import sys
import time
import types
from pathlib import Path

import torch
import torch.distributed as dist

from tensoropt.config import Job, effective_optimizer
from tensoropt.job_model import tokens_per_sample
from tensoropt.training.loop import GlobalBatches, process_peak_bytes, step_flops, user_model_on_meta
from tensoropt.training.metrics import (
    VALIDATION_KEYS,
    MetricsLogger,
    ProgressLine,
    TensorBoardWriter,
    step_record,
)
from tensoropt.training.optimizer import build_optimizer
from tensoropt.training.schedule import schedule_function

UNSUPPORTED_KEYS: tuple[str, ...] = ()
"""Trainer keys a pipelined run does not honour yet (refused before any worker starts)."""


def clip_across_stages(parameters, max_norm: float, group=None, counted=None) -> float:
    """The total 2-norm of the gradients of every stage (``group``: the pipeline group; None: this
    process holds the whole model), and every gradient scaled by ``max_norm / (norm + 1e-6)`` when
    that is below 1, as ``torch.nn.utils.clip_grad_norm_`` does on one process; returns the norm
    before clipping. ``counted``: the parameters whose gradients the norm sums (default: all of
    ``parameters``; a weight tied across stages is counted on one of its stages only).

    Example:
        >>> w = torch.nn.Parameter(torch.zeros(2)); w.grad = torch.tensor([3.0, 4.0])
        >>> clip_across_stages([w], 1.0), [round(float(g), 4) for g in w.grad]
        (5.0, [0.6, 0.8])
    """
    parameters = list(parameters)
    grads = [p.grad for p in parameters if p.grad is not None]
    squares = torch.zeros((), dtype=torch.float64)
    for p in parameters if counted is None else counted:
        if p.grad is not None:
            squares += float(torch.linalg.vector_norm(p.grad.detach(), 2)) ** 2
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(squares, group=group)
    norm = math.sqrt(float(squares))
    coefficient = max_norm / (norm + 1e-6)
    if coefficient < 1.0:
        for g in grads:
            g.detach().mul_(coefficient)
    return norm


class StageTrainer:
    """The trainer keys of ``job`` on this rank's stage of ``runtime`` (see the module docstring).

    Build it before loading a checkpoint (it replaces the runtime's optimizer by the job's groups),
    then :meth:`start` at the first step, :meth:`before_update` inside each step (clipping), and
    :meth:`after_step` after it (scheduler, metrics).

    Args:
        runtime: the rank's :class:`tensoropt.pipeline_runtime.runtime.PipelineRuntime`.
        job: the job (its ``optimizer``, ``lr_scheduler``, ``training.max_grad_norm``, ``metrics``
            and ``checkpoint.export``).
        out_dir: where ``metrics.jsonl`` goes unless ``metrics.jsonl`` says.
    """

    def __init__(self, runtime, job: Job, out_dir: str | Path = "."):
        self.rt, self.job, self.total = runtime, job, 0
        self.out_dir = Path(out_dir)
        self.section = effective_optimizer(job)
        runtime.optimizer = build_optimizer(runtime.module.named_parameters(), self.section)
        self.max_norm = job.training.max_grad_norm or math.inf
        self.scheduler = None
        self.grad_norm: float | None = None
        self.log = self.bar = self.val_log = None
        self.records: list[dict] = []
        self.held_out = None
        if job.validation is not None:
            self.held_out = GlobalBatches(job, job.validation.data).source

    def start(self, first_step: int, total_steps: int) -> None:
        """Create the schedule at ``first_step`` (after a resume) of a run of ``total_steps`` (the
        default decay length is the rest of the run) and, on rank 0, the metrics sinks."""
        self.total = int(total_steps)
        optimizer = self.rt.optimizer
        for group in optimizer.param_groups:  # the peak rate: a checkpoint holds the scheduled one
            group["lr"] = self.section.lr
            group.pop("initial_lr", None)
        s = self.job.lr_scheduler
        f = schedule_function(warmup_steps=s.warmup_steps, decay=s.decay, decay_steps=s.decay_steps,
                              min_lr_ratio=s.min_lr_ratio, total_steps=self.total)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: f(k + first_step))
        self.flops, self.peak_flops = step_flops(self.job, self.rt.plan, self.rt.world)
        self.tokens = tokens_per_sample(self.job)  # per sample, for tokens_per_s (None: no token inputs)
        if self.rt.rank == 0:
            metrics = self.job.metrics
            tb = TensorBoardWriter(metrics.tensorboard) if metrics.tensorboard else None
            jsonl = Path(metrics.jsonl) if metrics.jsonl else self.out_dir / "metrics.jsonl"
            self.log = MetricsLogger(jsonl, tensorboard=tb, after_step=first_step)
            self.bar = ProgressLine(self.total)
            if self.held_out is not None:
                self.val_log = MetricsLogger(jsonl.with_name("validation.jsonl"), keys=VALIDATION_KEYS,
                                             tensorboard=tb, prefix="val/", after_step=first_step)

    @property
    def lr(self) -> float:
        """The rate the next update uses."""
        return float(self.rt.optimizer.param_groups[0]["lr"])

    def before_update(self) -> None:
        """Between the gradient sync and the optimizer step: the norm over every stage, clipped."""
        rt = self.rt
        self.grad_norm = clip_across_stages(rt.module.parameters(), self.max_norm, rt.mesh.get_group("pp"),
                                            rt.tied.counted(rt.module))

    def after_step(self, step: int, local_loss: float | None, lr: float, time_s: float) -> dict:
        """Advance the schedule; on rank 0 log ``step``'s record (``step`` counted from 0); validate
        when ``validation.every`` says."""
        self.scheduler.step()
        loss = self.rt.global_losses([local_loss])[0]
        batch = self.job.training.global_batch_size
        tokens = self.tokens
        record = step_record(step=step + 1, loss=loss, lr=lr, grad_norm=self.grad_norm, time_s=time_s,
                             samples=batch, tokens=batch * tokens if tokens else None, flops=self.flops,
                             peak_flops=self.peak_flops, devices=self.rt.world,
                             peak_bytes=process_peak_bytes(self.rt.device))
        self.records.append(record)
        if self.log is not None and ((step + 1) % self.job.metrics.log_every == 0 or step + 1 == self.total):
            self.log.log(record)
            self.bar.update(step + 1, loss=loss, lr=lr)
        every = self.job.validation.every if self.held_out is not None else 0
        if every and ((step + 1) % every == 0 or step + 1 == self.total):
            self.validate(step + 1)
        return record

    def validate(self, step: int) -> float:
        """The mean forward-only loss of ``validation.steps`` held-out global batches after ``step``
        updates (logged by rank 0 in ``validation.jsonl``)."""
        start = time.perf_counter()
        batches = self.job.validation.steps
        local = [self.rt.eval_loss(i, self.held_out) for i in range(batches)]
        loss = sum(self.rt.global_losses(local)) / batches
        if self.val_log is not None:
            self.val_log.log({"step": step, "loss": loss, "time_s": time.perf_counter() - start})
        return loss

    def finish(self) -> None:
        """Export the consolidated model when ``checkpoint.export`` says (collective); close the sinks."""
        try:
            if self.job.checkpoint.export:
                export_stages(self.rt, self.job, self.job.checkpoint.export)
        finally:
            for sink in (self.log, self.val_log, self.bar):
                if sink is not None:
                    sink.close()


def export_stages(runtime, job: Job, directory: str | Path) -> Path:
    """Write the whole model of a pipelined run as ``directory/model.safetensors`` (collective).

    Each stage's first replica sends its stage's tensors to rank 0 one at a time (point to point, as
    raw bytes: any dtype, and no rank but 0 ever holds more than its own stage), and rank 0 writes
    them in one file with :func:`tensoropt.parallel.save.save_model`: the keys of the user's model's
    ``state_dict()``, in its order (a job wrapper's ``model.`` prefix dropped, as
    ``tensoropt.parallelize``'s export does; non-persistent buffers left out).

    Example:
        >>> # not run here: collective over a pipelined run's processes
        >>> export_stages(runtime, job, "out/model")  # doctest: +SKIP
    """
    from tensoropt.parallel.save import save_model

    user = user_model_on_meta(job)
    names = list(user.state_dict())
    mine = {_user_key(k, names): v.detach() for k, v in runtime.module.state_dict().items()} \
        if runtime.dp_index == 0 else {}
    mine = {k: v for k, v in mine.items() if k in names}
    layout = [(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in mine.items()]
    layouts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(layout, layouts, dst=0)  # names, shapes and dtypes only: a few KiB
    gathered = {k: v.cpu() for k, v in mine.items()} if dist.get_rank() == 0 else {}
    for sender in range(1, dist.get_world_size()):
        if dist.get_rank() == sender:
            for value in mine.values():
                dist.send(_as_bytes(value.to(runtime.device)), dst=0)
        elif dist.get_rank() == 0:
            for key, shape, dtype in layouts[sender]:
                dtype = getattr(torch, dtype)
                count = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
                buffer = torch.empty(count, dtype=torch.uint8, device=runtime.device)
                dist.recv(buffer, src=sender)
                gathered[key] = buffer.cpu().view(dtype).reshape(shape)
    # the user's keys in the user's order; a stage's copies of non-persistent buffers (a causal
    # mask) are not in the model's state_dict and stay out of the file
    from tensoropt.pipeline_runtime.stage_modules import canonical_names

    aliases = canonical_names(user)  # a tied weight: its stages hold it by its first name only
    gathered.update({k: gathered[first] for k, first in aliases.items() if first in gathered})
    state = {k: gathered[k] for k in names if k in gathered}
    shim = types.SimpleNamespace(state_dict=lambda: state, config=getattr(user, "config", None))
    return save_model(shim, directory)


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s data as a flat uint8 tensor (what a send of any dtype carries)."""
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def _user_key(key: str, names: list[str]) -> str:
    """``key`` of a stage module as the user's model names it (a wrapper's ``model.`` dropped)."""
    if key not in names and key.startswith("model.") and key.removeprefix("model.") in names:
        return key.removeprefix("model.")
    return key


def train_pipelined(job: Job, plan: dict, *, out_dir: str | Path, steps: int | None = None,
                    checkpoint_dir: str | Path | None = None, checkpoint_every: int = 0,
                    keep_checkpoints: int = 2, compile: str = "none") -> list[dict]:
    """Train ``job`` with the pipelined ``plan`` on this rank (the process group exists), as
    :func:`tensoropt.training.loop.train` trains a plan without stages: resume from
    ``checkpoint_dir``'s newest checkpoint (either runtime, any device count wrote it), train to
    ``steps`` (default ``training.steps``) with the job's trainer keys (:class:`StageTrainer`),
    checkpoint every ``checkpoint_every`` steps and after the last, keeping the newest
    ``keep_checkpoints`` (0: all), and append this start's line to ``elastic-log.jsonl`` there, as
    the loop does (:func:`tensoropt.executor.state.restart.record_start`), with the stages' programs
    compiled by ``compile`` (``"none"`` or ``"inductor"``, the job's ``executor.compile`` or
    ``--compile``); returns rank 0's metrics records
    of the steps this start ran ([] on the other ranks). The trainer's loop hands a pipelined plan
    here (an elastic start that selected one).

    Every collective is bounded by ``TENSOROPT_COLLECTIVE_TIMEOUT_S`` (120 s by default).

    Example:
        >>> # not run here: needs the process group of a pipelined run (tests/elastic)
        >>> records = train_pipelined(job, plan, out_dir="out/job", checkpoint_dir="ckpt")  # doctest: +SKIP
    """
    import os

    from tensoropt.executor.job.spec import TrainSpec
    from tensoropt.pipeline_runtime.checkpoint import latest_pipelined_checkpoint
    from tensoropt.pipeline_runtime.worker import run

    total = int(steps if steps is not None else job.training.steps)
    spec = TrainSpec.from_job(job, steps=total)
    timeout_s = float(os.environ.get("TENSOROPT_COLLECTIVE_TIMEOUT_S", "120"))
    entry = {"spec": spec.to_json(), "plan": plan, "steps": total, "total_steps": total, "job": job.to_dict(),
             "out_dir": str(out_dir), "timeout_s": timeout_s, "compile": compile}
    if checkpoint_dir:
        entry.update(checkpoint_dir=str(checkpoint_dir), checkpoint_every=int(checkpoint_every or 0),
                     keep_checkpoints=int(keep_checkpoints))
        if latest_pipelined_checkpoint(checkpoint_dir) is not None:
            entry["resume_from"] = str(checkpoint_dir)
    metrics = run(entry, StageTrainer)
    return (metrics or {}).get("records") or []


def main(argv: list[str] | None = None) -> int:
    """``python -m tensoropt.training.pipelined RUN.json`` under torchrun: the pipelined worker
    (:func:`tensoropt.pipeline_runtime.worker.main`) with :class:`StageTrainer` for runs that set
    ``job``."""
    from tensoropt.pipeline_runtime.worker import main as worker_main

    return worker_main(sys.argv[1:] if argv is None else argv, trainer_factory=StageTrainer)


if __name__ == "__main__":
    sys.exit(main())
