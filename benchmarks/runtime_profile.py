"""Where the replayed data-parallel step spends its time against DDP: phases and aten ops, one launch.

For each model of ``benchmarks/runtime.py`` (``--models``), one torchrun launch of 2 gloo
processes (one thread each) builds the data-parallel plan (every node ``batch=2``, replayed) and
plain ``DistributedDataParallel`` (AdamW, same global batch) and runs them step by step,
interleaved (the order reversed every other step), after 2 warm-up steps. Printed per model:

* phases (median ms per step, rank 0; ``cpu``: the main thread's CPU time of the step,
  ``time.thread_time``, which waiting does not count; ``process_cpu``: every thread's, gloo's
  included): ``program`` (the replayed forward + backward + collectives
  + gradients handed to the parameters), ``optimizer``, ``zero_grad`` and ``total``; DDP's
  ``forward``, ``backward`` (with its bucket all-reduces), ``optimizer``, ``zero_grad``, ``total``;
* with ``--ops N``: the aten operators of each (``torch.profiler`` over :data:`PROFILED_STEPS`
  steps, rank 0): calls and self CPU ms per step per operator, the N whose time differs most first.

Usage (one command): ``TENSOROPT_CACHE=/tmp/cache .venv/bin/python benchmarks/runtime_profile.py
[--models hf-llama,hf-bert] [--steps 12] [--ops 25]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
PROFILED_STEPS = 6
"""Steps of each system profiled for the operator table (per-step means are printed)."""


def _op_table(prof) -> dict[str, tuple[int, float]]:
    """aten operator -> (calls, self CPU ms) of a profiled region."""
    out = {}
    for e in prof.key_averages():
        if e.key.startswith(("aten::", "c10d::", "_c10d_functional::", "gloo:")):
            out[e.key] = (e.count, e.self_cpu_time_total / 1e3)
    return out


def _measure(name: str, plan: dict, options: dict, rank: int, world: int) -> dict:
    """One model: its DP plan's trainer and DDP, interleaved step by step; phases (and operators)."""
    import torch.distributed as dist
    from runtime import spec_of
    from torch.nn.parallel import DistributedDataParallel
    from torch.profiler import ProfilerActivity, profile

    from tensoropt.executor.job.data import synthetic_batch
    from tensoropt.executor.job.plan import ExecPlan
    from tensoropt.executor.state.local_optim import step_local
    from tensoropt.training.trainer import Trainer

    spec = spec_of(name, options["steps"])
    trainer = Trainer(spec, ExecPlan.from_json(plan), mode="replay")
    trainer.train(2, start_step=0)
    model = DistributedDataParallel(spec.build_model())
    opt = spec.make_optimizer(list(model.parameters()))

    def ours(step: int) -> dict[str, float]:
        values = trainer._placeholder_values(trainer.batch(step))
        c0, p0, t0 = time.thread_time(), time.process_time(), time.perf_counter()
        trainer.program.run(values)
        trainer.zero.shard_gradients()
        t1 = time.perf_counter()
        step_local(trainer.optimizer)
        trainer.zero.gather()
        t2 = time.perf_counter()
        trainer.optimizer.zero_grad(set_to_none=True)
        trainer.zero.zero_grad()
        t3 = time.perf_counter()
        return {"program": t1 - t0, "optimizer": t2 - t1, "zero_grad": t3 - t2, "total": t3 - t0,
                "cpu": time.thread_time() - c0, "process_cpu": time.process_time() - p0}

    def theirs(step: int) -> dict[str, float]:
        batch = synthetic_batch(list(spec.inputs), spec.global_batch_size, spec.seed, step)
        local = [t.chunk(world)[rank] for t in batch]
        c0, p0, t0 = time.thread_time(), time.process_time(), time.perf_counter()
        loss = model(*local)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
        return {"forward": t1 - t0, "backward": t2 - t1, "optimizer": t3 - t2, "zero_grad": t4 - t3,
                "total": t4 - t0, "cpu": time.thread_time() - c0, "process_cpu": time.process_time() - p0}

    for step in range(2):
        theirs(step)
    phases = {"dp": [], "ddp": []}
    for i in range(options["steps"]):
        pair = (("dp", ours), ("ddp", theirs))
        for system, fn in (pair if i % 2 == 0 else pair[::-1]):
            dist.barrier()
            phases[system].append(fn(2 + i))
    row = {s: {k: statistics.median(p[k] for p in v) * 1e3 for k in v[0]} for s, v in phases.items()}
    row["nodes"] = trainer.runtime_info().get("nodes")
    if options["ops"]:
        tables = {}
        for system, fn in (("dp", ours), ("ddp", theirs)):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for i in range(PROFILED_STEPS):
                    dist.barrier()
                    fn(100 + i)
            tables[system] = {k: (c / PROFILED_STEPS, ms / PROFILED_STEPS)
                              for k, (c, ms) in _op_table(prof).items()}
        row["ops"] = tables
    return row


def worker(options: dict) -> None:
    """torchrun entry: DP plan replayed and DDP per model, phase-timed and profiled; rank 0 writes JSON."""
    import torch.distributed as dist

    from tensoropt.executor.state.worker import end_process_group, init_process_group

    torch.set_num_threads(1)
    init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {name: _measure(name, plan, options, rank, world) for name, plan in options["plans"].items()}
    if rank == 0:
        Path(options["out"]).write_text(json.dumps(out))
    dist.barrier()
    end_process_group()


def main(argv: list[str] | None = None) -> int:
    """Plan each model's DP plan, run the launch, print the phases and the operator differences."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="hf-llama,hf-bert")
    parser.add_argument("--steps", type=int, default=12, help="measured steps per system")
    parser.add_argument("--ops", type=int, default=0, help="print this many operators of a profiled step")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from runtime import MODELS, plan_model
    from worker_launch import launch_workers

    names = [m for m in args.models.split(",") if m]
    bad = sorted(set(names) - set(MODELS))
    if bad:
        parser.error(f"--models: unknown {bad}; choose from {', '.join(MODELS)}")
    plans = {n: plan_model(n, "cpu-local", "roofline")["dp"] for n in names}  # DP: the same for any compute
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        got = launch_workers(__file__, {"plans": plans, "steps": args.steps, "ops": args.ops}, Path(tmp),
                             env={"OMP_NUM_THREADS": "1"})
    load_after = os.getloadavg()
    for name, row in got.items():
        print(f"\n{name} ({row['nodes']} program nodes), median ms per step, rank 0:")
        for system in ("dp", "ddp"):
            print(f"  {system:4} " + "  ".join(f"{k} {v:.2f}" for k, v in row[system].items()))
        print(f"  DP / DDP total: {row['dp']['total'] / row['ddp']['total']:.3f}, main-thread CPU: "
              f"{row['dp']['cpu'] / row['ddp']['cpu']:.3f}, process CPU: "
              f"{row['dp']['process_cpu'] / row['ddp']['process_cpu']:.3f}")
        if "ops" in row:
            dp, ddp = row["ops"]["dp"], row["ops"]["ddp"]
            keys = sorted(set(dp) | set(ddp),
                          key=lambda k: -abs(dp.get(k, (0, 0))[1] - ddp.get(k, (0, 0))[1]))
            print(f"  {'operator':44} {'DP calls':>8} {'DDP calls':>9} {'DP ms':>7} {'DDP ms':>7}")
            for k in keys[:args.ops]:
                a, b = dp.get(k, (0, 0.0)), ddp.get(k, (0, 0.0))
                print(f"  {k[:44]:44} {a[0]:8.1f} {b[0]:9.1f} {a[1]:7.2f} {b[1]:7.2f}")
            total = [sum(v[i] for v in table.values()) for table in (dp, ddp) for i in (0, 1)]
            print(f"  {'all':44} {total[0]:8.1f} {total[2]:9.1f} {total[1]:7.2f} {total[3]:7.2f}")
    print(f"\nload average (1, 5, 15 min) before {' '.join(f'{x:.2f}' for x in load_before)}, after "
          f"{' '.join(f'{x:.2f}' for x in load_after)}; medians of {args.steps} steps per system")
    return 0


if __name__ == "__main__":
    from worker_launch import run_worker_if_asked

    run_worker_if_asked(worker)
    sys.exit(main())
