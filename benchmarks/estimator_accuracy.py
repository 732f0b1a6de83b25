"""Estimator accuracy: predicted vs measured per-device memory (and step time) per plan.

For an MLP, a small CNN and a small transformer (tests/estimators/est_plans.py) on 2 processes,
the plans are three hand-written ones (data parallel, tensor parallel, a mix) plus the fastest,
the leanest and a middle plan of the exact frontier over the real configuration space. Each
plan's predicted memory (``tensoropt.cost_graph`` on ``cpu-local``) is compared with

* ``local``: one process running the plan's local-shard shapes (estimators.measure);
* ``executor``: the running DTensor executor at 2 processes (torchrun, gloo), which reports
  parameters + gradients + optimizer state + saved activations (unique storages) per rank, and
  its median step time.

Usage::

    .venv/bin/python benchmarks/estimator_accuracy.py [--nproc 2] [--no-executor] [--json OUT]

Prints one row per plan and the median and worst relative error of each measurement.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "estimators"))

import est_plans  # noqa: E402
import torch  # noqa: E402

import frontier  # noqa: E402
from estimators.breakdown import plan_breakdown  # noqa: E402
from estimators.measure import measure_plan_memory  # noqa: E402
from tensoropt.capture import capture  # noqa: E402
from tensoropt.cost_graph import cost_graph  # noqa: E402
from tensoropt.executor.job.data import InputSpec, synthetic_batch  # noqa: E402
from tensoropt.executor.job.spec import TrainSpec  # noqa: E402

MODELS = {  # name: (factory in est_plans, kwargs, inputs per sample, global batch, hand plans)
    "mlp": ("MLP", {}, (InputSpec((32,)), InputSpec((), "int64", 16)), 16, lambda g: est_plans.mlp_plans()),
    "cnn": ("CNN", {}, (InputSpec((3, 8, 8)), InputSpec((), "int64", 10)), 8, est_plans.cnn_plans),
    # causal attention without dropout (the executor's supported form; the fused CPU kernel)
    "transformer": (
        "TinyGPT",
        {"causal": True, "p_attn": 0.0},
        (InputSpec((8,), "int64", 64), InputSpec((8,), "int64", 64)),
        4,
        est_plans.gpt_plans,
    ),
}


def frontier_plans(cg, count: int) -> dict[str, dict]:
    """Fastest, leanest and evenly spaced plans of the exact frontier: name -> node -> Configuration."""
    points = frontier.solve(cg)
    picks = sorted({round(i * (len(points) - 1) / max(1, count - 1)) for i in range(count)})
    return {
        f"frontier-{i}/{len(points)}": {n: cg.nodes[n]["configurations"][points[i].assignment[n]] for n in cg}
        for i in picks
    }


def _err(pred: float, meas: float | None) -> float | None:
    return None if not meas else (pred - meas) / meas


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--no-executor", action="store_true", help="skip the distributed measurement")
    ap.add_argument("--frontier-plans", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--json", default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    rows = []
    for model, (factory, kwargs, inputs, batch, hand) in MODELS.items():
        spec = TrainSpec(f"est_plans:{factory}", inputs, batch, kwargs, optimizer="adamw", steps=args.steps)
        example = synthetic_batch(list(inputs), batch, 0, 0)
        torch.manual_seed(0)
        g = capture(spec.build_model(), example)
        cg = cost_graph(g, "cpu-local", args.nproc)
        mesh = cg.graph["mesh"]
        plans = dict(hand(g.nx)) if args.nproc == 2 else {}
        plans.update(frontier_plans(cg, args.frontier_plans))
        measured_exec = {}
        if not args.no_executor:
            measured_exec = est_plans.run_executor(spec, plans, mesh, args.nproc, args.steps)
        for name, plan in plans.items():
            confs = {n: [c] for n, c in plan.items()}
            b = plan_breakdown(
                cost_graph(g, "cpu-local", args.nproc, configurations=confs), {n: 0 for n in g.nx}
            )
            # the local-shard run executes aten batch_norm, the executor its synchronised decomposition
            native = cost_graph(g, "cpu-local", args.nproc, configurations=confs, batch_norm="native")
            b_native = plan_breakdown(native, {n: 0 for n in g.nx})
            try:
                local = measure_plan_memory(g, plan, mesh, example, "adamw")["total"]
            except Exception as e:  # noqa: BLE001 - reported, not hidden
                print(f"  {model}/{name}: local measurement failed: {e}", file=sys.stderr)
                local = None
            ex = measured_exec.get(name, {})
            rows.append(
                {
                    "model": model,
                    "plan": name,
                    "predicted_bytes": b["memory_bytes"],
                    "predicted_native_bytes": b_native["memory_bytes"],
                    "local_bytes": local,
                    "executor_bytes": ex.get("memory_bytes"),
                    "predicted_time_s": b["time_s"],
                    "executor_time_s": ex.get("time_s"),
                    "summary": "; ".join(sorted({f"{r['config']}" for r in b["layers"]})),
                }
            )
    print(
        f"\n{'model':<12}{'plan':<20}{'pred (aten)':>12}{'local B':>10}{'err':>7}{'predicted':>11}"
        f"{'executor B':>12}{'err':>7}{'pred ms':>9}{'exec ms':>9}"
    )
    for r in rows:
        el = _err(r["predicted_native_bytes"], r["local_bytes"])
        ee = _err(r["predicted_bytes"], r["executor_bytes"])
        local_err = "" if el is None else f"{el:.1%}"
        exec_err = "" if ee is None else f"{ee:.1%}"
        print(
            f"{r['model']:<12}{r['plan']:<20}{r['predicted_native_bytes']:>12.0f}"
            f"{r['local_bytes'] or 0:>10.0f}"
            f"{local_err:>7}{r['predicted_bytes']:>11.0f}{r['executor_bytes'] or 0:>12.0f}{exec_err:>7}"
            f"{r['predicted_time_s'] * 1e3:>9.2f}{(r['executor_time_s'] or 0) * 1e3:>9.2f}"
        )
    preds = {
        "local_bytes": "predicted_native_bytes",
        "executor_bytes": "predicted_bytes",
        "executor_time_s": "predicted_time_s",
    }
    for key, pred in preds.items():
        errs = [abs(_err(r[pred], r[key])) for r in rows if r[key]]
        if errs:
            print(
                f"{key:<16} vs predicted: {len(errs)} plans, median error {statistics.median(errs):.2%}, "
                f"worst {max(errs):.2%}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
