"""Measured step time of a frontier's pipelined plans against the planner's prediction.

    python benchmarks/pipeline_step.py JOB.yaml FRONTIER.json [--nproc 2] [--steps 8]

Every plan of FRONTIER.json whose ``"pipeline"`` is set, for ``--nproc`` devices, is trained by the
pipelined runtime (tensoropt.pipeline_runtime, eager stages) in one launch, one plan after the
other; the table gives each plan's schedule, micro-batches, predicted bubble, predicted step and
the median measured step (the first step, which builds the stages' state, left out).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path


def main() -> None:
    from tensoropt.config import load_job
    from tensoropt.executor.job.spec import TrainSpec
    from tensoropt.launch import LaunchOptions, launch_module
    from tensoropt.plans import plan_file_text

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job")
    parser.add_argument("frontier")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    frontier = json.loads(Path(args.frontier).read_text())
    spec = TrainSpec.from_job(load_job(args.job), steps=args.steps)
    plans = [json.loads(plan_file_text(frontier, p["id"])) for f in frontier["frontiers"]
             if f["devices"] == args.nproc for p in f["plans"] if p.get("pipeline")]
    if not plans:
        raise SystemExit(f"{args.frontier}: no pipelined plan for {args.nproc} devices")
    with tempfile.TemporaryDirectory(prefix="pipeline-step-") as tmp:
        runs = [{"spec": spec.to_json(), "plan": p, "steps": args.steps,
                 "metrics": str(Path(tmp) / f"{p['id']}.json")} for p in plans]
        path = Path(tmp) / "run.json"
        path.write_text(json.dumps({"runs": runs, "timeout_s": 300}))
        rc = launch_module("tensoropt.pipeline_runtime.worker", [str(path)],
                           LaunchOptions(args.nproc, timeout_s=1200))
        if rc != 0:
            raise SystemExit(f"the workers failed (exit code {rc})")
        rows = [(p, json.loads(Path(r["metrics"]).read_text())) for p, r in zip(plans, runs)]
    print(f"{'plan':8} {'schedule':8} {'m':>3} {'bubble':>7} {'predicted':>10} {'measured':>10} {'ratio':>6}")
    for p, m in rows:
        pipe, detail = p["pipeline"], p.get("pipeline_detail") or {}
        predicted, measured = p["time_s"], m["measured"]["time_s"]
        print(f"{p['id']:8} {pipe['schedule']:8} {pipe['micro_batches']:>3} "
              f"{100 * detail.get('bubble_fraction', 0):>6.0f}% {1e3 * predicted:>8.2f}ms "
              f"{1e3 * measured:>8.2f}ms {measured / predicted:>6.1f}")


if __name__ == "__main__":
    main()
