"""The trainer's loop over :func:`tensoropt.parallelize`: schedule, clipping, planned micro-batches,
live metrics, validation and the exported model, as the job's keys say.

One step reads like torchtitan's ``train.py``::

    batch = data(step)                                         # the global batch of this step
    for i, mb in enumerate(micro_batches(batch, m)):           # m: the plan's micro_batches
        with pm.no_sync() if i < m - 1 else nullcontext():     # gradients synchronised once
            loss += pm.train_step(mb, loss_scale=1 / m) / m
    grad_norm = pm.clip_grad_norm_(max_grad_norm or inf)       # the norm before clipping
    optimizer.step(); scheduler.step(); optimizer.zero_grad()

Every ``metrics.log_every`` steps rank 0 writes one line of ``metrics.jsonl``
(:mod:`tensoropt.training.metrics`) and redraws the progress line; every ``validation.every``
steps (and after the last) the mean forward-only loss of ``validation.steps`` held-out global
batches goes to ``validation.jsonl``; at the end ``checkpoint.export`` receives the consolidated
model (:func:`tensoropt.save_model`).

``python -m tensoropt.training.loop RUN.json`` is the torchrun entry (:func:`main`).

Example:
    >>> # not run here: needs torchrun and a plan
    >>> records = train(job, plan, out_dir="out/job")  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tensoropt.checkpoint.trainer_format import (
    FLAT_OPTIMIZER,
    TRAINER_STATE,
    optimizer_options,
    prune_checkpoints,
)
from tensoropt.config import Job, effective_optimizer
from tensoropt.training.metrics import (
    VALIDATION_KEYS,
    MetricsLogger,
    ProgressLine,
    TensorBoardWriter,
    step_record,
)
from tensoropt.training.optimizer import build_optimizer
from tensoropt.training.schedule import make_scheduler

__all__ = ["GlobalBatches", "latest_checkpoint", "load_checkpoint", "main", "process_peak_bytes",
           "save_checkpoint", "step_flops", "train", "user_model_on_meta"]


class GlobalBatches:
    """Step ``s``'s global batch ``{input name: tensor}`` of a job: synthetic rows (seeded per step,
    row and input, the same at every world size), the ``data`` section's dataset, or another
    ``{factory, kwargs}`` dataset (``validation.data``).

    Example:
        >>> job = Job.from_dict({"model": {"name": "mlp", "kwargs": {"in_features": 4, "hidden": [8],
        ...     "num_classes": 2}}, "cluster": "cpu-local", "devices": [1],
        ...     "training": {"global_batch_size": 2}})
        >>> {k: tuple(v.shape) for k, v in GlobalBatches(job)(0).items()}
        {'x': (2, 4), 'labels': (2,)}
    """

    def __init__(self, job: Job, data: dict | None = None):
        import dataclasses

        from tensoropt.executor.job.spec import TrainSpec
        from tensoropt.job_model import resolve_job

        job = resolve_job(job)
        if data is not None:
            job = dataclasses.replace(job, data=data)
        self.spec = TrainSpec.from_job(job)
        self.source = self.spec.batch_source()
        self.batch = self.spec.global_batch_size

    @property
    def names(self) -> tuple[str, ...]:
        """The inputs' names, in the step's order."""
        return self.source.names

    def __call__(self, step: int) -> dict[str, torch.Tensor]:
        regions = [tuple((0, n) for n in (self.batch, *s.shape)) for s in self.spec.inputs]
        return dict(zip(self.names, self.source.local(step, regions)))


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def user_model_on_meta(job: Job) -> torch.nn.Module:
    """The module ``parallelize`` takes: the job's (user) model on meta (a job wrapper's inner model).

    Example:
        >>> from tensoropt.config import load_job
        >>> type(user_model_on_meta(load_job("configs/jobs/mlp.yaml"))).__name__
        'MLP'
    """
    from tensoropt.job_model import build_job_model

    model = build_job_model(job, "meta")[0]
    return model.model if job.model.contract else model


def process_peak_bytes(device: torch.device) -> int:
    """This process's peak memory: the CUDA allocator's peak, or on CPUs the peak resident set.

    Example:
        >>> process_peak_bytes(torch.device("cpu")) > 0
        True
    """
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def step_flops(job: Job, plan: dict, devices: int) -> tuple[float | None, float | None]:
    """(the step's training FLOPs, one device's peak FLOP/s) from the plan's predicted MFU and time:
    what the metrics' ``mfu`` divides by. The FLOPs are None when the plan has no MFU.

    Example:
        >>> from tensoropt.config import load_job
        >>> flops, peak_flops = step_flops(load_job("configs/jobs/mlp.yaml"), {"mfu": 0.5, "time_s": 1.0}, 2)
        >>> flops == 0.5 * 1.0 * 2 * peak_flops  # MFU x time x devices x one device's peak
        True
    """
    from tensoropt.job_model import load_job_cluster
    from tensoropt.precision import get_precision

    peak = load_job_cluster(job).device.peak_flops(get_precision(job.training.precision).compute_dtype)
    if plan.get("mfu") is None or not plan.get("time_s"):
        return None, peak
    return float(plan["mfu"]) * float(plan["time_s"]) * devices * peak, peak


CHECKPOINT_PREFIX = "step-"
def latest_checkpoint(directory: str | Path | None) -> Path | None:
    """The newest complete checkpoint folder under ``directory`` (``step-<n>`` with its trainer.json).

    Example:
        >>> import tempfile; d = Path(tempfile.mkdtemp())
        >>> (d / "step-4").mkdir(); (d / "step-6").mkdir()
        >>> _ = (d / "step-4" / TRAINER_STATE).write_text("{}")
        >>> latest_checkpoint(d).name
        'step-4'
    """
    if directory is None or not Path(directory).is_dir():
        return None
    done = [p for p in Path(directory).glob(CHECKPOINT_PREFIX + "*") if (p / TRAINER_STATE).is_file()]
    return max(done, key=lambda p: int(p.name.removeprefix(CHECKPOINT_PREFIX)), default=None)


def save_checkpoint(directory: str | Path, step: int, pm, optimizer, scheduler, keep: int = 0) -> Path:
    """A DCP checkpoint of the model and optimizer state (DTensors: resharded on load at any device
    count) and the trainer's state: ``step`` updates done, the scheduler, the data position (the next
    global batch is step ``step``'s) and fp16-mixed's dynamic loss scale (null in other precisions).
    Then the newest ``keep`` complete checkpoints are kept (0: all;
    :func:`tensoropt.checkpoint.trainer_format.prune_checkpoints`)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    folder = Path(directory) / f"{CHECKPOINT_PREFIX}{step}"
    model_sd, optim_sd = get_state_dict(pm, optimizer, options=FLAT_OPTIMIZER)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(folder))
    if dist.is_initialized():
        dist.barrier()
    if _rank() == 0:
        scaler = pm.tensoropt_runtime.scaler
        state = {"step": step, "scheduler": scheduler.state_dict(), "data_position": step,
                 "loss_scale": scaler.state_dict() if scaler is not None else None,
                 "world_size": _world(), "plan_id": pm.plan.plan_id}
        (folder / TRAINER_STATE).write_text(json.dumps(state))
        prune_checkpoints(directory, step, keep)
    if dist.is_initialized():
        dist.barrier()
    return folder


def load_checkpoint(folder: Path, pm, optimizer, scheduler) -> int:
    """Load a :func:`save_checkpoint` folder into this run (any device count); returns its step.

    A pipelined run's checkpoint (:mod:`tensoropt.pipeline_runtime.checkpoint`, the same layout,
    :mod:`tensoropt.checkpoint.trainer_format`) loads too: its schedule is a function of the step, so
    the scheduler is set to that step's rate."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    options = optimizer_options(folder)
    model_sd, optim_sd = get_state_dict(pm, optimizer, options=options)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(pm, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=options)
    trainer = json.loads((folder / TRAINER_STATE).read_text())
    if trainer.get("scheduler") is not None:
        scheduler.load_state_dict(trainer["scheduler"])
    else:  # LambdaLR after `step` steps: base rate x the schedule's factor at that step
        scheduler.last_epoch = int(trainer["step"])
        scheduler._last_lr = [base * f(scheduler.last_epoch)  # noqa: SLF001 - what step() sets
                              for base, f in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    pm.tensoropt_runtime.load_loss_scale(trainer.get("loss_scale"))
    for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
        group["lr"] = lr
    return int(trainer["step"])


def train(job: Job, plan: dict | str | Path, *, out_dir: str | Path, steps: int | None = None,
          stream=None, mode: str = "replay", checkpoint_dir: str | Path | None = None,
          checkpoint_every: int = 0, keep_checkpoints: int = 2, stop_after: int | None = None,
          hold_after: int | None = None, compile: str = "none") -> list[dict]:
    """Train ``job`` with ``plan`` on this rank (under torchrun, or one process); returns the metrics
    records of every step (rank 0 also writes them, every ``log_every`` steps).

    Args:
        job: the job (its trainer keys: optimizer, lr_scheduler, training.max_grad_norm, metrics,
            validation, checkpoint.export).
        plan: plan.json's path or content; its ``micro_batches`` is the step's count.
        out_dir: where ``metrics.jsonl`` and ``validation.jsonl`` go unless ``metrics.jsonl`` says.
        steps: overrides ``training.steps``.
        stream: the progress line's stream (default stderr).
        mode: the executor mode (replay | interpret).
        checkpoint_dir: resume from its newest checkpoint (if any) and write one every
            ``checkpoint_every`` steps (and at the end), keeping the newest ``keep_checkpoints``
            (0: all); each start appends its line to ``checkpoint_dir/elastic-log.jsonl``
            (:func:`tensoropt.executor.state.restart.record_start`).
        stop_after: end after this step as if killed there (tests of resume).
        hold_after: after this step (and its checkpoint, when one is due) wait to be killed: a test
            kills the processes there, at a known step (:data:`HOLD_MAX_S` at most, then an error).
        compile: ``"none"`` or ``"inductor"`` (``executor.compile``: the replayed program compiled).
    """
    from tensoropt.job_model import resolve_job, tokens_per_sample
    from tensoropt.parallel import micro_batches, parallelize, save_model

    plan = json.loads(Path(plan).read_text()) if isinstance(plan, (str, Path)) else plan
    job = resolve_job(job)
    total = int(steps if steps is not None else job.training.steps)
    m = int(plan.get("micro_batches", 1))
    pm = parallelize(user_model_on_meta(job), plan, mode=mode, compile=compile)
    optimizer = build_optimizer(pm.named_parameters(), effective_optimizer(job))
    scheduler = make_scheduler(optimizer, job.lr_scheduler, total)
    batches = GlobalBatches(job)
    held_out = GlobalBatches(job, job.validation.data) if job.validation is not None else None
    device = pm.tensoropt_runtime.device
    batch = job.training.global_batch_size
    tokens = tokens_per_sample(job)
    flops, peak_flops = step_flops(job, plan, _world())
    max_norm = job.training.max_grad_norm or math.inf
    rank0 = _rank() == 0
    out_dir = Path(out_dir)
    log = val_log = bar = None
    records = []
    first = 0
    resume = latest_checkpoint(checkpoint_dir)
    if resume is not None:
        first = load_checkpoint(resume, pm, optimizer, scheduler)
        if rank0:
            print(f"[tensoropt] resumed from {resume} at step {first} on {_world()} process(es)", flush=True)
    if checkpoint_dir:
        from tensoropt.executor.state.restart import record_start

        record_start(checkpoint_dir, plan.get("id"), first if resume is not None else None, total)
    if rank0:  # the logs keep the steps up to where this run starts (a restart rewrites the rest)
        tb = TensorBoardWriter(job.metrics.tensorboard) if job.metrics.tensorboard else None
        jsonl = Path(job.metrics.jsonl) if job.metrics.jsonl else out_dir / "metrics.jsonl"
        log = MetricsLogger(jsonl, tensorboard=tb, after_step=first)
        val_log = MetricsLogger(jsonl.with_name("validation.jsonl"), keys=VALIDATION_KEYS, tensorboard=tb,
                                prefix="val/", after_step=first) if held_out is not None else None
        bar = ProgressLine(total, stream=stream)
    last = min(total, stop_after) if stop_after is not None else total
    try:
        for step in range(first, last):
            start = time.perf_counter()
            lr = optimizer.param_groups[0]["lr"]  # the rate this step's update uses
            loss = 0.0
            for i, mb in enumerate(micro_batches(batches(step), m)):
                defer = pm.no_sync() if i < m - 1 else contextlib.nullcontext()
                with defer:
                    loss += float(pm.train_step(mb, loss_scale=1.0 / m)) / m
            grad_norm = float(pm.clip_grad_norm_(max_norm))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            time_s = time.perf_counter() - start
            record = step_record(step=step + 1, loss=loss, lr=lr, grad_norm=grad_norm, time_s=time_s,
                                 samples=batch, tokens=batch * tokens if tokens else None, flops=flops,
                                 peak_flops=peak_flops, devices=_world(),
                                 peak_bytes=process_peak_bytes(device))
            records.append(record)
            if rank0 and ((step + 1) % job.metrics.log_every == 0 or step + 1 == total):
                log.log(record)
                bar.update(step + 1, loss=loss, lr=lr)
            if held_out is not None and ((step + 1) % job.validation.every == 0 or step + 1 == total):
                _validate(pm, held_out, job.validation.steps, step + 1, val_log)
            every = checkpoint_every and (step + 1) % checkpoint_every == 0
            if checkpoint_dir and (every or step + 1 == last):
                save_checkpoint(checkpoint_dir, step + 1, pm, optimizer, scheduler, keep=keep_checkpoints)
            if hold_after is not None and step + 1 == hold_after:
                _hold(step + 1, log)
            _elastic_hold(step + 1, log)
        if last < total:
            return records
        if job.checkpoint.export:
            save_model(pm, job.checkpoint.export)
    finally:
        for thing in (log, val_log, bar):
            if thing is not None:
                thing.close()
    return records


HOLD_MAX_S = 300.0
"""How long ``hold_after`` waits to be killed before it gives up with an error."""


def _hold(step: int, log: MetricsLogger | None) -> None:
    """Wait here (after ``step``) until this process is killed; an error after :data:`HOLD_MAX_S`."""
    if log is not None:
        log.stream.flush()
    print(f"[tensoropt] holding after step {step} (hold_after) until killed", flush=True)
    deadline = time.monotonic() + HOLD_MAX_S
    while time.monotonic() < deadline:
        time.sleep(0.05)
    raise RuntimeError(f"hold_after: nobody killed this process within {HOLD_MAX_S:.0f} s after step {step}")


def _elastic_hold(step: int, log: MetricsLogger | None) -> None:
    """The elastic tests' hold (:func:`tensoropt.executor.state.restart.hold_for_tests`) after
    ``step`` and its checkpoint, the metrics written first; nothing without the variable."""
    from tensoropt.executor.state.restart import HOLD_DIR_ENV, hold_for_tests

    if not os.environ.get(HOLD_DIR_ENV):
        return
    if log is not None:
        log.stream.flush()
    hold_for_tests(step, _world())


def _validate(pm, held_out: GlobalBatches, batches: int, step: int, log: MetricsLogger | None) -> float:
    """The mean forward-only loss of ``batches`` held-out global batches (logged by rank 0)."""
    start = time.perf_counter()
    loss = sum(float(pm.eval_step(held_out(i))) for i in range(batches)) / batches
    if log is not None:
        log.log({"step": step, "loss": loss, "time_s": time.perf_counter() - start})
    return loss


def main(argv: list[str] | None = None) -> int:
    """``python -m tensoropt.training.loop RUN.json`` under torchrun: RUN.json holds ``job`` (the
    job's dict), ``plan`` (plan.json's content or path; null: ``select``, the options of
    :func:`tensoropt.executor.state.restart.resolve_plan`, choose it for this start's world size),
    ``out_dir``, optional ``steps``, ``mode``, ``compile`` (``executor.compile``, for either runtime),
    ``checkpoint_dir``, ``checkpoint_every``,
    ``keep_checkpoints`` (default 2), ``stop_after``, ``hold_after`` and ``records`` (a path: rank 0
    writes every step's record there as JSON). A plan whose ``"pipeline"`` is set (an elastic start
    with ``select``'s ``pipelined`` may select one) trains on the pipelined runtime with the same keys
    (:func:`tensoropt.training.pipelined.train_pipelined`; ``stop_after`` and ``hold_after`` are
    this loop's only); the checkpoints of both resume under either."""
    argv = sys.argv[1:] if argv is None else argv
    config = json.loads(Path(argv[0]).read_text())
    from tensoropt.parallel import init_distributed

    init_distributed()
    try:
        plan = config["plan"]
        if plan is None:  # elastic or resumed without --plan: this start's device count chooses
            from tensoropt.executor.state.restart import resolve_plan

            plan = resolve_plan(config["select"])
        keep = int(config.get("keep_checkpoints", 2))
        if plan.get("pipeline"):  # a pipelined plan (elastic starts may select one): its stages' runtime
            from tensoropt.training.pipelined import train_pipelined

            records = train_pipelined(Job.from_dict(config["job"]), plan, out_dir=config["out_dir"],
                                      steps=config.get("steps"), checkpoint_dir=config.get("checkpoint_dir"),
                                      checkpoint_every=int(config.get("checkpoint_every", 0)),
                                      keep_checkpoints=keep, compile=config.get("compile", "none"))
        else:
            records = train(Job.from_dict(config["job"]), plan, out_dir=config["out_dir"],
                            steps=config.get("steps"), mode=config.get("mode", "replay"),
                            checkpoint_dir=config.get("checkpoint_dir"),
                            checkpoint_every=int(config.get("checkpoint_every", 0)), keep_checkpoints=keep,
                            stop_after=config.get("stop_after"), hold_after=config.get("hold_after"),
                            compile=config.get("compile", "none"))
        if _rank() == 0 and config.get("records"):
            Path(config["records"]).write_text(json.dumps(records))
        return 0
    except BaseException as err:  # noqa: BLE001 - every failure must end this rank visibly
        print(f"[tensoropt] rank {os.environ.get('RANK', '0')} failed: {type(err).__name__}: {err}",
              file=sys.stderr, flush=True)
        raise
    finally:
        from tensoropt.executor.state.worker import end_process_group

        end_process_group()


if __name__ == "__main__":
    sys.exit(main())
