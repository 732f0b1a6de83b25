"""Peak memory per process where it is spent, against the memory model (issue 16 items 3 and 4).

For the big-fc MLP (25.2M parameters, AdamW, batch 16), the zoo ``gpt`` (4 x 256, seq 128,
batch 8, AdamW) and the tiny HuggingFace Llama of ``configs/jobs/hf-llama.yaml``, planned by
``tensoropt plan`` on cpu-local for 1 and 2 devices, runs ``--steps`` steps of the 1-device plan
(1 process), and of the fastest and the leanest 2-device plans (2 gloo processes, each in a launch
of its own so no other plan's memory is alive), and tabulates per process:

* ``predicted``: the plan's predicted memory per device (parameters + gradients + optimizer state
  + saved activations + the plan's transient buffers);
* ``memory``: the executor's accounting figure ``measured.memory_bytes`` (the storages the plan
  owns, counted once);
* ``peak``: ``measured.peak_bytes``, the resident-set high-water mark of the training loop above
  the process's level before the model was built (:mod:`tensoropt.executor.state.peak_memory`);
* ``predicted peak``: the memory model's peak (:mod:`estimators.peak`: ``predicted`` plus the
  optimizer step's temporaries beyond the saved activations plus the device profile's
  ``runtime_overhead_bytes``) and its error against ``peak``; ``peak / 1-process peak``;
* ``tensor peak``: ``measured.peak_tensor_bytes``, the high-water mark of live tensor bytes in the
  first step (:mod:`tensoropt.executor.state.tensor_peak`; no allocator setting changes it), beside the
  memory model's peak without the runtime's own memory (``predicted.peak_tensor_bytes``) and its error.

``--calibrate`` measures ``runtime_overhead_bytes`` instead, as ``tensoropt calibrate --memory``
does: the peak of a tiny model's training loop (an MLP 8 -> 16 -> 4, SGD) in one worker process;
put it in the device profile (``configs/devices/cpu.yaml`` for this machine).

Usage (one command; about 2 minutes on 2 cores):
``.venv/bin/python benchmarks/memory_peak.py [--steps 3] [--mode replay|interpret]
[--models big-fc gpt hf-llama] [--json out/memory_peak.json]`` (``--calibrate`` for the profile constant).
The load average before and after is printed with the figures (RSS is not affected by load, but
other processes' memory is not in it either).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

JOBS = {
    "big-fc": {"model": {"name": "mlp", "kwargs": {"in_features": 1024, "hidden": [4096, 4096],
                                                   "num_classes": 1024},
                         "input_shape": [1024], "num_classes": 1024},
               "training": {"global_batch_size": 16, "optimizer": "adamw", "learning_rate": 0.001}},
    "gpt": {"model": {"name": "gpt", "kwargs": {"seq_len": 128}},
            "training": {"global_batch_size": 8, "optimizer": "adamw", "learning_rate": 0.001}},
    "hf-llama": {"job_file": "configs/jobs/hf-llama.yaml"},
}
"""Model name -> its job (model and training sections), or ``job_file``: an example job whose model
and training sections are used (the tiny HuggingFace Llama: transformers' own code, AdamW)."""


def _job_body(body: dict) -> dict:
    """The model and training sections of a :data:`JOBS` entry (read from its ``job_file`` if any)."""
    if "job_file" not in body:
        return body
    import yaml

    job = yaml.safe_load((Path(__file__).resolve().parent.parent / body["job_file"]).read_text())
    return {"model": job["model"], "training": job["training"]}


def _run(spec, plan: dict, nproc: int, steps: int, out: Path, name: str, mode: str = "replay",
         env: dict | None = None) -> dict:
    """Metrics of ``plan`` trained ``steps`` steps on ``nproc`` processes (a launch of its own, the
    workers' environment plus ``env``)."""
    from tensoropt.launch import LaunchOptions, launch_workers

    metrics = out / f"{name}-{plan['id']}.json"
    config = {"steps": steps, "executor": {"mode": mode},
              "runs": [{"spec": spec.to_json(), "plan": plan, "metrics": str(metrics)}]}
    rc = launch_workers(config, LaunchOptions(nproc, timeout_s=600), env)
    if rc != 0:
        raise SystemExit(f"{name} {plan['id']} on {nproc} processes failed (exit {rc})")
    return json.loads(metrics.read_text())


def calibrate(steps: int) -> dict[str, int]:
    """``runtime_overhead_bytes`` and ``bytes_per_program_node`` as ``tensoropt calibrate --memory``
    measures them."""
    from tensoropt.commands.calibrate import runtime_memory

    constants, why = runtime_memory(steps)
    print(why)
    return constants


def measure(steps: int, mode: str = "replay", models: tuple[str, ...] = tuple(JOBS)) -> list[dict]:
    """One row per (model, plan) run: predicted, accounted and peak bytes per process."""
    from tensoropt.config import Job
    from tensoropt.executor.job.spec import TrainSpec
    from tensoropt.planner import plan_job
    from tensoropt.plans import plan_file_text

    rows = []
    with tempfile.TemporaryDirectory(prefix="memory-peak-") as tmp:
        for name in models:
            body = JOBS[name]
            job = Job.from_dict({**_job_body(body), "cluster": "cpu-local", "devices": [1, 2]})
            frontier_json = plan_job(job).to_json()
            spec = TrainSpec.from_job(job)
            plans = {f["devices"]: f["plans"] for f in frontier_json["frontiers"]}
            picks = [(1, "single", plans[1][0]["id"]), (2, "fastest", plans[2][0]["id"]),
                     (2, "leanest", min(plans[2], key=lambda p: p["memory_bytes"])["id"])]
            single_peak = None
            for nproc, role, plan_id in picks:
                plan = json.loads(plan_file_text(frontier_json, plan_id))
                m = _run(spec, plan, nproc, steps, Path(tmp), name, mode)
                peak, predicted = m["measured"]["peak_bytes"], m["predicted"]["memory_bytes"]
                predicted_peak = m["predicted"].get("peak_bytes") or predicted
                single_peak = single_peak or peak
                rows.append({"model": name, "processes": nproc, "plan": f"{plan_id} ({role})",
                             "predicted_bytes": predicted, "memory_bytes": m["measured"]["memory_bytes"],
                             "peak_bytes": peak, "predicted_peak_bytes": predicted_peak,
                             "peak_error": (predicted_peak - peak) / peak,
                             "peak_vs_single": peak / single_peak,
                             "traced_nodes": m.get("executor", {}).get("traced_nodes", 0),
                             "tensor_peak_bytes": m["measured"].get("peak_tensor_bytes", 0),
                             "predicted_tensor_peak_bytes": m["predicted"].get("peak_tensor_bytes", 0)})
    return rows


def _table(rows: list[dict]) -> str:
    mib = 2**20
    lines = ["| model | processes | plan | predicted MiB | memory MiB | peak MiB | predicted peak MiB "
             "| error | peak / 1-process | tensor peak MiB | predicted tensor peak MiB | error |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['processes']} | {r['plan']} | {r['predicted_bytes'] / mib:.1f} | "
                     f"{r['memory_bytes'] / mib:.1f} | {r['peak_bytes'] / mib:.1f} | "
                     f"{r['predicted_peak_bytes'] / mib:.1f} | {r['peak_error']:+.1%} | "
                     f"{r['peak_vs_single']:.2f} | {r['tensor_peak_bytes'] / mib:.1f} | "
                     f"{r['predicted_tensor_peak_bytes'] / mib:.1f} | "
                     f"{_error(r['predicted_tensor_peak_bytes'], r['tensor_peak_bytes'])} |")
    return "\n".join(lines)


def _error(predicted: float, measured: float) -> str:
    return f"{(predicted - measured) / measured:+.1%}" if measured else "n/a"


def report(table: str, rows: list[dict], load_before: tuple, json_path: Path | None) -> None:
    """Print ``table`` with the load average before and now; write the rows as JSON if asked."""
    load_after = os.getloadavg()
    print(table)
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps({"rows": rows, "load_before": load_before, "load_after": load_after},
                                        indent=2))


def main(argv: list[str] | None = None) -> int:
    """Run the measurement, print the table, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--mode", choices=("replay", "interpret"), default="replay",
                        help="the executor's runtime (replay: the default)")
    parser.add_argument("--models", nargs="+", choices=tuple(JOBS), default=tuple(JOBS))
    parser.add_argument("--calibrate", action="store_true",
                        help="measure the device profile's runtime_overhead_bytes and bytes_per_program_node "
                        "instead")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    if args.calibrate:
        for key, value in calibrate(args.steps).items():
            print(f"{key}: {value}")
        return 0
    rows = measure(args.steps, args.mode, tuple(args.models))
    report(_table(rows), rows, load_before, args.json)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
