"""Measured on this machine: FT's fastest plan against data parallelism, trained by the executor.

Plans an MLP whose fully-connected weights dwarf its activations (1024 -> 4096 -> 4096 -> 1000,
25M parameters, 64 samples per step) for 2 processes of the ``cpu-local`` profile (gloo over
loopback), writes plan.json for FT's fastest plan and for the best data-parallel plan (the same
cost tables restricted to batch splits, see ``reproduce_baselines``), trains each with
``tensoropt run --nproc 2`` and prints predicted vs measured step time and memory per process.

    .venv/bin/python benchmarks/reproduce_measured.py --out out/reproduce_measured --steps 6

Takes about a minute on an idle 2-core machine (two short torchrun launches).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reproduce_baselines import data_parallel_space, solve_in_space  # noqa: E402

JOB = """\
model:
  name: mlp
  kwargs: {{in_features: 1024, hidden: [4096, 4096], num_classes: 1000}}
  task: classification
  input_shape: [1024]
  num_classes: 1000
training:
  global_batch_size: 64
  optimizer: momentum
  dtype: float32
  seed: 0
  steps: {steps}
cluster: cpu-local
devices: [2]
memory_budget: 4GiB
select: fastest
"""


def write_plans(job_path: Path, out: Path) -> dict[str, Path]:
    """Plan the job; write plan.json files for FT's fastest plan and the data-parallel plan."""
    from tensoropt.config import load_job
    from tensoropt.cost_graph import cost_graph
    from tensoropt.planner import build_job_model, capture_job, load_job_cluster, plan_job, resolve_job
    from tensoropt.plans import Plan, plan_file_text
    from tensoropt.summary import plan_summary

    job = load_job(job_path)
    frontier_file = plan_job(job)
    data = frontier_file.to_json()
    frontier = data["frontiers"][0]
    devices = frontier["devices"]
    cluster = load_job_cluster(job)
    model, spec = build_job_model(job, "meta")
    resolved = resolve_job(job, spec, cluster)
    graph = capture_job(resolved, (model, spec))
    G = cost_graph(graph, cluster, devices, batch_size=resolved.training.global_batch_size,
                   optimizer=resolved.training.optimizer)
    dp = solve_in_space(G, data_parallel_space(G))[0]
    ops = {n: G.nodes[n]["configs"][c] for n, c in dp.assignment.items()}
    plan = Plan(id=f"d{devices}-dp", time_s=float(dp.cost[0]), memory_bytes=float(round(dp.cost[1])), ops=ops,
                summary=plan_summary(graph, ops))
    frontier["plans"].append(plan.to_json())
    for n, c in dp.assignment.items():
        frontier["configurations"].setdefault(n, {}).setdefault(
            ops[n], G.nodes[n]["configurations"][c].to_json()
        )
    paths = {}
    for name, plan_id in (("ft", frontier["plans"][0]["id"]), ("dp", plan.id)):
        paths[name] = out / f"plan_{name}.json"
        paths[name].write_text(plan_file_text(data, plan_id))
    return paths


def run_plan(job_path: Path, plan_path: Path, metrics: Path, steps: int, timeout_s: float) -> dict:
    """Train one plan with ``tensoropt run`` on 2 processes; return its metrics JSON."""
    cmd = [sys.executable, "-m", "tensoropt.cli", "run", str(job_path), "--plan", str(plan_path),
           "--nproc", "2", "--steps", str(steps), "--metrics", str(metrics), "--timeout-s", str(timeout_s)]
    subprocess.run(cmd, check=True, timeout=timeout_s + 60)
    return json.loads(metrics.read_text())


def main(argv: list[str] | None = None) -> int:
    """Plan, run both plans, print the comparison (``--help`` for options)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("out/reproduce_measured"))
    ap.add_argument("--steps", type=int, default=6, help="training steps per plan (the first is warm-up)")
    ap.add_argument("--timeout-s", type=float, default=300.0)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    job_path = args.out / "job.yaml"
    job_path.write_text(JOB.format(steps=args.steps))
    plans = write_plans(job_path, args.out)
    results = {}
    for name, path in plans.items():
        metrics = args.out / f"metrics_{name}.json"
        results[name] = run_plan(job_path, path, metrics, args.steps, args.timeout_s)
    print("\n| plan | split | predicted ms | measured ms | predicted MiB | measured MiB |")
    print("|---|---|---|---|---|---|")
    for name, m in results.items():
        summary = json.loads(plans[name].read_text()).get("summary", "")
        p, r = m["predicted"], m["measured"]
        print(f"| {name} | {summary} | {p['time_s'] * 1e3:.1f} | {r['time_s'] * 1e3:.1f} | "
              f"{p['memory_bytes'] / 2**20:.1f} | {r['memory_bytes'] / 2**20:.1f} |")
    ft_m, dp_m = results["ft"], results["dp"]
    predicted = dp_m["predicted"]["time_s"] / ft_m["predicted"]["time_s"]
    measured = dp_m["measured"]["time_s"] / ft_m["measured"]["time_s"]
    saved = 1 - ft_m["measured"]["memory_bytes"] / dp_m["measured"]["memory_bytes"]
    print(f"\nFT vs data parallel: predicted {predicted:.2f}x, measured {measured:.2f}x faster; "
          f"memory per process measured {saved:.0%} less")
    print(f"load average while measuring (1, 5, 15 min): {os.getloadavg()}")
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
