"""The executor against DistributedDataParallel, and measured against predicted, at 2 processes.

(a) our data-parallel plan vs DDP on the same model: step-time ratio (target <= 1.15);
(b) a model with large fully-connected layers, where data parallelism's gradient all-reduce
    dominates: the frontier's fastest plan vs DDP (target speed-up >= 1.3);
(c) measured vs predicted step time and memory for every plan run (median relative error;
    targets 10 % for time with the profiled estimator, 2 % for memory).

Usage: ``.venv/bin/python benchmarks/executor_vs_ddp.py [--steps 10] [--compute profiled]
[--json results.json]``. Every model is built with the same seed and sees the same global
batches in both systems.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

NPROC = 2
JOBS = {
    "mlp": {"model": {"name": "mlp", "kwargs": {"in_features": 256, "hidden": [1024, 1024],
                                                "num_classes": 16},
                      "input_shape": [256], "num_classes": 16},
            "training": {"global_batch_size": 64, "optimizer": "sgd", "learning_rate": 0.01}},
    "big-fc": {"model": {"name": "mlp", "kwargs": {"in_features": 1024, "hidden": [4096, 4096],
                                                   "num_classes": 1024},
                         "input_shape": [1024], "num_classes": 1024},
               "training": {"global_batch_size": 16, "optimizer": "sgd", "learning_rate": 0.01}},
}
"""(a) runs on ``mlp``, (b) on ``big-fc`` (33.6M parameters, batch 16); (c) on every plan of both."""


def _job(name: str, compute: str):
    from tensoropt.config import Job

    return Job.from_dict({**JOBS[name], "cluster": "cpu-local", "devices": [NPROC],
                          "planner": {"compute": compute}})


def plan_model(name: str, compute: str) -> tuple[list[dict], dict]:
    """(frontier plan.json documents, the data-parallel plan.json) with their predictions."""
    from tensoropt.cost_graph import cost_graph
    from tensoropt.planner import build_job_model, capture_job, load_job_cluster, plan_devices, resolve_job
    from tensoropt.plans import FrontierFile, plan_file_text

    job = _job(name, compute)
    cluster = load_job_cluster(job)
    model, mspec = build_job_model(job, "meta")
    job = resolve_job(job, mspec, cluster)
    graph = capture_job(job, (model, mspec))
    frontier = plan_devices(graph, job, cluster, NPROC)
    ff = FrontierFile(job=job.to_dict(), frontiers=[frontier]).to_json()
    plans = [json.loads(plan_file_text(ff, p.id)) for p in frontier.plans]
    G = cost_graph(graph, cluster, NPROC, batch_size=job.training.global_batch_size,
                   optimizer=job.training.optimizer, compute_mode=compute)
    choice = {}
    for n in G.nodes:
        labels = G.nodes[n]["configs"]
        dp_label = f"batch={NPROC}"
        choice[n] = labels.index(dp_label) if dp_label in labels else labels.index("replicate")
    total = sum(G.nodes[n]["cost"][c] for n, c in choice.items())
    total = total + sum(G.edges[u, v]["cost"][choice[u], choice[v]] for u, v in G.edges)
    dp = {"id": "data-parallel", "devices": NPROC, "mesh": G.graph["mesh"].to_json(),
          "time_s": float(total[0]), "memory_bytes": float(total[1]),
          "placements": {n: G.nodes[n]["configurations"][c].to_json() for n, c in choice.items()}}
    return plans, dp


def run_executor(runs: list[tuple[str, dict]], steps: int, out: Path) -> dict[str, dict]:
    """Metrics of every (model, plan) trained by the executor in one launch."""
    from tensoropt.executor.spec import TrainSpec
    from tensoropt.launch import LaunchOptions, launch_workers

    config = {"steps": steps, "runs": []}
    for name, plan in runs:
        spec = TrainSpec.from_job(_job(name, "roofline"), steps=steps)
        config["runs"].append({"spec": spec.to_json(), "plan": plan,
                               "metrics": str(out / f"{name}-{plan['id']}.json")})
    rc = launch_workers(config, LaunchOptions(NPROC, timeout_s=1800))
    if rc != 0:
        raise SystemExit(f"executor workers failed (exit {rc})")
    return {f"{n}/{p['id']}": json.loads((out / f"{n}-{p['id']}.json").read_text()) for n, p in runs}


def run_ddp(names: list[str], steps: int, out: Path) -> dict[str, float]:
    """Median step time of DistributedDataParallel on each model (same seed, same batches)."""
    result = out / "ddp.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(NPROC),
           __file__, "--ddp-worker", json.dumps({"names": names, "steps": steps, "out": str(result)})]
    subprocess.run(cmd, check=True, timeout=1800)
    return json.loads(result.read_text())


def ddp_worker(options: dict) -> None:
    """torchrun entry: train each model with DDP, rank 0 writes median step times."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from tensoropt.executor.spec import TrainSpec
    from tensoropt.executor.trainer import Trainer  # noqa: F401 (same import cost as the executor)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    times = {}
    for name in options["names"]:
        spec = TrainSpec.from_job(_job(name, "roofline"), steps=options["steps"])
        model = DistributedDataParallel(spec.build_model())
        opt = spec.make_optimizer(list(model.parameters()))
        from tensoropt.executor.data import synthetic_batch

        step_times = []
        for step in range(spec.steps):
            batch = synthetic_batch(list(spec.inputs), spec.global_batch_size, spec.seed, step)
            local = [t.chunk(world)[rank] for t in batch]
            start = time.perf_counter()
            loss = model(*local)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step_times.append(time.perf_counter() - start)
        times[name] = statistics.median(step_times[1:] if len(step_times) > 2 else step_times)
    if rank == 0:
        Path(options["out"]).write_text(json.dumps(times))
    dist.destroy_process_group()


def _rel(measured: float, predicted: float) -> float:
    return abs(measured - predicted) / predicted


def main(argv: list[str] | None = None) -> int:
    """Run (a), (b), (c) and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--compute", choices=("roofline", "profiled"), default="profiled")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    runs = []
    for name in JOBS:
        plans, dp = plan_model(name, args.compute)
        runs += [(name, p) for p in plans] + [(name, dp)]
        print(f"planned {name}: {len(plans)} frontier plans ({time.perf_counter() - start:.0f} s)",
              flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        measured = run_executor(runs, args.steps, Path(tmp))
        ddp = run_ddp(list(JOBS), args.steps, Path(tmp))
    print(f"\n{'model/plan':28} {'pred ms':>9} {'meas ms':>9} {'err':>6} {'pred MiB':>9} {'meas MiB':>9} "
          f"{'err':>6}")
    time_err, mem_err = [], []
    for key, m in measured.items():
        p, q = m["predicted"], m["measured"]
        te, me = _rel(q["time_s"], p["time_s"]), _rel(q["memory_bytes"], p["memory_bytes"])
        time_err.append(te)
        mem_err.append(me)
        print(f"{key:28} {p['time_s'] * 1e3:9.2f} {q['time_s'] * 1e3:9.2f} {te:6.0%} "
              f"{p['memory_bytes'] / 2**20:9.2f} {q['memory_bytes'] / 2**20:9.2f} {me:6.1%}")
    dp_ratio = measured["mlp/data-parallel"]["measured"]["time_s"] / ddp["mlp"]
    fastest = min((m for k, m in measured.items() if k.startswith("big-fc/")),
                  key=lambda m: m["measured"]["time_s"])
    frontier_fastest = measured["big-fc/d2-p0"]
    figures = {
        "a_dp_over_ddp_time_ratio": dp_ratio,
        "a_ddp_ms": ddp["mlp"] * 1e3,
        "a_ours_dp_ms": measured["mlp/data-parallel"]["measured"]["time_s"] * 1e3,
        "b_ddp_ms": ddp["big-fc"] * 1e3,
        "b_predicted_fastest_plan": "d2-p0",
        "b_predicted_fastest_ms": frontier_fastest["measured"]["time_s"] * 1e3,
        "b_speedup_predicted_fastest_vs_ddp": ddp["big-fc"] / frontier_fastest["measured"]["time_s"],
        "b_measured_fastest_plan": fastest["plan_id"],
        "b_speedup_measured_fastest_vs_ddp": ddp["big-fc"] / fastest["measured"]["time_s"],
        "c_median_time_error": statistics.median(time_err),
        "c_median_memory_error": statistics.median(mem_err),
        "plans_run": len(measured),
        "compute_estimator": args.compute,
        "steps": args.steps,
        "wall_s": time.perf_counter() - start,
    }
    print(f"\n(a) mlp, data parallel: ours {figures['a_ours_dp_ms']:.2f} ms vs DDP "
          f"{figures['a_ddp_ms']:.2f} ms: ratio {dp_ratio:.2f} (target <= 1.15)")
    print(f"(b) big-fc: DDP {figures['b_ddp_ms']:.2f} ms; frontier's fastest plan d2-p0 "
          f"{figures['b_predicted_fastest_ms']:.2f} ms: speed-up "
          f"{figures['b_speedup_predicted_fastest_vs_ddp']:.2f}x (target >= 1.3); fastest measured "
          f"{fastest['plan_id']}: {figures['b_speedup_measured_fastest_vs_ddp']:.2f}x")
    print(f"(c) {len(measured)} plans: median |measured - predicted| / predicted: time "
          f"{figures['c_median_time_error']:.0%} (target 10%), memory "
          f"{figures['c_median_memory_error']:.1%} (target 2%)")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--ddp-worker":
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        ddp_worker(json.loads(sys.argv[2]))
        sys.exit(0)
    sys.exit(main())
