"""glibc malloc settings for the workers: peak memory and step time side by side (issue 16, memory).

The CPU peak (``measured.peak_bytes``, the resident set's high-water mark) sees what glibc keeps
of freed memory: per-thread arenas (gloo's threads each get one) and free blocks below the top of
the heap that are not returned. glibc raises its mmap threshold dynamically after a large mmapped
block is freed (up to 32 MiB), so tensors of up to that size then come from the heap, and its trim
threshold with it (to twice that): the freed tensors stay resident. Setting any of
``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or ``MALLOC_TOP_PAD_`` turns that dynamic
adjustment off. This runs the same plans under each setting of :data:`SETTINGS`, interleaved round
by round in one run (so load drifts hit every setting alike), and tabulates each setting's median
step time, its ratio to glibc's defaults, the peak per process and the memory model's error
against it (:mod:`estimators.peak`).

Two ways (one loop over the settings, :func:`interleaved`):

* default: each model's fastest 2-device plan on 2 gloo processes (a launch per run), the
  median step time (wall) over rounds;
* ``--single``: each model's 1-device plan in a process of its own per setting, the CPU time per
  replayed step (``time.process_time``: the allocator's page faults and heap calls are in it, other
  processes' load is not), the figure to trust on a loaded machine.

Usage (one command each, about 10 and 5 minutes on 2 loaded cores):
``TENSOROPT_CACHE=/tmp/M/cache .venv/bin/python benchmarks/allocator.py [--rounds 2] [--steps 8]
[--single] [--models big-fc gpt hf-llama] [--settings default peak thp ...] [--json out/allocator.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

SETTINGS = {
    "default": {},
    "arena1+trim0": {"MALLOC_ARENA_MAX": "1", "MALLOC_TRIM_THRESHOLD_": "0"},
    "top_pad": {"MALLOC_TOP_PAD_": str(16 << 20)},
    "arena2+top_pad": {"MALLOC_ARENA_MAX": "2", "MALLOC_TOP_PAD_": str(16 << 20)},
    "mmap1M": {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)},
    "mmap1M+thp": {"MALLOC_MMAP_THRESHOLD_": str(1 << 20), "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
    "peak": {"TENSOROPT_WORKER_MALLOC": "peak"},
    "thp": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
    "top_pad4M+thp": {"MALLOC_TOP_PAD_": str(4 << 20), "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
    "mmap128K+thp": {"MALLOC_MMAP_THRESHOLD_": str(128 << 10), "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
}
"""Name -> the environment variables a worker gets (glibc reads them at start). ``top_pad``: a fixed
16 MiB top pad (the dynamic thresholds off; the heap trimmed above 128 KiB of free top, keeping 16
MiB); ``peak``: ``tensoropt.launch.WORKER_MALLOC`` (16 MiB top pad + ``thp``), the launcher's
opt-in (``TENSOROPT_WORKER_MALLOC=peak``); ``mmap1M``: blocks of 1 MiB and more always mmapped
(returned when freed); ``+thp``: glibc (>= 2.35) asks for transparent huge pages (``madvise``) on
what it maps, so re-touching a returned block faults once per 2 MiB, not per 4 KiB page."""


def interleaved(rounds: int, cases: dict, run_one: Callable[[object, dict], dict],
                settings: tuple[str, ...] = tuple(SETTINGS)) -> dict[tuple[str, str], list[dict]]:
    """``run_one(case, env)`` for every round, case and setting, the settings interleaved within a
    round (load drifts hit all alike): (case name, setting) -> the dicts it returned, one per round.

    Example:
        >>> interleaved(2, {"m": 1}, lambda case, env: {"n": len(env)}, ("default", "top_pad"))
        {('m', 'default'): [{'n': 0}, {'n': 0}], ('m', 'top_pad'): [{'n': 1}, {'n': 1}]}
    """
    samples: dict[tuple[str, str], list[dict]] = {}
    for _ in range(rounds):
        for name, case in cases.items():
            for setting in settings:
                samples.setdefault((name, setting), []).append(run_one(case, SETTINGS[setting]))
    return samples


def rows(samples: dict[tuple[str, str], list[dict]], time_key: str) -> list[dict]:
    """One row per (case, setting): the median ``time_key`` over rounds and its ratio to the
    ``default`` setting's, the largest peak and the prediction's error against it.

    Example:
        >>> r = rows({("m", "default"): [{"t": 2.0, "peak_bytes": 10, "predicted_peak_bytes": 9}],
        ...           ("m", "top_pad"): [{"t": 2.2, "peak_bytes": 8, "predicted_peak_bytes": 9}]}, "t")
        >>> [(x["setting"], round(x["time_vs_default"], 2), x["peak_error"]) for x in r]
        [('default', 1.0, -0.1), ('top_pad', 1.1, 0.125)]
    """
    out = []
    for (name, setting), runs in samples.items():
        base = statistics.median(r[time_key] for r in samples[(name, "default")])
        time_s = statistics.median(r[time_key] for r in runs)
        peak = max(r["peak_bytes"] for r in runs)
        predicted = runs[0].get("predicted_peak_bytes") or 0
        out.append({"model": name, "setting": setting, "time_s": time_s, "time_vs_default": time_s / base,
                    "peak_bytes": peak, "predicted_peak_bytes": predicted,
                    "peak_error": (predicted - peak) / peak if peak and predicted else None, "runs": runs})
    return out


def _jobs(models: tuple[str, ...], devices: int) -> dict:
    """Model name -> (TrainSpec, its first plan for ``devices`` devices as a plan file's dict)."""
    from memory_peak import JOBS, _job_body

    from tensoropt.config import Job
    from tensoropt.executor.job.spec import TrainSpec
    from tensoropt.planner import plan_job
    from tensoropt.plans import plan_file_text

    cases = {}
    for name in models:
        job = Job.from_dict({**_job_body(JOBS[name]), "cluster": "cpu-local", "devices": [devices]})
        frontier_json = plan_job(job).to_json()
        plan_id = frontier_json["frontiers"][0]["plans"][0]["id"]
        cases[name] = (TrainSpec.from_job(job), json.loads(plan_file_text(frontier_json, plan_id)))
    return cases


def measure(rounds: int, steps: int, models: tuple[str, ...], settings: tuple[str, ...]) -> list[dict]:
    """2 gloo processes, each model's fastest 2-device plan: median step time over rounds, peak."""
    from memory_peak import _run

    with tempfile.TemporaryDirectory(prefix="allocator-") as tmp:
        def run_one(case, env):
            spec, plan = case
            m = _run(spec, plan, 2, steps, Path(tmp), "allocator", env=env)
            return {"time_s": m["measured"]["time_s"], "peak_bytes": m["measured"]["peak_bytes"],
                    "predicted_peak_bytes": m["predicted"].get("peak_bytes")}

        return rows(interleaved(rounds, _jobs(models, 2), run_one, settings), "time_s")


def _single_worker(model: str, steps: int) -> None:
    """In this process (started with a setting's environment): train ``model``'s 1-device plan,
    ``steps`` replayed steps after the interpreted one and the trace; print the median CPU time
    (``process_time``: page faults and heap calls included, other processes' load not) and wall
    time per step, the training loop's peak and its prediction, as JSON."""
    import time

    from tensoropt.executor.job.plan import ExecPlan
    from tensoropt.executor.state.peak_memory import predicted_peak_bytes
    from tensoropt.training.trainer import Trainer

    spec, plan = _jobs((model,), 1)[model]
    trainer = Trainer(spec, ExecPlan.from_json(plan))
    trainer.memory_peak.start()
    trainer.step(0)  # the interpreted, measured step
    trainer.step(1, measure_memory=False)  # the trace
    cpu, wall = [], []
    for step in range(2, 2 + steps):
        c, w = time.process_time(), time.perf_counter()
        trainer.step(step, measure_memory=False)
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    print(json.dumps({"cpu_s": statistics.median(cpu), "wall_s": statistics.median(wall),
                      "peak_bytes": trainer.memory_peak.read(),
                      "predicted_peak_bytes": predicted_peak_bytes(trainer)}))


def measure_single(rounds: int, steps: int, models: tuple[str, ...], settings: tuple[str, ...]) -> list[dict]:
    """1 process per (model, setting, round): median CPU time per replayed step over rounds, peak."""
    import subprocess

    def run_one(model, env):
        from tensoropt.launch import worker_malloc_env

        cmd = [sys.executable, __file__, "--single-worker", model, "--steps", str(steps)]
        full_env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
        full_env.update(worker_malloc_env(full_env))  # as the launcher does for its workers
        out = subprocess.run(cmd, env=full_env, capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    return rows(interleaved(rounds, {m: m for m in models}, run_one, settings), "cpu_s")


def _table(rows_: list[dict], single: bool) -> str:
    what = "CPU time per step (1 process)" if single else "step time (2 processes)"
    lines = [f"| model | allocator | {what} | / default | peak MiB | predicted peak MiB | error |",
             "|---|---|---|---|---|---|---|"]
    for r in rows_:
        error = f"{r['peak_error']:+.1%}" if r["peak_error"] is not None else "-"
        lines.append(f"| {r['model']} | {r['setting']} | {r['time_s'] * 1e3:.0f} ms | "
                     f"{r['time_vs_default']:.2f} | {r['peak_bytes'] / 2**20:.1f} | "
                     f"{r['predicted_peak_bytes'] / 2**20:.1f} | {error} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the interleaved rounds, print the table, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--models", nargs="+", default=["big-fc", "gpt"])
    parser.add_argument("--settings", nargs="+", choices=tuple(SETTINGS),
                        default=["default", "arena1+trim0", "peak", "thp"])
    parser.add_argument("--single", action="store_true",
                        help="1 process, CPU time per replayed step (load-independent), not 2 processes")
    parser.add_argument("--single-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.single_worker:
        _single_worker(args.single_worker, args.steps)
        return 0
    settings = tuple(dict.fromkeys(["default", *args.settings]))  # the ratios' reference runs too
    load_before = os.getloadavg()
    run = measure_single if args.single else measure
    result = run(args.rounds, args.steps, tuple(args.models), settings)
    from memory_peak import report

    report(_table(result, args.single), result, load_before, args.json)
    return 0


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent)]
    sys.exit(main())
