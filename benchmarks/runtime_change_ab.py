"""Two runtime changes of 2026-11-29 (collcount), each on and off in one launch: ``--change sink``,
the running statistics' gather-back sunk to the program's end or waited for at each batch norm
(``graph_passes.sink_waits``; the CNN's plans); ``--change carried``, a shard the views carry kept
through them, or the whole value redistributed before them (``interpreter.carried``; the ViT's
plans). The plans of ``benchmarks/fidelity.py``'s plan cache, each traced twice (the change off for
one), their steps interleaved (rotated, reversed every other round); per way the median wall step,
wall less the main thread's run delay, and main-thread CPU, rank 0.

Usage: ``TENSOROPT_CACHE=... .venv/bin/python benchmarks/runtime_change_ab.py --plan-cache plans.json
[--change sink|carried] [--plans fast,lean] [--rounds 10] [--steps 4]``.
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

HERE = Path(__file__).resolve().parent


def worker(options: dict) -> None:
    """torchrun entry: both ways of every plan, interleaved; rank 0 writes the per-step figures."""
    import torch.distributed as dist
    from fidelity import MODELS
    from micro_batch_time import run_delay_s
    from runtime import spec_of

    from tensoropt.executor.job.plan import ExecPlan
    from tensoropt.executor.program import graph_passes, interpreter
    from tensoropt.executor.state.worker import end_process_group, init_process_group
    from tensoropt.training.trainer import Trainer

    init_process_group()
    systems = []
    model, (module, name, off) = options["model"], {
        "sink": (graph_passes, "_input_write", lambda n: False),
        "carried": (interpreter, "carried", lambda current, pre, dim_map: pre)}[options["change"]]
    for label, plan in options["plans"].items():
        for way in ("on", "off"):
            trainer = Trainer(spec_of(model, 4, MODELS), ExecPlan.from_json(plan), mode="replay")
            saved = getattr(module, name)
            if way == "off":
                setattr(module, name, off)
            try:
                trainer.train(2, start_step=0)  # traces the program
            finally:
                setattr(module, name, saved)
            systems.append((f"{label}/{way}", trainer))
    got: dict[str, dict[str, list]] = {}
    for r in range(options["rounds"]):
        order = systems[r % len(systems):] + systems[:r % len(systems)]
        for key, trainer in (order[::-1] if r % 2 else order):
            dist.barrier()
            for i in range(options["steps"]):
                d0, c0, t0 = run_delay_s(), time.thread_time(), time.perf_counter()
                trainer.step(100 + r * options["steps"] + i, measure_memory=False)
                wall = time.perf_counter() - t0
                row = got.setdefault(key, {"wall": [], "unloaded": [], "cpu": []})
                row["wall"].append(wall)
                row["unloaded"].append(wall - (run_delay_s() - d0))
                row["cpu"].append(time.thread_time() - c0)
    if dist.get_rank() == 0:
        Path(options["out"]).write_text(json.dumps(got))
    end_process_group()


def main(argv: list[str] | None = None) -> int:
    """Run both ways of the plans in one launch and print their medians."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan-cache", required=True)
    parser.add_argument("--change", choices=("sink", "carried"), default="sink")
    parser.add_argument("--plans", default="fast,lean")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from worker_launch import launch_workers

    model = {"sink": "cnn", "carried": "vit"}[args.change]
    cached = json.loads(Path(args.plan_cache).read_text())[model]["plans"]
    plans = {label: cached[label] for label in args.plans.split(",") if label in cached["run"]}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        got = launch_workers(__file__, {"plans": plans, "rounds": args.rounds, "steps": args.steps,
                                        "model": model, "change": args.change}, Path(tmp))
    load_after = os.getloadavg()
    print(f"{'plan/way':14} {'wall ms':>8} {'wall-delay':>10} {'CPU ms':>7}  (medians over {args.rounds} x "
          f"{args.steps} steps, rank 0)")
    for key, row in got.items():
        wall, unloaded, cpu = (statistics.median(row[k]) * 1e3 for k in ("wall", "unloaded", "cpu"))
        print(f"{key:14} {wall:8.1f} {unloaded:10.1f} {cpu:7.1f}")
    loads = [" ".join(f"{x:.2f}" for x in xs) for xs in (load_before, load_after)]
    print(f"load average before {loads[0]}, after {loads[1]}")
    return 0


if __name__ == "__main__":
    from worker_launch import run_worker_if_asked

    run_worker_if_asked(worker)
    sys.exit(main())
