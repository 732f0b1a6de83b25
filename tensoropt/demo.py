"""``make demo`` (``python -m tensoropt.demo``): what a new user wants to see, in one command.

1. Plans a real model on a GPU cluster profile (VGG-16 on one 8 x H100 node, 1-8 devices):
   prints each frontier, selects the fastest plan under the job's budget, writes
   ``out/demo/vgg16/{frontier.json,plan.json,pareto.html}``.
2. Plans a small model on ``cpu-local`` (configs/jobs/cpu-demo.yaml, 1-2 processes) the same way.
3. Runs the small model's selected plan for a few steps on 2 local processes and prints the
   predicted against the measured step time and memory (:func:`run_selected_plan`; needs the
   executor's ``tensoropt run``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tensoropt import cli
from tensoropt.config import format_size
from tensoropt.tables import format_table, format_time

REPO = Path(__file__).resolve().parent.parent
JOBS = REPO / "configs" / "jobs"
GPU_JOB, GPU_DEVICES = JOBS / "vgg16.yaml", "1,2,4,8"
CPU_JOB = JOBS / "cpu-demo.yaml"


def plan(job: Path, out: Path, devices: str | None = None) -> int:
    """``tensoropt plan JOB --out OUT [--devices D]``; returns its exit code."""
    argv = ["plan", str(job), "--out", str(out), "--rows", "8"]
    if devices:
        argv += ["--devices", devices]
    print(f"\n$ tensoropt {' '.join(argv)}", flush=True)
    return cli.main(argv)


def run_selected_plan(job: Path, out: Path, nproc: int = 2, steps: int = 5) -> int:
    """Run ``out/plan.json`` of ``job`` on ``nproc`` local processes; print predicted vs measured.

    This is the executor's part of the demo: it calls ``tensoropt run JOB --plan OUT/plan.json
    --nproc N --steps S --metrics OUT/metrics.json`` and reads the metrics file (issue 6
    schema). Where the ``run`` command is not available yet, it says so and returns 0.
    """
    if not cli.command_available("run"):
        print("\n(skipping the 2-process run: the `tensoropt run` command is not available in this build)")
        return 0
    metrics = out / "metrics.json"
    argv = [
        "run",
        str(job),
        "--plan",
        str(out / "plan.json"),
        "--nproc",
        str(nproc),
        "--steps",
        str(steps),
        "--metrics",
        str(metrics),
    ]
    print(f"\n$ tensoropt {' '.join(argv)}", flush=True)
    rc = cli.main(argv)
    if rc != 0 or not metrics.exists():
        return rc or 1
    print(predicted_vs_measured(json.loads(metrics.read_text())))
    return 0


def predicted_vs_measured(metrics: dict) -> str:
    """A small table of predicted vs measured step time and memory from a metrics JSON.

    Example:
        >>> m = {"plan_id": "d2-p0", "devices": 2, "predicted": {"time_s": 0.01, "memory_bytes": 2**20},
        ...      "measured": {"time_s": 0.011, "memory_bytes": 2**20}}
        >>> "+10.0%" in predicted_vs_measured(m)
        True
    """
    pred, meas = metrics.get("predicted", {}), metrics.get("measured", {})
    rows = []
    for key, fmt in (("time_s", format_time), ("memory_bytes", format_size)):
        p, m = pred.get(key), meas.get(key)
        if p is None or m is None:
            continue
        error = f"{(m - p) / p * 100:+.1f}%" if p else "-"
        rows.append([key, fmt(p), fmt(m), error])
    head = f"plan {metrics.get('plan_id')} on {metrics.get('devices')} processes"
    return (
        head
        + "\n"
        + format_table(["", "predicted", "measured", "measured vs predicted"], rows, right=[1, 2, 3])
    )


def main(argv: list[str] | None = None) -> int:
    """Plan the GPU job and the CPU job, then run the CPU job's plan on 2 processes."""
    parser = argparse.ArgumentParser(
        prog="python -m tensoropt.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", default="out/demo", help="output folder (default: out/demo)")
    parser.add_argument("--no-run", action="store_true", help="plan only; skip the 2-process run")
    args = parser.parse_args(argv)
    out = Path(args.out)
    status = 0
    gpu_out, cpu_out = out / GPU_JOB.stem, out / CPU_JOB.stem
    for job, target, devices in ((GPU_JOB, gpu_out, GPU_DEVICES), (CPU_JOB, cpu_out, None)):
        rc = plan(job, target, devices)
        if rc not in (0, 2):  # 2: nothing fits the budget, still a result worth showing
            return rc
    if not args.no_run and (cpu_out / "plan.json").exists():
        status = run_selected_plan(CPU_JOB, cpu_out)
    print(
        f"\nOpen {gpu_out / 'pareto.html'} and {cpu_out / 'pareto.html'} in a browser to explore "
        "the trade-offs; "
        f"`tensoropt explain {cpu_out / 'plan.json'}` shows a plan operator by operator."
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
