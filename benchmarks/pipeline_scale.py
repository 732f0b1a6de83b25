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
              "| candidates (p) | stage solves | bound | CPU s | wall s |")
        print("  |---|---|---|---|---|---|---|---|---|")
        frontiers = json.loads(path.read_text())["frontiers"]
        for f in frontiers:
            plans, search = f["plans"], f.get("pipeline_search") or {}
            piped = [p for p in plans if p.get("pipeline")]
            fast = min((p["time_s"] for p in piped), default=None)
            lean = min((p["memory_bytes"] for p in piped), default=None)
            un_fast, un_lean = search.get("unpipelined_fastest_s"), search.get("unpipelined_leanest_bytes")
            if not search:  # no pipeline tried: the frontier is the one without
                un_fast = min((p["time_s"] for p in plans), default=None)
                un_lean = min((p["memory_bytes"] for p in plans), default=None)
            timing = f.get("timing_s", {})
            stages = ",".join(str(c[0]) for c in search.get("candidates", [])) or "-"
            print(f"  | {f['devices']} | {len(plans)} ({len(piped)}) | {_text(fast, _s)} / "
                  f"{_text(un_fast, _s)} | {_text(lean, _gib)} / {_text(un_lean, _gib)} | {stages} | "
                  f"{search.get('stage_solves', 0)} | "
                  f"{100 * (f.get('epsilon_bound') or 0):.2g} % | {timing.get('cpu', 0):.1f} | "
                  f"{timing.get('wall', 0):.1f} |")
        for f in frontiers:
            search = f.get("pipeline_search") or {}
            cpu = search.get("cpu_s")
            if cpu:  # this process's CPU seconds per part of the search (the machine is shared)
                chain = (search.get("stage_chain") or {}).get("cpu_s") or {}
                print(f"  {f['devices']}: pipeline search CPU s: "
                      + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
                      + ("; of the stage frontiers: " + ", ".join(f"{k} {v:.1f}" for k, v in chain.items())
                         if chain else ""))
        if frontiers and frontiers[-1].get("pipeline_search"):
            compare(frontiers[-1])
    return 0


def _text(v, f) -> str:
    return "-" if v is None else f(v)


def _s(v: float) -> str:
    return f"{v:.3f} s"


def _gib(v: float) -> str:
    return f"{v / GIB:.1f} GiB"


def compare(f: dict) -> None:
    """Where the pipelined plans of one device count stand against the best plans without a
    pipeline: the frontier without pipelines (before merging), and for each of its plans the
    fastest pipelined plan within its memory and the leanest pipelined plan within its time."""
    search, plans = f["pipeline_search"], f["plans"]
    piped = [p for p in plans if p.get("pipeline")]
    unpiped = sorted(search.get("unpipelined_points") or [])
    print(f"  {f['devices']} GPUs: {len(plans)} plans on the merged frontier, {len(piped)} pipelined; "
          f"bound {100 * (f.get('epsilon_bound') or 0):.2g} %")
    print("  | without a pipeline: time, memory | fastest pipelined within its memory | "
          "leanest pipelined within its time |")
    print("  |---|---|---|")
    for t, w in unpiped:
        faster = [p for p in piped if p["memory_bytes"] <= w]
        leaner = [p for p in piped if p["time_s"] <= t]
        best_t = min(faster, key=lambda p: p["time_s"], default=None)
        best_w = min(leaner, key=lambda p: p["memory_bytes"], default=None)
        one = (f"{best_t['time_s']:.3f} s ({100 * (best_t['time_s'] / t - 1):+.0f} %), "
               f"{best_t['memory_bytes'] / GIB:.1f} GiB" if best_t else "none")
        two = (f"{best_w['memory_bytes'] / GIB:.1f} GiB ({100 * (best_w['memory_bytes'] / w - 1):+.0f} %), "
               f"{best_w['time_s']:.3f} s" if best_w else "none")
        print(f"  | {t:.3f} s, {w / GIB:.1f} GiB | {one} | {two} |")
    for p in piped[:1] + piped[-1:]:
        print(f"    {p['id']}: {p['time_s']:.3f} s, {p['memory_bytes'] / GIB:.1f} GiB: {p['summary'][:240]}")


if __name__ == "__main__":
    sys.exit(main())
