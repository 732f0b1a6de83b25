"""Pipelined plans at the scale of real models (issue 27): Llama-3-8B and -70B shapes, every memory
option, ``planner.pipeline: auto``.

Runs ``tensoropt plan`` on :mod:`scale`'s jobs (the same cases, cluster h100-128x8-ib, global batch
64 x 2048, bf16-mixed, AdamW, recompute/zero1/zero2/zero3, budget 80 GiB) and prints, per device
count, the plans kept, how many are pipelined, the fastest and the leanest plan with and without a
pipeline (the latter as the planner found them before merging), the stage solves and the pipeline
search's wall time, and the printed bound. ``--devices`` overrides a case's device counts.

Usage::

    .venv/bin/python benchmarks/pipeline_scale.py --case 70b --devices 512
    .venv/bin/python benchmarks/pipeline_scale.py --case 8b
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scale  # noqa: E402  (the cases and the subprocess run)

GIB = 2**30


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", action="append", choices=sorted(scale.CASES), help="default: 8b")
    parser.add_argument("--devices", default=None, help="comma-separated device counts (default: the case's)")
    parser.add_argument("--timeout-s", type=float, default=1800)
    parser.add_argument("--out", default="/tmp/pipeline_scale")
    parser.add_argument("--set", action="append", default=[],
                        help="job field override, e.g. planner.pipeline=off")
    args = parser.parse_args()
    print(f"load: {os.getloadavg()[0]:.1f} (1-minute average) on {os.cpu_count()} cores")
    for name in args.case or ["8b"]:
        overrides = ["planner.pipeline=auto", *args.set]
        if args.devices:
            overrides.append(f"devices=[{args.devices}]")
        r = scale.run_case(name, Path(args.out), args.timeout_s, overrides)
        print(f"case {name}: {r['wall_s']:.1f} s wall ({r['cpu_s']:.1f} s CPU), exit {r['rc']}")
        if r.get("bound_line"):
            print(f"  {r['bound_line']}")
        path = Path(args.out) / name / "frontier.json"
        if r["rc"] not in (0, 2) or not path.exists():
            print("  " + "\n  ".join(r.get("error", [])))
            continue
        print("  | devices | plans (pipelined) | fastest: pipelined / without | leanest: pipelined / without "
              "| stage solves | pipeline search s | bound |")
        print("  |---|---|---|---|---|---|---|")
        for f in json.loads(path.read_text())["frontiers"]:
            plans, search = f["plans"], f.get("pipeline_search") or {}
            piped = [p for p in plans if p.get("pipeline")]
            fast = min((p["time_s"] for p in piped), default=None)
            lean = min((p["memory_bytes"] for p in piped), default=None)
            un_fast, un_lean = search.get("unpipelined_fastest_s"), search.get("unpipelined_leanest_bytes")
            text = lambda v, f: "-" if v is None else f(v)  # noqa: E731
            seconds, gib = "{:.3f} s".format, lambda v: f"{v / GIB:.1f} GiB"
            print(f"  | {f['devices']} | {len(plans)} ({len(piped)}) | {text(fast, seconds)} / "
                  f"{text(un_fast, seconds)} | {text(lean, gib)} / {text(un_lean, gib)} | "
                  f"{search.get('stage_solves', 0)} | {f.get('timing_s', {}).get('pipeline', 0):.1f} | "
                  f"{100 * (f.get('epsilon_bound') or 0):.2g} % |")
            cpu = search.get("cpu_s")
            if cpu:  # this process's CPU seconds per part of the search (the machine is shared)
                chain = (search.get("stage_chain") or {}).get("cpu_s") or {}
                print("    pipeline search CPU s: " + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
                      + ("; of the stage frontiers: " + ", ".join(f"{k} {v:.1f}" for k, v in chain.items())
                         if chain else ""))
            for p in piped[:3]:
                print(f"    {p['id']}: {p['time_s']:.3f} s, {p['memory_bytes'] / GIB:.1f} GiB: "
                      f"{p['summary'][:200]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
