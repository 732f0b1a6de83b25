"""``make demo`` (``python -m tensoropt.demo``): what a new user wants to see, in one command.

1. Plans a real model on a GPU cluster profile (VGG-16 on one 8 x H100 node, 1-8 devices):
   prints each frontier, selects the fastest plan under the job's budget, writes
   ``out/demo/vgg16/{frontier.json,plan.json,pareto.html}``.
2. Plans a small model on ``cpu-local`` (configs/jobs/cpu-demo.yaml, 1-2 processes) the same way.
3. Runs the small model's selected plan for a few steps on 2 local processes and prints the
   predicted against the measured step time and memory (:func:`run_selected_plan`).

Any step that fails makes the demo fail: it says which command failed and exits non-zero.
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
    --devices N --rule fastest`` first writes the fastest plan on exactly N devices. Returns the
    first non-zero exit code (after saying on stderr which command failed), or 0.

    Example:
        >>> run_selected_plan(CPU_JOB, Path("out/demo/cpu-demo"))  # 2 processes, 20 s  # doctest: +SKIP
        0
    """
    if not cli.command_available("run"):
        print("make demo: the `tensoropt run` command does not import in this build; "
              "`python -c 'import tensoropt.commands.run'` shows why", file=sys.stderr)
        return cli.EXIT_ERROR
    devices = json.loads((out / "plan.json").read_text()).get("devices")
    if devices != nproc:  # the job's rule chose another device count: pick its best plan for nproc
        argv = ["select", str(out / "frontier.json"), "--devices", str(nproc), "--rule", "fastest"]
        print(f"\n$ tensoropt {' '.join(argv)}", flush=True)
        rc = cli.main(argv)
        if rc != 0:
            return _failed(argv, rc)
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
    rc = cli.main(argv)
    return _failed(argv, rc) if rc != 0 else 0


def _failed(argv: list[str], rc: int) -> int:
    """Say on stderr which command failed; returns its exit code."""
    print(f"make demo: `tensoropt {' '.join(argv)}` failed with exit code {rc} (see its messages above)",
          file=sys.stderr, flush=True)
    return rc


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
            print(f"make demo: planning {job} failed with exit code {rc} (see its messages above)",
                  file=sys.stderr)
            return rc
    if not args.no_run:
        if not (cpu_out / "plan.json").exists():
            print(f"make demo: no plan of {CPU_JOB} fits its memory budget, so there is nothing to run; "
                  "raise memory_budget in that file", file=sys.stderr)
            return cli.EXIT_ERROR
        status = run_selected_plan(CPU_JOB, cpu_out)
    print(
        f"\nOpen {gpu_out / 'pareto.html'} and {cpu_out / 'pareto.html'} in a browser to explore "
        "the trade-offs; "
        f"`tensoropt explain {cpu_out / 'plan.json'}` shows a plan operator by operator."
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
