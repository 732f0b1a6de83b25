"""The torchrun worker of a pipelined plan: ``python -m tensoropt.pipeline_runtime.worker RUN.json``.

RUN.json: ``runs``, a list of runs trained one after the other by the same processes (one launch
for several plans), each with ``spec`` (:meth:`TrainSpec.to_json`), ``plan`` (the plan entry),
``steps``, and
optionally ``metrics`` (a JSON path rank 0 writes: the loss per step, the step times, each rank's
stage, parameter bytes and measured peak above its level before the stage was built
(:class:`tensoropt.executor.state.peak_memory.PeakMemory`), and the plan's predictions), ``params_dir``
(each stage's first replica saves its parameters there as
``stage-S.pt``, under the model's names), ``checkpoint_dir`` (a DCP checkpoint of the model and
the optimizer, under the model's names, written after the last step) and ``resume_from`` (a DCP
checkpoint to start from: any stage count or process count wrote it), ``replay`` (default true: each
stage's forward and backward replay traced programs; false: eager autograd); ``compile`` (``"none"``,
the default, or ``"inductor"``: the replayed programs compiled by Inductor on the first step; each
rank's ``trace_s``, ``compile_s`` and ``saved_bytes``, what its forward program saves for backward
per micro-batch, go into the metrics); ``timeout_s`` (every
collective's limit; default 120 s); ``interleave`` (true: the runs are built together and
stepped in turn, for timing ratios under the same load); and ``tensor_peak`` (true: the second
step, the stage traced and the optimizer's state made by the first, is measured for its tensor peak,
:class:`tensoropt.pipeline_runtime.stage_peak.StepPeak`; each rank's ``peak_tensor_bytes``,
``resident_tensor_bytes``, ``before_bytes`` (alive before the run was built), the ``phase`` the
peak was reached in and the resident parts go into the metrics, and beside them the same step's
peak read from the allocator's events, ``allocated_peak_bytes`` and ``allocated_phase``
(:class:`~tensoropt.pipeline_runtime.stage_peak.AllocationPeak`: it sees the buffers a compiled
stage allocates in its own code, which ``peak_tensor_bytes`` does not); that step's time is left out of
the median; with ``trace_peak`` also ``peak_live``: the largest storages alive at the peak, made
during the step, as ``[bytes, op, shape, label]``, the label the schedule's phase and, in backward,
the autograd node, and ``peak_live_bytes`` / ``peak_live_storages`` of all of them);
``compute_reference`` (true: after each timed step, the stage's own forward and
backward of every micro-batch run back to back without the schedule, timed: each rank's
``compute_times_s``, the stages' compute under the same load).

``total_steps`` (instead of ``steps``): train up to that step, from the step a resumed checkpoint
reached. ``keep_checkpoints`` (default 2; 0: all): the newest complete checkpoints kept in
``checkpoint_dir``, where each start also appends its line to ``elastic-log.jsonl``
(:func:`tensoropt.executor.state.restart.record_start`), as the trainer's loop does. With ``job``
(the job's dict, as ``tensoropt run`` passes it when the job sets trainer keys), the
run trains with them (the ``trainer_factory`` :func:`main` is given:
:class:`tensoropt.training.pipelined.StageTrainer`, whose module starts this worker: optimizer groups,
learning-rate schedule, clipping across stages, ``metrics.jsonl`` under ``out_dir``, the exported
model) and ``checkpoint_every`` N writes a checkpoint every N steps besides the last.

Example:
    >>> # not run here: started by `tensoropt run` (tensoropt.launch.launch_module)
    >>> main(["run.json"])  # doctest: +SKIP
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from tensoropt.executor.state.restart import hold_for_tests, record_start
from tensoropt.pipeline_runtime.checkpoint import (
    latest_pipelined_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from tensoropt.pipeline_runtime.runtime import PipelineRuntime

TRACED_STORAGES = 60
"""The largest storages of the live set at the peak a ``trace_peak`` run writes (``peak_live``)."""


class PlanRun:
    """One run of RUN.json on this rank: its runtime built (and resumed), then :meth:`step` per step,
    then :meth:`finish` (parameters, checkpoint, rank 0's metrics)."""

    def __init__(self, config: dict, trainer_factory=None):
        from tensoropt.executor.job.spec import TrainSpec
        from tensoropt.executor.state.peak_memory import PeakMemory, load_model_code

        self.config = config
        spec = TrainSpec.from_json(config["spec"])
        torch.manual_seed(spec.seed)
        cuda = torch.cuda.is_available()
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        load_model_code(spec, device)
        self.before_bytes = 0
        if config.get("tensor_peak"):  # what other runs of this launch left alive is not this run's
            import gc

            from tensoropt.pipeline_runtime.stage_peak import live_tensor_bytes

            gc.collect()
            self.before_bytes = live_tensor_bytes()
        self.peak = PeakMemory(device)  # the level before the stage is built (as the executor's worker)
        self.rt = PipelineRuntime(spec, config["plan"], device, replay=config.get("replay", True),
                                  timeout_s=float(config.get("timeout_s", 120)),
                                  compile=config.get("compile", "none"))
        self.peak.start()
        self.start = 0
        self.steps = int(config["steps"])
        self.trainer = None
        if config.get("job"):
            if trainer_factory is None:
                raise ValueError("RUN.json sets 'job' (the trainer keys): run it with "
                                 "`python -m tensoropt.training.pipelined RUN.json`, which adds the trainer")
            from tensoropt.config import Job

            self.trainer = trainer_factory(self.rt, Job.from_dict(config["job"]), config.get("out_dir", "."))
        if config.get("resume_from"):
            self.start = load_checkpoint(config["resume_from"], self.rt.module, self.rt.optimizer)
            if self.rt.rank == 0:
                found = latest_pipelined_checkpoint(config["resume_from"])
                print(f"[tensoropt] resumed from {found} at step {self.start} on {self.rt.world} "
                      f"process(es), plan {config['plan'].get('id')}", flush=True)
        if config.get("total_steps") is not None:  # run to that step from wherever it resumed
            self.steps = max(0, int(config["total_steps"]) - self.start)
        if config.get("checkpoint_dir"):
            record_start(config["checkpoint_dir"], config["plan"].get("id"),
                         self.start if config.get("resume_from") else None, self.start + self.steps)
        if self.trainer is not None:
            self.trainer.start(self.start, self.start + self.steps)
        self.losses: list[float | None] = []
        self.times: list[float] = []
        self.cpu_times: list[float] = []
        """This process's CPU seconds (every thread) of each timed step."""
        self.compute_times: list[float] = []
        self.tensor_peak: dict | None = None
        self.measure_step = 1 if config.get("tensor_peak") else None

    def step(self) -> None:
        """The run's next step, timed (after a barrier); with trainer keys, clipped, scheduled,
        logged and checkpointed every ``checkpoint_every`` steps; the one measured for its tensor
        peak runs under :class:`~tensoropt.pipeline_runtime.stage_peak.StepPeak` (untimed)."""
        dist.barrier()
        index = len(self.times)
        step = self.start + index
        if index == self.measure_step:
            self.tensor_peak = self._measured_step(step)
            self.times.append(float("nan"))
            return
        lr = self.trainer.lr if self.trainer is not None else None
        t0, c0 = time.perf_counter(), time.process_time()
        hook = self.trainer.before_update if self.trainer is not None else None
        self.losses.append(self.rt.train_step(step, before_update=hook))
        self.times.append(time.perf_counter() - t0)
        self.cpu_times.append(time.process_time() - c0)
        if self.trainer is not None:
            self.trainer.after_step(step, self.losses[-1], lr, self.times[-1])
        every = int(self.config.get("checkpoint_every") or 0)
        done = step + 1
        if len(self.times) < self.steps:  # the last step's checkpoint is finish()'s
            if self.config.get("checkpoint_dir") and every and done % every == 0:
                self._save_checkpoint(done)
            hold_for_tests(done, self.rt.world)
        if self.config.get("compute_reference"):
            dist.barrier()
            t0 = time.perf_counter()
            self._compute_only(self.start + index)
            self.compute_times.append(time.perf_counter() - t0)

    def _save_checkpoint(self, step: int) -> None:
        """The checkpoint after ``step`` steps (collective), the newest ``keep_checkpoints`` kept."""
        config = self.config
        save_checkpoint(config["checkpoint_dir"], self.rt.module, self.rt.optimizer, step,
                        plan_id=config["plan"].get("id"), keep=int(config.get("keep_checkpoints", 2)))

    def _compute_only(self, step: int) -> None:
        """The stage's own work of ``step`` without the schedule: each micro-batch's forward and
        backward run back to back on this rank (a random received activation and output gradient
        where the stage has neighbours), no point-to-point exchange, no optimizer step (the
        gradients it adds are zeroed by the next step). Timed beside the pipelined steps: the
        stages' compute under the same load."""
        rt = self.rt
        batch = rt.local_batch(step)
        rows = rt.rows // rt.m
        for i in range(rt.m):
            kwargs = {n: batch[n][i * rows:(i + 1) * rows] for n in rt.input_names}
            args = ()
            if not rt.is_first:
                buffer = rt.stage.args_recv_info[0][0].buffer
                args = (torch.randn_like(buffer).requires_grad_(),)
            out = rt.stage_module(*args, **kwargs)
            grad = torch.ones_like(out) if rt.is_last else torch.randn_like(out)
            torch.autograd.backward(out, grad)

    def _measured_step(self, step: int) -> dict:
        """Run ``step`` under a tensor peak, each forward and backward of the schedule labelled."""
        from tensoropt.pipeline_runtime.stage_peak import (
            PHASE_PREFIX,
            AllocationPeak,
            StepPeak,
            stage_resident_parts,
        )

        rt = self.rt
        stage = rt.stage
        parts = stage_resident_parts(rt.module, rt.optimizer, stage)
        forward, backward = stage.forward_one_chunk, stage.backward_one_chunk

        def labelled(run, kind):
            def call(chunk, *args, **kwargs):
                peak.phase = f"{kind}{chunk}"
                try:
                    with torch.profiler.record_function(f"{PHASE_PREFIX}{kind}{chunk}"):
                        return run(chunk, *args, **kwargs)
                finally:
                    peak.phase = f"after {kind}{chunk}"
            return call

        stage.forward_one_chunk = labelled(forward, "F")
        stage.backward_one_chunk = labelled(backward, "B")
        trace = bool(self.config.get("trace_peak"))
        try:
            with AllocationPeak() as allocated, StepPeak(trace=trace) as peak:
                self.losses.append(rt.train_step(step))
        finally:
            del stage.forward_one_chunk, stage.backward_one_chunk
        live = ({"peak_live": [[nbytes, op, list(shape), label]
                               for nbytes, op, shape, label, _ in peak.peak_live[:TRACED_STORAGES]],
                 "peak_live_bytes": sum(r[0] for r in peak.peak_live),
                 "peak_live_storages": len(peak.peak_live)}
                if trace else {})
        return {"peak_tensor_bytes": peak.peak_bytes, "resident_tensor_bytes": peak.resident_bytes,
                "before_bytes": self.before_bytes,
                "phase": peak.peak_phase, "resident_parts": parts,
                "allocated_peak_bytes": allocated.peak_bytes, "allocated_phase": allocated.peak_phase, **live}

    def finish(self) -> dict | None:
        """Write what the run's config asks for; rank 0 returns the metrics (others None)."""
        config, rt, start, steps, times = self.config, self.rt, self.start, self.steps, self.times
        peak_bytes = self.peak.read()
        losses = rt.global_losses(self.losses)
        per_rank = [None] * rt.world
        dist.all_gather_object(per_rank, {
            "rank": rt.rank, "stage": rt.stage_index, "virtual_stages": rt.virtual_stages,
            "peak_bytes": peak_bytes,
            "peak_method": self.peak.method, **(self.tensor_peak or {}),
            "compute_times_s": self.compute_times,
            "step_cpu_times_s": self.cpu_times,
            "trace_s": sum(getattr(m, "trace_s", 0.0) for m in rt.stage_modules),
            "compile_s": sum(getattr(m, "compile_s", 0.0) for m in rt.stage_modules),
            "saved_bytes": sum(getattr(m, "saved_bytes", 0) for m in rt.stage_modules),
            "parameter_bytes": sum(p.numel() * p.element_size() for p in rt.module.parameters())})
        if config.get("params_dir") and rt.dp_index == 0:
            out = Path(config["params_dir"])
            out.mkdir(parents=True, exist_ok=True)
            torch.save({k: v.detach().cpu() for k, v in rt.module.state_dict().items()},
                       out / f"stage-{rt.stage_index}.pt")
        if config.get("checkpoint_dir"):
            self._save_checkpoint(start + steps)
        if self.trainer is not None:
            self.trainer.finish()
        dist.barrier()
        if rt.rank != 0:
            return None
        plan = config["plan"]
        steady = [t for t in times[1:] if t == t] or times
        return {
            "plan_id": plan.get("id"), "devices": rt.world, "pipeline": plan["pipeline"],
            "first_step": start, "losses": losses, "step_times_s": times,
            "predicted": {"time_s": plan.get("time_s"), "memory_bytes": plan.get("memory_bytes")},
            "measured": {"time_s": statistics.median(steady) if steady else None, "ranks": per_rank},
            "predicted_stages": [{"stage": st["stage"], "memory_bytes": st["memory_bytes"]}
                                 for st in (plan.get("pipeline_detail") or {}).get("stages", [])],
            "records": self.trainer.records if self.trainer is not None else None,
            "runtime": "stages run by torch.distributed.pipelining, data parallel inside each stage",
            "stage_mode": getattr(rt.stage_module, "mode", "eager"),
            "stage_compile": rt.compile,
        }


def run(config: dict, trainer_factory=None) -> dict | None:
    """Train ``config``'s plan on this rank; rank 0 returns the metrics (others None)."""
    plan_run = PlanRun(config, trainer_factory)
    for _ in range(plan_run.steps):
        plan_run.step()
    return plan_run.finish()


def run_interleaved(configs: list[dict], trainer_factory=None) -> list[dict | None]:
    """Build every run, then step them in turn (step 0 of each, step 1 of each...): timing ratios
    under the same machine load. Peak memory then mixes the runs: measure it one run per launch."""
    runs = [PlanRun(c, trainer_factory) for c in configs]
    for i in range(max(r.steps for r in runs)):
        for r in runs:
            if i < r.steps:
                r.step()
    return [r.finish() for r in runs]


def _report(entry: dict, metrics: dict | None) -> None:
    if metrics is None:
        return
    losses = ", ".join(f"{v:.6f}" for v in metrics["losses"])
    print(f"[tensoropt] pipelined plan {metrics['plan_id']}: losses {losses}; step "
          f"{1e3 * (metrics['measured']['time_s'] or 0):.1f} ms", flush=True)
    if entry.get("metrics"):
        Path(entry["metrics"]).write_text(json.dumps(metrics, indent=1))


def main(argv: list[str], trainer_factory=None) -> int:
    """Join the process group (gloo on CPU, NCCL on CUDA; every collective under ``timeout_s``), run,
    write the metrics (rank 0), leave the group."""
    config = json.loads(Path(argv[0]).read_text())
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        import os

        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, timeout=timedelta(seconds=float(config.get("timeout_s", 120))))
    for entry in config["runs"]:  # the launch's limit, for the groups a run makes
        entry.setdefault("timeout_s", config.get("timeout_s", 120))
    try:
        if config.get("interleave"):
            for entry, metrics in zip(config["runs"], run_interleaved(config["runs"], trainer_factory)):
                _report(entry, metrics)
        else:
            for entry in config["runs"]:
                _report(entry, run(entry, trainer_factory))
    finally:
        import gc

        gc.collect()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
