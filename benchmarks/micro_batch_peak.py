"""Planned accumulation measured (issue 25): a 4-micro-batch plan's peak against the 1-micro-batch
plan's, predicted and measured, on 2 CPU processes.

One job is planned twice for 2 devices (``training.micro_batches: 1``, then ``4``); of each frontier
the plan of one chosen split (the same placements label set in both: ``--split``, by default the
leanest 1-micro-batch plan's) is run by ``tensoropt run``'s measuring worker
(:mod:`tensoropt.training.worker`, which runs the plan's micro-batches: all but the last under
``no_sync``) in one launch. Per plan, one table row: the predicted ``memory_bytes``, the predicted
peak without the runtime's own memory (``predicted.peak_tensor_bytes``) against the measured
live-tensor high-water mark (``measured.peak_tensor_bytes``, the first step's), the resident-set
peak beside it (``measured.peak_bytes``), and the predicted against the measured median step time.
The last rows compare the two plans: predicted and measured fall of the peak (4 over 1), and each
plan's time error (measured over predicted).

Usage::

    .venv/bin/python benchmarks/micro_batch_peak.py [--model gpt|mlp] [--steps 4] [--compute profiled]

The step times of one launch run each plan after the other, not interleaved: on this loaded machine
their ratio is the load's (``benchmarks/micro_batch_time.py`` interleaves them and reads CPU time).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from pathlib import Path

from tensoropt.config import Job
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.launch import LaunchOptions, launch_workers
from tensoropt.planner import plan_job
from tensoropt.plans import plan_file_text
from tensoropt.tables import format_table

MIB = 2**20

JOBS = {
    "gpt": {"model": {"name": "gpt", "kwargs": {"layers": 2, "width": 128, "heads": 4, "seq_len": 128,
                                                "vocab_size": 512, "dropout": 0.0}},
            "training": {"global_batch_size": 32, "optimizer": "adamw", "learning_rate": 1e-3, "steps": 4},
            "cluster": "cpu-local", "devices": [2], "planner": {"epsilon": 0}},
    "mlp": {"model": {"name": "mlp", "task": "classification", "input_shape": [512], "num_classes": 512,
                      "kwargs": {"in_features": 512, "hidden": [2048, 2048], "num_classes": 512}},
            "training": {"global_batch_size": 1024, "optimizer": "adamw", "learning_rate": 1e-3, "steps": 4},
            "cluster": "cpu-local", "devices": [2], "planner": {"epsilon": 0}},
}
"""Jobs whose saved activations outweigh their state (parameters, gradients, AdamW's moments), so a
quarter of them shows in the peak."""


def planned(name: str, micro_batches: int, compute: str = "roofline") -> tuple[Job, dict]:
    """(the job, its 2-device frontier.json) with ``training.micro_batches`` and ``planner.compute`` set."""
    data = json.loads(json.dumps(JOBS[name]))
    data["training"]["micro_batches"] = micro_batches
    data["planner"]["compute"] = compute
    job = Job.from_dict(data, name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return job, plan_job(job).to_json()


def _labels(plan: dict) -> tuple:
    return tuple(sorted((k, v.get("label")) for k, v in plan["placements"].items()))


def choose(frontiers: dict[int, dict], split: str | None) -> dict[int, dict]:
    """Micro-batch count -> the plan (plan.json content) of one split in every count's frontier."""
    docs = {m: [json.loads(plan_file_text(f, p["id"])) for p in f["frontiers"][0]["plans"]]
            for m, f in frontiers.items()}
    if split is None:  # the leanest 1-micro-batch plan's placements, found in every frontier
        pick = min(docs[1], key=lambda d: d["memory_bytes"])
    else:
        pick = next(d for d in docs[1] if d["id"] == split)
    chosen = {}
    for m, plans in docs.items():
        same = [d for d in plans if _labels(d) == _labels(pick)]
        if not same:
            raise SystemExit(f"the split of plan {pick['id']} ({pick.get('summary')}) is not on the "
                             f"{m}-micro-batch frontier; pass --split with another plan id")
        chosen[m] = min(same, key=lambda d: d["memory_bytes"])
    return chosen


def measure(name: str, counts: list[int], steps: int, split: str | None, out: Path,
            compute: str = "roofline") -> list[dict]:
    """Plan, run every count's plan in one 2-process launch; each run's metrics document."""
    frontiers, specs = {}, {}
    for m in counts:
        job, frontiers[m] = planned(name, m, compute)
        specs[m] = TrainSpec.from_job(job)
    chosen = choose(frontiers, split)
    runs = [{"spec": specs[m].to_json(), "plan": chosen[m], "metrics": str(out / f"m{m}.json")}
            for m in counts]
    rc = launch_workers({"steps": steps, "runs": runs}, LaunchOptions(2, timeout_s=1800),
                        env={"TENSOROPT_COLLECTIVE_TIMEOUT_S": "120"})
    if rc != 0:
        raise SystemExit(f"the workers failed (exit code {rc})")
    return [{**json.loads((out / f"m{m}.json").read_text()), "micro_batches": m,
             "summary": chosen[m].get("summary")} for m in counts]


def table(results: list[dict]) -> str:
    rows = []
    for r in results:
        pred, meas = r["predicted"], r["measured"]
        err = meas["peak_tensor_bytes"] / pred["peak_tensor_bytes"] - 1
        rows.append([r["micro_batches"], r["plan_id"], f"{pred['memory_bytes'] / MIB:.2f}",
                     f"{pred['peak_tensor_bytes'] / MIB:.2f}", f"{meas['peak_tensor_bytes'] / MIB:.2f}",
                     f"{100 * err:+.1f} %", f"{meas['peak_bytes'] / MIB:.2f}",
                     f"{pred['time_s'] * 1e3:.1f}", f"{meas['time_s'] * 1e3:.1f}",
                     f"{meas['time_s'] / pred['time_s']:.2f}"])
    one, *rest = results
    headers = ["m", "plan", "predicted memory MiB", "predicted peak MiB", "measured tensor peak MiB", "error",
               "resident peak MiB", "predicted ms", "measured ms", "measured / predicted"]
    lines = [format_table(headers, rows, right=list(range(2, 10)))]
    for r in rest:
        pred = r["predicted"]["peak_tensor_bytes"] / one["predicted"]["peak_tensor_bytes"]
        meas = r["measured"]["peak_tensor_bytes"] / one["measured"]["peak_tensor_bytes"]
        resident = r["measured"]["peak_bytes"] / max(1, one["measured"]["peak_bytes"])
        lines.append(f"peak, {r['micro_batches']} over 1 micro-batch: predicted {pred:.3f}, "
                     f"measured {meas:.3f}; resident {resident:.3f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(JOBS), default="gpt")
    parser.add_argument("--counts", default="1,4", help="micro-batch counts, the first the reference")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--split", default=None, help="the 1-micro-batch plan id whose split runs")
    parser.add_argument("--compute", choices=("roofline", "profiled"), default="roofline",
                        help="planner.compute (profiled: the kernels timed on this machine, as "
                             "benchmarks/fidelity.py prices them)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="micro-batch-peak-") as tmp:
        results = measure(args.model, [int(c) for c in args.counts.split(",")], args.steps, args.split,
                          Path(tmp), args.compute)
    for r in results:
        print(f"m={r['micro_batches']}: plan {r['plan_id']}: {r['summary']}")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
