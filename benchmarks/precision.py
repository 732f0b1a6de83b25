"""Training precision on a real frontier: GPT-2 small planned in fp32, bf16 and bf16-mixed.

For the job (default configs/jobs/gpt2-small.yaml, one device count on its GPU cluster profile)
the frontier is solved once per precision. Reported per precision: plans on the frontier, the
fastest plan's step time and memory per device, the leanest plan's memory, and the planning wall
time; then each one's ratio to fp32, side by side. bf16-mixed keeps float32 master parameters,
gradients and Adam state (16 B per parameter) + bf16 activations + the bf16 copies ops keep, so
its memory sits between pure bf16's and fp32's, while it computes at the bf16 peak.

Usage::

    .venv/bin/python benchmarks/precision.py [--job configs/jobs/gpt2-small.yaml] [--devices 8]
        [--precisions fp32 bf16 bf16-mixed] [--json OUT]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import warnings
from pathlib import Path

from tensoropt.config import format_size, load_job
from tensoropt.planner import plan_job

ROOT = Path(__file__).resolve().parent.parent


def measure(job_path: Path, devices: int, precision: str) -> dict:
    """Plan ``job_path`` for ``devices`` devices in ``precision``; the frontier's summary figures.

    Example:
        >>> measure(ROOT / "configs/jobs/gpt2-small.yaml", 8, "bf16-mixed")["plans"] > 0  # doctest: +SKIP
        True
    """
    job = load_job(job_path)
    training = dataclasses.replace(job.training, precision=precision, dtype=None)
    job = dataclasses.replace(job, training=training, devices=[devices])
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frontier = plan_job(job).to_json()["frontiers"][0]
    wall_s = time.perf_counter() - start
    plans = frontier["plans"]
    fastest = min(plans, key=lambda p: p["time_s"])
    return {"precision": precision, "plans": len(plans), "fastest_time_s": fastest["time_s"],
            "fastest_memory_bytes": fastest["memory_bytes"],
            "leanest_memory_bytes": min(p["memory_bytes"] for p in plans), "plan_wall_s": wall_s}


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print one row per precision.

    Example:
        >>> main(["--precisions", "fp32"])  # doctest: +SKIP
        0
    """
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", type=Path, default=ROOT / "configs/jobs/gpt2-small.yaml")
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16", "bf16-mixed"])
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    rows = [measure(args.job, args.devices, name) for name in args.precisions]
    base = next((r for r in rows if r["precision"] == "fp32"), rows[0])
    print(f"{args.job.name} on {args.devices} devices")
    print(f"{'precision':<11} {'plans':>5} {'fastest':>11} {'x fp32':>7} {'its memory':>11} {'x fp32':>7} "
          f"{'leanest':>10} {'x fp32':>7} {'plan s':>7}")
    for r in rows:
        print(f"{r['precision']:<11} {r['plans']:>5} {r['fastest_time_s'] * 1e3:>9.2f}ms "
              f"{r['fastest_time_s'] / base['fastest_time_s']:>7.2f} "
              f"{format_size(r['fastest_memory_bytes']):>11} "
              f"{r['fastest_memory_bytes'] / base['fastest_memory_bytes']:>7.2f} "
              f"{format_size(r['leanest_memory_bytes']):>10} "
              f"{r['leanest_memory_bytes'] / base['leanest_memory_bytes']:>7.2f} {r['plan_wall_s']:>7.1f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
