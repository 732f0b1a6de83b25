"""What every worker does on each (re)start of an elastic or resumable run (the worker side of
:mod:`tensoropt.elastic`, which holds the ``tensoropt run`` side and re-exports these names).

torchrun's elastic agent (c10d rendezvous) restarts every worker when a machine leaves or
joins; each start then

1. reads the world size and takes the plan for that many devices from ``frontier.json``,
   selected under the job's memory budget, rule and time limit (:func:`resolve_plan`); when the
   frontier file has no frontier for that count, it plans on the spot and says so. The plan may be
   pipelined where the worker runs pipelined plans (``select``'s ``pipelined``: the trainer's loop
   hands them to the pipelined runtime); the executor's worker does not, and they are left out;
2. builds the trainer for that plan, restores the newest complete checkpoint of the job into
   the plan's placements (:func:`tensoropt.checkpoint.resume`: parameters and optimizer state
   resharded) and resumes at the saved step: the data of a step depends only on the step, so the
   data order is the same as in an uninterrupted run;
3. trains until the job's total step count, saving a checkpoint every N steps and at the end
   (:func:`train_with_checkpoints`).

Rank 0 logs which plan runs at which world size (``[tensoropt] elastic: ...`` on stdout) and
appends one JSON line per start to ``CHECKPOINT_DIR/elastic-log.jsonl`` (:func:`record_start`: the
executor's worker here, the trainer's loop and the pipelined runtime after their own resume).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import torch.distributed as dist

EVENT_LOG = "elastic-log.jsonl"
"""Name of the per-start event log inside the checkpoint directory."""

HOLD_DIR_ENV = "TENSOROPT_TEST_HOLD_DIR"
"""Tests only: after each step (and its checkpoint), a worker waits while ``$DIR/hold-ws<world
size>`` exists (at most ``HOLD_MAX_S``; a number in the file: from that step on), so a test can
kill or add machines at a known step (:func:`hold_for_tests`)."""

HOLD_MAX_S = 180.0

RUNS_PIPELINED = ("`tensoropt run` starts the trainer's loop, which runs them, when the frontier file "
                  "has pipelined plans or the job's planner.pipeline is not off")
"""Where pipelined plans are run elastically (the way out a skipping worker's message gives)."""


class ElasticPlanError(RuntimeError):
    """No plan can be chosen for the current world size (message says why and what to do)."""


def world() -> tuple[int, int]:
    """(rank, world size) of this process: from the process group, else from torchrun's env.

    Example:
        >>> isinstance(world()[1], int)
        True
    """
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _log(message: str) -> None:
    if world()[0] == 0:
        print(f"[tensoropt] elastic: {message}", flush=True)


def select_for_world_size(world_size: int, frontier: str | Path | None = None, job: dict | None = None,
                          progress=None, pipelined: bool = False) -> tuple[dict, str]:
    """The plan.json document to run on ``world_size`` devices, and a line saying where it came from.

    Args:
        world_size: the device (process) count of this start.
        frontier: ``frontier.json``; its frontier for ``world_size`` is used when present.
        job: the job (``Job.to_dict()``) whose ``memory_budget``, ``select`` and ``max_time_s``
            select the plan, and which is planned on the spot for a count the frontier file
            lacks; default: the frontier file's job.
        progress: ``progress(message, fraction)`` while planning on the spot.
        pipelined: whether the caller runs pipelined plans (``tensoropt run``, the trainer's loop:
            :func:`tensoropt.training.pipelined.train_pipelined`); False leaves them out (the
            executor's worker, :mod:`tensoropt.training.worker`, does not drive stages) and lists
            them in the line.

    Raises:
        ElasticPlanError: no frontier file and no job, or no plan fits the budget at that count.

    Example:
        >>> # not run here: needs out/frontier.json from `tensoropt plan` and a process group
        >>> plan, line = select_for_world_size(2, "out/frontier.json")  # doctest: +SKIP
        >>> line  # doctest: +SKIP
        'world size 2: plan d2-p1 (fc: out=2) from out/frontier.json (rule fastest, budget 64 MiB)'
    """
    from tensoropt.config import Job, format_size
    from tensoropt.plans import FrontierFile, load_frontier_file, plan_file_text
    from tensoropt.selector import NoFeasiblePlan, select

    ff = load_frontier_file(frontier) if frontier is not None and Path(frontier).is_file() else None
    job_data = job if job is not None else (ff.job if ff is not None else None)
    if job_data is None:
        raise ElasticPlanError(f"world size {world_size}: no frontier file"
                               f"{f' at {frontier}' if frontier else ''} and no job to plan; "
                               "run `tensoropt plan JOB.yaml --out DIR` or pass the job")
    from tensoropt.job_model import resolve_job

    job_obj = resolve_job(Job.from_dict(job_data, "job"))  # as `plan` resolves it: same defaults and budget
    planned = ff.frontier(world_size) if ff is not None else None
    if planned is not None:
        source = f"from {frontier}"
        ff_n = FrontierFile(job=ff.job, frontiers=[planned], graph=ff.graph)  # graph: the margin's family
    else:
        from tensoropt.planner import plan_job

        had = f"{frontier} has no frontier for {world_size} devices" if ff is not None else "no frontier file"
        _log(f"world size {world_size}: {had}; planning on the spot")
        start = time.perf_counter()
        ff_n = plan_job(dataclasses.replace(job_obj, devices=[world_size]), progress)
        source = f"planned on the spot ({had}; {time.perf_counter() - start:.1f} s)"
    ff_n, skipped = (ff_n, []) if pipelined else without_pipelined_plans(ff_n)
    if not any(f.plans for f in ff_n.frontiers):
        raise ElasticPlanError(
            f"world size {world_size}: every plan of the frontier is pipelined ({', '.join(skipped)}), and "
            f"this worker does not run pipelined plans; {RUNS_PIPELINED}")
    try:
        chosen = select(ff_n, memory_budget_bytes=job_obj.memory_budget, devices=world_size,
                        rule=job_obj.select, max_time_s=job_obj.max_time_s)
    except NoFeasiblePlan as e:
        extra = (f" (pipelined plans {', '.join(skipped)} were not considered: this worker does not run "
                 f"them; {RUNS_PIPELINED})") if skipped else ""
        raise ElasticPlanError(f"world size {world_size}: {e}{extra}") from None
    budget = format_size(job_obj.memory_budget) if job_obj.memory_budget is not None else "no budget"
    plan = json.loads(plan_file_text(ff_n.to_json(), chosen.plan.id))
    summary = chosen.plan.summary or "no summary"
    line = (f"world size {world_size}: plan {chosen.plan.id} ({summary}) {source} "
            f"(rule {job_obj.select}, budget {budget})")
    if skipped:
        line += f"; pipelined plans skipped (this worker does not run them): {', '.join(skipped)}"
    return plan, line


def without_pipelined_plans(frontier_file):
    """``frontier_file`` without its pipelined plans (for a start through the executor's worker,
    which does not drive pipeline stages), and the ids left out.

    Example:
        >>> from tensoropt.plans import Frontier, FrontierFile, Mesh, Plan
        >>> staged = Plan("d2-p1", 0.4, 512, {}, pipeline={"stages": 2, "schedule": "1F1B",
        ...                                                 "micro_batches": 2, "blocks": [[0, 0], [1, 1]]})
        >>> ff = FrontierFile({}, [Frontier(2, Mesh((2,), ("gpu",)), [Plan("d2-p0", 0.5, 1024, {}), staged])])
        >>> kept, skipped = without_pipelined_plans(ff)
        >>> [p.id for p in kept.frontiers[0].plans], skipped
        (['d2-p0'], ['d2-p1'])
    """
    skipped = [p.id for f in frontier_file.frontiers for p in f.plans if p.pipeline]
    if not skipped:
        return frontier_file, []
    frontiers = [dataclasses.replace(f, plans=[p for p in f.plans if not p.pipeline])
                 for f in frontier_file.frontiers]
    return dataclasses.replace(frontier_file, frontiers=frontiers), skipped


def resolve_plan(select_options: dict) -> dict:
    """Rank 0 selects (or plans) for the current world size; every rank gets the plan document.

    ``select_options``: ``{"frontier": path or None, "job": Job.to_dict() or None, "pipelined":
    bool (default false: pipelined plans left out, :func:`select_for_world_size`)}`` (the worker's
    RUN.json ``select`` entry). Logs the choice.

    Example:
        >>> # not run here: needs out/frontier.json from `tensoropt plan` and a process group
        >>> plan = resolve_plan({"frontier": "out/frontier.json", "job": None})  # doctest: +SKIP
    """
    from tensoropt.checkpoint import broadcast

    rank, size = world()
    answer: tuple | Exception
    if rank == 0:
        try:
            answer = select_for_world_size(size, select_options.get("frontier"), select_options.get("job"),
                                           pipelined=bool(select_options.get("pipelined")))
        except Exception as e:  # noqa: BLE001 - re-raised on every rank
            answer = e
    else:
        answer = None
    answer = broadcast(answer)
    if isinstance(answer, Exception):
        raise answer
    plan, line = answer
    _log(f"{line} [restart {os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}]")
    return plan


def train_with_checkpoints(trainer, spec, total_steps: int, options: dict):
    """Resume from the newest checkpoint of the job, then train until ``total_steps``.

    Args:
        trainer: a fresh :class:`tensoropt.training.trainer.Trainer` (any plan, any world size).
        spec: its :class:`tensoropt.executor.job.spec.TrainSpec` (the job hash comes from it).
        total_steps: the job's total step count (``--steps``).
        options: ``{"dir": D, "every": N (0: only at the end), "keep": K (default 2),
            "verify_checksums": bool}``.

    Returns:
        The trainer's RunResult: only the global steps this start ran.

    Example:
        >>> # not run here: needs out/frontier.json from `tensoropt plan` and a process group
        >>> train_with_checkpoints(trainer, spec, 100, {"dir": "ckpt", "every": 10})  # doctest: +SKIP
    """
    from tensoropt.checkpoint import job_hash, resume, save_checkpoint

    root = Path(options["dir"])
    every = int(options.get("every") or 0)
    keep = int(options.get("keep", 2))
    spec_json = spec.to_json()
    hash_ = job_hash(spec_json)
    description = {k: v for k, v in spec_json.items() if k != "job"}  # the planner job is bulky
    size = world()[1]
    manifest = resume(trainer, root, hash_, bool(options.get("verify_checksums", True)))
    start = manifest.step if manifest is not None else 0
    if manifest is not None:
        _log(f"world size {size}: resumed at step {start} from {root / f'step-{start:08d}'} "
             f"(written by plan {manifest.plan_id} at world size {manifest.world_size}) "
             f"into plan {trainer.plan.plan_id}")
    else:
        _log(f"world size {size}: no checkpoint of this job in {root}; starting at step 0")
    if start >= total_steps:
        _log(f"the checkpoint is at step {start}, the total is {total_steps} (--steps): nothing to train")
    record_start(root, trainer.plan.plan_id, manifest.step if manifest is not None else None, total_steps)

    def after_step(done: int) -> None:
        if (every and done % every == 0) or done == total_steps:
            save_checkpoint(trainer, root, done, hash_, description, keep=keep)
        hold_for_tests(done, size)

    return trainer.train(max(0, total_steps - start), start_step=start, after_step=after_step)


def hold_for_tests(step: int, world_size: int) -> None:
    """The elastic tests' hold (:data:`HOLD_DIR_ENV`), called by every runtime after each step and
    its checkpoint: wait while ``$DIR/hold-ws<world_size>`` exists and holds no number, or one <=
    ``step`` (the first step to hold after), at most :data:`HOLD_MAX_S`; so a test can kill or add
    machines at a known step. Nothing without the variable.

    Example:
        >>> hold_for_tests(3, 2)  # no TENSOROPT_TEST_HOLD_DIR: returns at once
    """
    if not os.environ.get(HOLD_DIR_ENV):
        return
    hold = Path(os.environ[HOLD_DIR_ENV]) / f"hold-ws{world_size}"
    try:
        first = hold.read_text().strip()
    except OSError:
        return
    if first and step < int(first):
        return
    deadline = time.monotonic() + HOLD_MAX_S
    while hold.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def record_start(root: str | Path, plan_id: str | None, resumed_from: int | None, total_steps: int) -> dict:
    """Rank 0 appends this start's line to ``root/elastic-log.jsonl`` (:data:`EVENT_LOG`): ``time``,
    ``restart`` (torchrun's restart count), ``world_size``, ``plan_id``, ``start_step``,
    ``resumed_from`` (the checkpoint's step, null when the start found none) and ``total_steps``.
    Every runtime that checkpoints calls it once per start, after its resume: the executor's worker
    (:func:`train_with_checkpoints`), the trainer's loop and the pipelined runtime. Returns the event
    (every rank; only rank 0 writes it).

    Example:
        >>> import tempfile; d = tempfile.mkdtemp()
        >>> _ = record_start(d, "d1-p0", None, 8); _ = record_start(d, "d2-p4", 3, 8)
        >>> [(e["plan_id"], e["start_step"], e["resumed_from"]) for e in read_events(d)]
        [('d1-p0', 0, None), ('d2-p4', 3, 3)]
    """
    rank, size = world()
    event = {"time": time.time(), "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
             "world_size": size, "plan_id": plan_id, "start_step": resumed_from or 0,
             "resumed_from": resumed_from, "total_steps": int(total_steps)}
    if rank == 0:
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        with open(root / EVENT_LOG, "a") as f:
            f.write(json.dumps(event) + "\n")
    return event


def read_events(root: str | Path) -> list[dict]:
    """The per-start events of a checkpoint directory (oldest first; [] when none).

    Example:
        >>> read_events("/nonexistent")
        []
    """
    path = Path(root) / EVENT_LOG
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
