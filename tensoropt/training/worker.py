"""The process torchrun starts: ``python -m tensoropt.training.worker RUN.json``.

RUN.json: ``{"spec": TrainSpec.to_json(), "runs": [{"plan": plan.json dict, "metrics": path,
"params_out": path or null, "spec": optional per-run TrainSpec}, ...], "steps": S,
"start_step": 0, "fail_at": null or {"rank": r, "step": s}, "executor": {"mode": "replay" | "interpret",
"compile": "none" | "inductor"}}`` (``fail_at`` injects an error on one rank, to test that every rank
then ends promptly; ``executor``, also per run, picks the runtime: :class:`Trainer`).
A run may give ``"select": {"frontier": path, "job": Job dict}`` instead of ``"plan"`` (the plan for
the current world size is selected, or planned, at start: :mod:`tensoropt.executor.state.restart`), and
``"checkpoint": {"dir", "every", "keep"}`` to resume from and save checkpoints; ``steps`` is then
the total step count.
Several runs (plans) share one process group, so tests pay for one launch.

An exception on any rank prints the traceback with the rank and exits non-zero; torchrun then
stops the other ranks (and collectives time out after ``TENSOROPT_COLLECTIVE_TIMEOUT_S``, 120 s
by default, should one still wait).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from estimators.files import write_text_atomic
from tensoropt.executor.job.plan import ExecPlan
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.executor.state import restart
from tensoropt.executor.state.peak_memory import predicted_peak_bytes as peak_prediction
from tensoropt.executor.state.worker import end_process_group, init_process_group
from tensoropt.training.trainer import RunResult, Trainer


def metrics_json(result: RunResult, plan: ExecPlan, predicted_peak_bytes: int | None = None,
                 predicted_peak_tensor_bytes: int | None = None) -> dict:
    """The metrics document of issue 6.

    Example:
        >>> r = RunResult("d1-p0", 1, [{"step": 0, "loss": 2.3, "time_s": 0.1}], 1000, peak_bytes=1500)
        >>> metrics_json(r, ExecPlan.from_json({"mesh": {"shape": [], "levels": []}, "placements": {},
        ...     "time_s": 0.09, "memory_bytes": 990}))["measured"]
        {'time_s': 0.1, 'memory_bytes': 1000, 'peak_bytes': 1500, 'peak_tensor_bytes': 0}

    ``measured.memory_bytes`` adds up the storages the plan owns (parameters, gradients, optimizer
    state, saved activations); ``measured.peak_bytes`` is the peak the process really spent in
    the training loop (:mod:`tensoropt.executor.state.peak_memory`), both the maximum over ranks;
    ``predicted.peak_bytes``, when given, the memory model's figure for it
    (:func:`tensoropt.executor.state.peak_memory.predicted_peak_bytes`). ``measured.peak_tensor_bytes``
    is the most tensor storage alive at once in the first step (:mod:`tensoropt.executor.state.tensor_peak`:
    the CPU counterpart of CUDA's ``max_memory_allocated``, whatever the allocator's settings), and
    ``predicted.peak_tensor_bytes`` the memory model's figure for it (the peak without the runtime's
    own memory).
    """
    return {
        "plan_id": result.plan_id,
        "devices": result.devices,
        "steps": result.steps,
        "predicted": {**{k: plan.predicted.get(k) for k in ("time_s", "memory_bytes")},
                      **({"peak_bytes": predicted_peak_bytes} if predicted_peak_bytes is not None else {}),
                      **({"peak_tensor_bytes": predicted_peak_tensor_bytes}
                         if predicted_peak_tensor_bytes is not None else {})},
        "measured": {"time_s": result.median_time_s, "memory_bytes": result.memory_bytes,
                     "peak_bytes": result.peak_bytes, "peak_tensor_bytes": result.peak_tensor_bytes},
    }


def run_all(config: dict) -> None:
    """Train every run of a RUN.json document on this rank; rank 0 writes the outputs."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    start = int(config.get("start_step", 0))
    for run in config["runs"]:
        spec = TrainSpec.from_json(run.get("spec", config.get("spec")))
        steps = int(config.get("steps", spec.steps))
        # Without a fixed plan, select one for this world size (elastic: on every restart).
        document = run["plan"] if "plan" in run else restart.resolve_plan(run["select"])
        plan = ExecPlan.from_json(document)
        executor = {**config.get("executor", {}), **run.get("executor", {})}  # {"mode", "compile"}
        trainer = Trainer(spec, plan, mode=executor.get("mode", "replay"),
                          compile=executor.get("compile", "none"),
                          micro_batches=int(document.get("micro_batches", 1)))
        fail = config.get("fail_at")  # {"rank": r, "step": s}: a test of error propagation
        if fail and fail.get("rank") == rank:
            trainer.fail_at_step = int(fail.get("step", 0))
        if run.get("checkpoint"):  # resume from the newest checkpoint, train until step `steps`
            result = restart.train_with_checkpoints(trainer, spec, steps, run["checkpoint"])
        else:
            result = trainer.train(steps, start_step=start)
        params = trainer.full_params() if run.get("params_out") else None
        if rank == 0:
            if run.get("metrics"):
                _write_json(Path(run["metrics"]),
                            {**metrics_json(result, plan, peak_prediction(trainer),
                                            peak_prediction(trainer, runtime=False)),
                             "executor": trainer.runtime_info()})
            if params is not None:
                torch.save({k: v.cpu() for k, v in params.items()}, run["params_out"])
            last = result.steps[-1] if result.steps else {}
            print(f"[tensoropt] plan {plan.plan_id} on {plan.devices} device(s): {len(result.steps)} steps, "
                  f"last loss {last.get('loss')}, median step {result.median_time_s * 1e3:.1f} ms, "
                  f"memory {result.memory_bytes / 2**20:.2f} MiB per device", flush=True)
        if dist.is_initialized():
            dist.barrier()


def _write_json(path: Path, data: dict) -> None:
    write_text_atomic(path, json.dumps(data, indent=2))


def main(argv: list[str] | None = None) -> int:
    """Worker entry point; returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m tensoropt.training.worker RUN.json", file=sys.stderr)
        return 2
    rank = int(os.environ.get("RANK", "0"))
    # DTensor warns on every multi-axis all-gather of a plan's layout; the plan chose it.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    try:
        config = json.loads(Path(argv[0]).read_text())
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            init_process_group()
        run_all(config)
        return 0
    except BaseException as err:  # noqa: BLE001 - every failure must end this rank visibly
        print(f"[tensoropt] rank {rank} failed: {type(err).__name__}: {err}\n{traceback.format_exc()}",
              file=sys.stderr, flush=True)
        return 1
    finally:
        try:
            end_process_group()
        except Exception:  # noqa: BLE001
            pass


if __name__ == "__main__":
    sys.exit(main())
