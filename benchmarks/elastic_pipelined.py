"""Elastic relaunch between a plan without stages and a pipelined plan on 2 and 4 processes (issue
27): tests/elastic/test_elastic_pipelined.py's scenario (tests/elastic/pipelined_scenario.py) with
torchrun agents of 2 processes each, too slow for the test suite on 2 shared cores.

Agent a alone: world size 2 on the 2-device plan without stages, step 1. Agent b joins: world size 4
on a pipelined plan (2 stages x 2 replicas, 1F1B, 2 micro-batches), resumed from the loop's
checkpoint, step 2. Agent b killed: world size 2 again, resumed from the pipelined checkpoint,
step 3. Prints every step's loss, learning rate and gradient norm beside the uninterrupted
1-process loop's, the starts of elastic-log.jsonl and the seconds to each checkpoint; exits 1 when a
relative difference exceeds 1e-5 or a start is not the expected one.

Usage::

    .venv/bin/python benchmarks/elastic_pipelined.py [--per-agent 2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "elastic"))

from elastic_helpers import Agents  # noqa: E402
from pipelined_scenario import JOIN, KILL, STEPS, TOL, differences, gain_and_lose  # noqa: E402

from tensoropt.tables import format_table  # noqa: E402


def _cpu_s() -> float:
    """User + sys seconds of this process and the children it waited for."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-agent", type=int, default=2,
                        help="processes per agent (default 2: world sizes 2 -> 4 -> 2)")
    parser.add_argument("--timeout-s", type=float, default=580, help="each run's limit (default 580)")
    parser.add_argument("--keep", default=None, help="copy the run's folder (logs, checkpoints) here")
    args = parser.parse_args(argv)
    p = args.per_agent
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    tmp = Path(tempfile.mkdtemp(prefix="elastic-pipelined-"))
    agents = Agents(tmp)
    wall, cpu = time.perf_counter(), _cpu_s()
    try:
        ran = gain_and_lose(tmp, agents, per_agent=p, timeout_s=args.timeout_s)
    finally:
        agents.close()
        if args.keep:
            shutil.copytree(tmp, args.keep, dirs_exist_ok=True)
    wall, cpu = time.perf_counter() - wall, _cpu_s() - cpu
    plans = {ran.alone["plan_id"]: "no stages", ran.at_kill["plan_id"]: "pipelined"}
    rows, worst = [], 0.0
    by_step = {}
    for step, key, got, want, rel in differences(ran):
        by_step.setdefault(step, {})[key] = (got, want, rel)
        worst = max(worst, rel)
    for step, values in by_step.items():
        size = p if step <= JOIN or step > KILL else 2 * p
        plan = ran.alone["plan_id"] if size == p else ran.at_kill["plan_id"]
        diffs = [f"{values[k][2]:.1e}" for k in ("loss", "lr", "grad_norm")]
        rows.append([step, f"{size}, {plan} ({plans[plan]})", f"{values['loss'][0]:.6f}",
                     f"{values['loss'][1]:.6f}", *diffs])
    print(f"load before: {load}")
    print(format_table(["step", "world size, plan", "loss", "1-process loss", "loss rel. diff",
                        "lr rel. diff", "grad norm rel. diff"], rows))
    starts = [(e["world_size"], e["plan_id"], e["resumed_from"]) for e in ran.events]
    print(f"elastic-log.jsonl starts (world size, plan, resumed from): {starts}")
    print(f"checkpoint folders left (--keep-checkpoints 1): {ran.folders}")
    print("seconds from the first start: " + ", ".join(f"{k} {v:.1f}" for k, v in ran.times_s.items())
          + f"; total {wall:.1f} s wall, {cpu:.1f} s CPU (this process and its children)")
    print(f"load after: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    expected = [(p, ran.alone["plan_id"], None), (2 * p, ran.at_kill["plan_id"], JOIN),
                (p, ran.alone["plan_id"], KILL)]
    ok = (worst <= TOL and starts == expected and ran.folders == [f"step-{STEPS}"]
          and ran.at_kill.get("pipelined") and ran.at_kill["plan_id"] in ran.staged)
    print("PASS" if ok else "FAIL", f"(largest relative difference {worst:.1e}, tolerance {TOL:.0e})")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
