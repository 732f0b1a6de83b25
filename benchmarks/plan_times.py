"""How long `tensoropt plan` takes per example job, stage by stage (the issue-5 acceptance figures).

Runs ``tensoropt plan configs/jobs/<job>.yaml`` for each job in a subprocess with a time limit and
prints, per job: the wall time, the plans found, and per device count the cost-graph, solve and
breakdown seconds recorded in frontier.json (``timing_s``). A job that runs out of time shows the
last device count it reached.

Usage::

    .venv/bin/python benchmarks/plan_times.py [JOB ...] [--timeout-s 600] [--out /tmp/plan_times]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
JOBS = ("mlp", "alexnet", "vgg16", "resnet50", "wide-resnet", "gpt2-small", "bert-base", "gpt-1.3b")


def plan_once(job: str, out: Path, timeout_s: float) -> dict:
    """Run one `tensoropt plan`; return wall time, exit code, per-count timing or the last progress line."""
    start = time.perf_counter()
    cmd = [
        sys.executable,
        "-m",
        "tensoropt.cli",
        "plan",
        str(REPO / "configs" / "jobs" / f"{job}.yaml"),
        "--out",
        str(out / job),
        "--rows",
        "1",
        "--no-plot",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)
        rc, err = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, err = None, (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    result = {"job": job, "wall_s": time.perf_counter() - start, "rc": rc}
    frontier = out / job / "frontier.json"
    if rc in (0, 2) and frontier.exists():
        data = json.loads(frontier.read_text())
        result["capture_s"] = data.get("timing_s", {}).get("capture")
        result["counts"] = [(f["devices"], len(f["plans"]), f.get("timing_s", {})) for f in data["frontiers"]]
    else:
        reached = re.findall(r"(\d+) devices?: (\d+) plans", err)
        result["reached"] = reached[-1] if reached else None
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("jobs", nargs="*", default=list(JOBS))
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument("--out", default="/tmp/plan_times")
    args = parser.parse_args()
    for job in args.jobs:
        r = plan_once(job, Path(args.out), args.timeout_s)
        if "counts" in r:
            plans = sum(n for _, n, _ in r["counts"])
            print(
                f"{job}: {r['wall_s']:.1f} s wall, exit {r['rc']}, {plans} plans, "
                f"capture {r['capture_s']:.1f} s"
            )
            for devices, n, t in r["counts"]:
                stages = ", ".join(f"{k} {v:.2f} s" for k, v in t.items())
                print(f"  {devices:5d} devices: {n:5d} plans; {stages}")
        else:
            status = "timed out" if r["rc"] is None else f"failed (exit {r['rc']})"
            reached = (
                f"; last finished: {r['reached'][0]} devices ({r['reached'][1]} plans)"
                if r["reached"]
                else ""
            )
            print(f"{job}: {status} after {r['wall_s']:.1f} s{reached}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
