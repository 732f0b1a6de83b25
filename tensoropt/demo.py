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


def run_selected_plan(job: Path, out: Path, nproc: int = 2, steps: int = 20) -> int:
    """Run ``out/plan.json`` of ``job`` on ``nproc`` local processes (the executor's part of the demo).

    Calls ``tensoropt run JOB --plan OUT/plan.json --nproc N --steps S --metrics
    OUT/metrics.json``, which prints the predicted against the measured step time and memory;
    when the selected plan is for another device count, ``tensoropt select OUT/frontier.json
    --devices N --rule fastest`` first writes the fastest plan on exactly N devices. Where the
    ``run`` command is not available, it says so and returns 0.
    """
    if not cli.command_available("run"):
        print("\n(skipping the 2-process run: the `tensoropt run` command is not available in this build)")
        return 0
    devices = json.loads((out / "plan.json").read_text()).get("devices")
    if devices != nproc:  # the job's rule chose another device count: pick its best plan for nproc
        argv = ["select", str(out / "frontier.json"), "--devices", str(nproc), "--rule", "fastest"]
        print(f"\n$ tensoropt {' '.join(argv)}", flush=True)
        rc = cli.main(argv)
        if rc != 0:
            return rc
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
        str(out / "metrics.json"),
    ]
    print(f"\n$ tensoropt {' '.join(argv)}", flush=True)
    return cli.main(argv)


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
