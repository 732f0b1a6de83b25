"""Memory options on real frontiers: GPT-2 small and GPT 1.3B with and without recompute / ZeRO-1/2/3.

For each job (configs/jobs/gpt2-small.yaml, gpt-1.3b.yaml, planned for one device count on their
GPU cluster profile) the frontier is solved once per option set (default: none;
``[recompute, zero3]``; all of ``[recompute, zero1, zero2, zero3]``). Reported: plans on each
frontier, how many use each option, the leanest plan's per-device memory (how much lower with the
options), the fastest plan's time and whether the fastest plan with options is the same plan as
without (no options; the share of its layers that are plain data parallel, ``batch=P``), and the
planning wall time.

Usage::

    .venv/bin/python benchmarks/memory_options.py [--jobs gpt2-small gpt-1.3b] [--devices 8] [--epsilon 0]
        [--sets none recompute,zero3 recompute,zero1,zero2,zero3] [--space auto] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import warnings
from pathlib import Path

from tensoropt.config import format_size, load_job
from tensoropt.configspace.options import MEMORY_OPTIONS
from tensoropt.planner import plan_job

ROOT = Path(__file__).resolve().parent.parent


def _tokens(config: str) -> list[str]:
    """A layer label's tokens without bracketed detail (``"batch=16[nodes=2],zero2"`` -> batch=16, zero2)."""
    return re.sub(r"\[[^\]]*\]", "", config).split(",")


def _split(config: str) -> str:
    """A layer's split without its memory options (``"batch=8,zero2"`` -> ``"batch=8"``)."""
    return ",".join(t for t in _tokens(config) if t not in MEMORY_OPTIONS)


def _batch_share(plan: dict, devices: int) -> float:
    """Fraction of the plan's layers that split only their batch over all devices (any options)."""
    rows = plan["layers"]
    return sum(1 for r in rows if _split(r["config"]) == f"batch={devices}") / max(1, len(rows))


def _option_counts(plans: list[dict]) -> dict[str, int]:
    """Option -> number of frontier plans with at least one layer carrying it."""
    counts: dict[str, int] = {}
    for p in plans:
        used = {t for r in p["layers"] for t in _tokens(r["config"]) if t in MEMORY_OPTIONS}
        for o in used:
            counts[o] = counts.get(o, 0) + 1
    return dict(sorted(counts.items()))


def run(job_name: str, devices: int, options: list[str], epsilon: float = 0.0, space: str = "auto") -> dict:
    """Plan one job for ``devices`` with ``options``; returns the frontier's figures.

    Example:
        >>> run("gpt2-small", 8, ["zero2"])["plans"]  # doctest: +SKIP
        181
    """
    job = load_job(ROOT / "configs" / "jobs" / f"{job_name}.yaml")
    job.devices = [devices]
    job.planner.epsilon = epsilon
    job.planner.space = space
    job.training.memory_options = list(options)
    start = time.perf_counter()
    solving = []  # when the solver started (after the cost graph was built)

    def progress(message: str, fraction: float) -> None:
        if message.startswith("solving") and not solving:
            solving.append(time.perf_counter() - start)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fj = plan_job(job, progress).to_json()
    seconds = time.perf_counter() - start
    plans = [p for f in fj["frontiers"] for p in f["plans"]]
    lean = min(plans, key=lambda p: p["memory_bytes"])
    fast = min(plans, key=lambda p: p["time_s"])
    return {
        "job": job_name, "devices": devices, "options": list(options), "plans": len(plans),
        "epsilon": epsilon, "space": space, "option_counts": _option_counts(plans),
        "plan_seconds": round(seconds, 1),
        "cost_graph_seconds": round(solving[0], 1) if solving else None,
        "configurations": sum(len(c) for f in fj["frontiers"] for c in f["configurations"].values()),
        "min_memory_bytes": lean["memory_bytes"], "min_memory_time_s": lean["time_s"],
        "fastest_time_s": fast["time_s"], "fastest_memory_bytes": fast["memory_bytes"],
        "fastest_batch_share": _batch_share(fast, devices),
        "fastest_configs": {r["node"]: r["config"] for r in fast["layers"]},
        "fastest_splits": {r["node"]: _split(r["config"]) for r in fast["layers"]},
        "fastest_summary": fast.get("summary", ""), "leanest_summary": lean.get("summary", ""),
    }


def main(argv: list[str] | None = None) -> int:
    """Print the comparison table (and write it as JSON with ``--json``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", nargs="+", default=["gpt2-small", "gpt-1.3b"])
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--epsilon", type=float, default=0.0, help="planner.epsilon (0: exact frontiers)")
    ap.add_argument("--space", default="auto", choices=["auto", "full", "hierarchical"], help="planner.space")
    ap.add_argument("--sets", nargs="+", default=["none", "recompute,zero3", ",".join(MEMORY_OPTIONS)],
                    help="option sets, comma-separated (none: without options; the first is the baseline)")
    args = ap.parse_args(argv)
    sets = [[] if s == "none" else s.split(",") for s in args.sets]
    rows = []
    for name in args.jobs:
        first = None
        for options in sets:
            r = run(name, args.devices, options, args.epsilon, args.space)
            rows.append(r)
            print(f"{name:11s} P={r['devices']:<3d} options={','.join(options) or '-':26s} "
                  f"plans={r['plans']:<5d} leanest {format_size(r['min_memory_bytes']):>10s} "
                  f"fastest {r['fastest_time_s'] * 1e3:8.2f} ms ({format_size(r['fastest_memory_bytes'])}, "
                  f"{100 * r['fastest_batch_share']:.0f}% of layers batch={r['devices']}) "
                  f"[{r['plan_seconds']} s, cost graph {r['cost_graph_seconds']} s, "
                  f"{r['configurations']} configurations] plans using: {r['option_counts']}",
                  flush=True)
            if first is None:
                first = r
                continue
            same = r["fastest_configs"] == first["fastest_configs"]
            same_split = r["fastest_splits"] == first["fastest_splits"]
            lower = 100 * (1 - r["min_memory_bytes"] / first["min_memory_bytes"])
            ratio = r["fastest_time_s"] / first["fastest_time_s"]
            baseline = ",".join(first["options"]) or "without options"
            print(f"  leanest plan {lower:.1f}% lower than {baseline}; fastest plan time ratio {ratio:.4f}, "
                  f"the same plan: {same}, the same splits (options aside): {same_split}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
