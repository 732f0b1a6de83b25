"""Memory options on real frontiers: GPT-2 small and GPT 1.3B with and without recompute / zero3.

For each job (configs/jobs/gpt2-small.yaml, gpt-1.3b.yaml, planned for one device count on their
GPU cluster profile) the exact frontier is solved twice: without memory options and with
``training.memory_options: [recompute, zero3]``. Reported: plans on each frontier, the leanest
plan's per-device memory (how much lower with the options), the fastest plan's time and whether the
fastest plan with options is the same plan as without (no options; the share of its layers that are
plain data parallel, ``batch=P``).

Usage::

    .venv/bin/python benchmarks/memory_options.py [--jobs gpt2-small gpt-1.3b] [--devices 8] [--epsilon 0]
        [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

from tensoropt.config import format_size, load_job
from tensoropt.planner import plan_job

ROOT = Path(__file__).resolve().parent.parent


def _batch_share(plan: dict, devices: int) -> float:
    """Fraction of the plan's layers that split only their batch over all devices."""
    rows = plan["layers"]
    return sum(1 for r in rows if r["config"].split("[")[0] == f"batch={devices}") / max(1, len(rows))


def run(job_name: str, devices: int, options: list[str], epsilon: float = 0.0) -> dict:
    """Plan one job for ``devices`` with ``options``; returns the frontier's figures."""
    job = load_job(ROOT / "configs" / "jobs" / f"{job_name}.yaml")
    job.devices = [devices]
    job.planner.epsilon = epsilon
    job.training.memory_options = list(options)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fj = plan_job(job).to_json()
    seconds = time.perf_counter() - start
    plans = [p for f in fj["frontiers"] for p in f["plans"]]
    lean = min(plans, key=lambda p: p["memory_bytes"])
    fast = min(plans, key=lambda p: p["time_s"])
    return {
        "job": job_name, "devices": devices, "options": list(options), "plans": len(plans),
        "plan_seconds": round(seconds, 1),
        "min_memory_bytes": lean["memory_bytes"], "min_memory_time_s": lean["time_s"],
        "fastest_time_s": fast["time_s"], "fastest_memory_bytes": fast["memory_bytes"],
        "fastest_batch_share": _batch_share(fast, devices),
        "fastest_configs": {r["node"]: r["config"] for r in fast["layers"]},
        "fastest_summary": fast.get("summary", ""), "leanest_summary": lean.get("summary", ""),
    }


def main(argv: list[str] | None = None) -> int:
    """Print the comparison table (and write it as JSON with ``--json``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", nargs="+", default=["gpt2-small", "gpt-1.3b"])
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--epsilon", type=float, default=0.0, help="planner.epsilon (0: exact frontiers)")
    args = ap.parse_args(argv)
    rows = []
    for name in args.jobs:
        for options in ([], ["recompute", "zero3"]):
            r = run(name, args.devices, options, args.epsilon)
            rows.append(r)
            print(f"{name:11s} P={r['devices']:<3d} options={','.join(options) or '-':16s} "
                  f"plans={r['plans']:<5d} leanest {format_size(r['min_memory_bytes']):>10s} "
                  f"fastest {r['fastest_time_s'] * 1e3:8.2f} ms ({format_size(r['fastest_memory_bytes'])}, "
                  f"{100 * r['fastest_batch_share']:.0f}% of layers batch={r['devices']}) "
                  f"[{r['plan_seconds']} s]",
                  flush=True)
        base, opt = rows[-2], rows[-1]
        same = opt["fastest_configs"] == base["fastest_configs"]
        lower = 100 * (1 - opt["min_memory_bytes"] / base["min_memory_bytes"])
        ratio = opt["fastest_time_s"] / base["fastest_time_s"]
        print(f"  leanest plan {lower:.1f}% lower with the options; fastest plan time ratio {ratio:.4f}, "
              f"the same plan (no options): {same}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
