"""glibc malloc settings for the workers: peak memory and step time side by side (issue 16, memory).

The CPU peak (``measured.peak_bytes``, the resident set's high-water mark) sees what glibc keeps
of freed memory: per-thread arenas (the autograd engine's and gloo's threads each get one) and
free blocks below the top of the heap that are not returned (the trim threshold, raised
dynamically up to 64 MiB after large frees). This runs the same plans under each setting of
:data:`SETTINGS`, interleaved round by round in one run (so load drifts hit every setting alike),
and tabulates each setting's median step time and peak per process, and the time ratio to the
default allocator.

``--single`` instead runs each model's 1-process plan in a process of its own per setting and
reports the CPU time per replayed step (``time.process_time``: the allocator's page faults and
heap calls are in it, other processes' load is not), the figure to trust on a loaded machine.

Usage (one command each, about 10 and 3 minutes on 2 loaded cores):
``TENSOROPT_CACHE=/tmp/C/cache .venv/bin/python benchmarks/allocator.py [--rounds 2] [--steps 8]
[--single] [--json out/allocator.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

SETTINGS = {
    "default": {},
    "arena1": {"MALLOC_ARENA_MAX": "1"},
    "arena1+trim0": {"MALLOC_ARENA_MAX": "1", "MALLOC_TRIM_THRESHOLD_": "0"},
}
"""Name -> the environment variables a worker gets (glibc reads them at start)."""


def measure(rounds: int, steps: int, models: tuple[str, ...] = ("big-fc", "gpt")) -> list[dict]:
    """One row per (model, plan, setting): median step times over rounds and the largest peak."""
    from memory_peak import JOBS, _job_body, _run

    from tensoropt.config import Job
    from tensoropt.executor.spec import TrainSpec
    from tensoropt.planner import plan_job
    from tensoropt.plans import plan_file_text

    samples: dict[tuple, dict] = {}
    cases = []
    for name in models:
        job = Job.from_dict({**_job_body(JOBS[name]), "cluster": "cpu-local", "devices": [2]})
        frontier_json = plan_job(job).to_json()
        plan_id = frontier_json["frontiers"][0]["plans"][0]["id"]
        cases.append((name, TrainSpec.from_job(job), json.loads(plan_file_text(frontier_json, plan_id))))
    with tempfile.TemporaryDirectory(prefix="allocator-") as tmp:
        for _ in range(rounds):
            for name, spec, plan in cases:
                for setting, env in SETTINGS.items():
                    m = _run(spec, plan, 2, steps, Path(tmp), f"{name}-{setting}", env=env)
                    entry = samples.setdefault((name, plan["id"], setting), {"times": [], "peaks": []})
                    entry["times"].append(m["measured"]["time_s"])
                    entry["peaks"].append(m["measured"]["peak_bytes"])
    rows = []
    for (name, plan_id, setting), entry in samples.items():
        base = samples[(name, plan_id, "default")]
        time_s = statistics.median(entry["times"])
        rows.append({"model": name, "plan": plan_id, "setting": setting, "time_s": time_s,
                     "times_s": entry["times"], "time_vs_default": time_s / statistics.median(base["times"]),
                     "peak_bytes": max(entry["peaks"])})
    return rows


def _single_worker(model: str, steps: int) -> None:
    """In this process (started with a setting's environment): train ``model``'s 1-process plan
    ``steps`` replayed steps; print the median CPU time (``process_time``: page faults and heap
    calls included, other processes' load not) and wall time per step as JSON."""
    import time

    from memory_peak import JOBS, _job_body

    from tensoropt.config import Job
    from tensoropt.executor.plan import ExecPlan
    from tensoropt.executor.spec import TrainSpec
    from tensoropt.executor.trainer import Trainer

    job = Job.from_dict({**_job_body(JOBS[model]), "cluster": "cpu-local", "devices": [1]})
    spec = TrainSpec.from_job(job)
    trainer = Trainer(spec, ExecPlan.from_json({"id": "single", "mesh": {"shape": [], "levels": []},
                                               "placements": {}}))
    trainer.train(2)  # the measured step and the trace
    cpu, wall = [], []
    for step in range(2, 2 + steps):
        c, w = time.process_time(), time.perf_counter()
        trainer.step(step, measure_memory=False)
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    print(json.dumps({"cpu_s": statistics.median(cpu), "wall_s": statistics.median(wall)}))


def measure_single(rounds: int, steps: int, models: tuple[str, ...] = ("big-fc", "gpt")) -> list[dict]:
    """One row per (model, setting): 1 process, median CPU and wall time per replayed step over
    rounds (each setting a process of its own, settings interleaved)."""
    import subprocess

    samples: dict[tuple, list] = {}
    for _ in range(rounds):
        for model in models:
            for setting, env in SETTINGS.items():
                cmd = [sys.executable, __file__, "--single-worker", model, "--steps", str(steps)]
                out = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True,
                                     check=True)
                result = json.loads(out.stdout.strip().splitlines()[-1])
                samples.setdefault((model, setting), []).append(result)
    rows = []
    for (model, setting), runs in samples.items():
        cpu = statistics.median(r["cpu_s"] for r in runs)
        base = statistics.median(r["cpu_s"] for r in samples[(model, "default")])
        rows.append({"model": model, "setting": setting, "cpu_s": cpu, "cpu_vs_default": cpu / base,
                     "wall_s": statistics.median(r["wall_s"] for r in runs), "runs": runs})
    return rows


def _single_table(rows: list[dict]) -> str:
    lines = ["| model (1 process) | allocator | CPU time per step | / default | wall time per step |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['setting']} | {r['cpu_s'] * 1e3:.0f} ms | "
                     f"{r['cpu_vs_default']:.2f} | {r['wall_s'] * 1e3:.0f} ms |")
    return "\n".join(lines)


def _table(rows: list[dict]) -> str:
    lines = ["| model | plan | allocator | step time (median of rounds) | / default | peak MiB |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['plan']} | {r['setting']} | {r['time_s'] * 1e3:.0f} ms | "
                     f"{r['time_vs_default']:.2f} | {r['peak_bytes'] / 2**20:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the interleaved rounds, print the table, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--single", action="store_true",
                        help="1 process, CPU time per replayed step (load-independent), not 2 processes")
    parser.add_argument("--single-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.single_worker:
        _single_worker(args.single_worker, args.steps)
        return 0
    load_before = os.getloadavg()
    rows = measure_single(args.rounds, args.steps) if args.single else measure(args.rounds, args.steps)
    from memory_peak import report

    report(_single_table(rows) if args.single else _table(rows), rows, load_before, args.json)
    return 0


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent)]
    sys.exit(main())
