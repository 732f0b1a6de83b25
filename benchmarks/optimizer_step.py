"""The optimizer's part of a training step, measured as a user's step runs it, and its profile fit.

The cpu profile prices a step's optimizer part as ``7 x local parameter bytes / optimizer_bandwidth_gbps
+ parameter tensors x optimizer_tensor_s`` (AdamW: :func:`estimators.compute.optimizer_time_s`). This
benchmark measures what that stands for in ``tensoropt run``'s loop
(:mod:`tensoropt.training.optimizer_clock`: the gradients handed to the parameters, ``optimizer.step()``
with tensoropt's hooks, ``zero_grad``; the main thread's CPU clock) over a range of tensor counts and
bytes, data parallel and model parallel, and fits the two constants to it
(:func:`estimators.compute.fit_optimizer_time`).

Models: the zoo MLP (``tensoropt.models.mlp:MLP``) at the widths and depths of :data:`SHAPES` (8 to 128
parameter tensors, 65 Ki to 9.0 Mi parameters), global batch 8, AdamW. Each is planned at 2 devices
with the roofline (the plans' price does not matter here): its data-parallel plan (every parameter
whole on each rank, the gradients in all-reduce buckets) and its frontier's leanest plan (weights
split: half the bytes, as many tensors). One torchrun launch of 2 gloo processes of one thread runs
every plan in interleaved rounds (rotated, reversed every other round), ``--steps`` steps a round.

Printed per plan (rank 0, medians over the rounds' steps, ms): the parts, their sum (``optimizer``),
the price with the profile as it is (``priced now``) and with the fit, the errors; then the fit and
the profile lines to paste. ``--json`` keeps the rows.

Usage (one command): ``.venv/bin/python benchmarks/optimizer_step.py [--shapes w64x64,w1024x4]
[--rounds 3] [--steps 6] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NPROC = 2
BATCH = 8
SHAPES = {"w64x64": (64, 64), "w64x16": (64, 16), "w128x32": (128, 32), "w256x16": (256, 16),
          "w512x8": (512, 8), "w1024x4": (1024, 4), "w768x16": (768, 16)}
"""name -> (width, linear layers): the zoo MLP of that width with ``layers - 1`` hidden layers, so
``2 x layers`` parameter tensors (weight and bias) of ``width x width`` and ``width`` elements."""


def models(shapes: list[str]) -> dict:
    """The benchmark's model table (``benchmarks/runtime.py`` ``spec_of``'s format) for ``shapes``.

    Example:
        >>> models(["w64x16"])["w64x16"][1]["hidden"][:2]
        [64, 64]
    """
    out = {}
    for name in shapes:
        width, layers = SHAPES[name]
        kwargs = {"in_features": width, "hidden": [width] * (layers - 1), "num_classes": width}
        out[name] = ("tensoropt.models.mlp:MLP", kwargs, [((width,), "float32", None), ((), "int64", width)],
                     BATCH)
    return out


def local_state(optimizer) -> tuple[int, int]:
    """(local parameter bytes, parameter tensors) an optimizer steps on this rank.

    Example:
        >>> import torch
        >>> local_state(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3, 4))]))
        (48, 1)
    """
    from tensoropt.executor.state.local_optim import _local

    params = [p for g in optimizer.param_groups for p in g["params"]]
    return sum(_local(p).numel() * _local(p).element_size() for p in params), len(params)


def worker(options: dict) -> None:
    """torchrun entry: every plan, interleaved rounds of clocked steps; rank 0 writes the parts."""
    import torch.distributed as dist
    from runtime import spec_of

    from tensoropt.executor.job.plan import ExecPlan
    from tensoropt.executor.state.worker import end_process_group, init_process_group
    from tensoropt.training.optimizer_clock import OptimizerClock
    from tensoropt.training.trainer import Trainer

    init_process_group()
    table = models(list(options["plans"]))
    systems, rows = [], {}
    for name, plans in options["plans"].items():
        spec = spec_of(name, options["steps"], table)
        for label, doc in plans.items():
            trainer = Trainer(spec, ExecPlan.from_json(doc), mode="replay")
            trainer.train(2, start_step=0)  # traces the program; the optimizer state is made
            nbytes, tensors = local_state(trainer.optimizer)
            key = f"{name}/{label}"
            rows[key] = {"param_bytes": nbytes, "tensors": tensors, "steps": []}
            systems.append((key, trainer))
    for r in range(options["rounds"]):
        order = systems[r % len(systems):] + systems[:r % len(systems)]
        for key, trainer in (order[::-1] if r % 2 else order):
            dist.barrier()
            with OptimizerClock(trainer) as clock:
                for i in range(options["steps"]):
                    trainer.step(100 + r * options["steps"] + i, measure_memory=False)
            rows[key]["steps"].extend(clock.steps)
    if dist.get_rank() == 0:
        Path(options["out"]).write_text(json.dumps(rows))
    systems.clear()
    dist.barrier()
    end_process_group()


def plan_all(shapes: list[str], cluster: str) -> dict:
    """``{shape: {"dp": plan doc, "lean": plan doc}}`` (the leanest plan left out where it is the
    data-parallel one), planned with the roofline at 2 devices."""
    from runtime import plan_model

    table = models(shapes)
    out = {}
    for name in shapes:
        got = plan_model(name, cluster, "roofline", margin=0.0, models=table)
        out[name] = {"dp": got["dp"]}
        if got["lean"]["placements"] != got["dp"]["placements"]:
            out[name]["lean"] = got["lean"]
    return out


def main(argv: list[str] | None = None) -> int:
    """Plan, run the launch, print the parts per plan and the fit."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--steps", type=int, default=6, help="clocked steps per plan per round")
    parser.add_argument("--cluster", default="cpu-local")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from worker_launch import launch_workers

    from estimators.compute import fit_optimizer_time, optimizer_time_s
    from estimators.profiles import load_cluster

    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = sorted(set(shapes) - set(SHAPES))
    if unknown:
        parser.error(f"--shapes: unknown {unknown}; choose from {', '.join(SHAPES)}")
    start = time.perf_counter()
    plans = plan_all(shapes, args.cluster)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        res = launch_workers(__file__, {"plans": plans, "rounds": args.rounds, "steps": args.steps},
                             Path(tmp), timeout_s=3600)
    load_after = os.getloadavg()
    device = load_cluster(args.cluster).device
    rows = []
    for key, row in res.items():
        med = {p: statistics.median(s[p] for s in row["steps"]) for p in row["steps"][0]}
        rows.append({"plan": key, "param_bytes": row["param_bytes"], "tensors": row["tensors"], **med,
                     "priced_now_s": optimizer_time_s(device, row["param_bytes"], row["tensors"], "adamw")})
    gbps, per_tensor = fit_optimizer_time([r["param_bytes"] for r in rows], [r["tensors"] for r in rows],
                                          [r["optimizer_s"] for r in rows])
    k_gbps, k_tensor = fit_optimizer_time([r["param_bytes"] for r in rows], [r["tensors"] for r in rows],
                                          [r["kernels_s"] for r in rows])
    print(f"\n{'plan':16} {'tensors':>7} {'MiB':>6} {'gradients':>9} {'step':>6} {'(kernels)':>9} "
          f"{'zero_grad':>9} {'optimizer':>9} {'priced now':>10} {'err':>7} {'fit':>6} {'err':>7}")
    for r in rows:
        fit_s = 7 * r["param_bytes"] / (gbps * 1e9) + r["tensors"] * per_tensor
        r["fit_s"] = fit_s
        ms = {k: r[k] * 1e3 for k in ("gradients_s", "step_s", "kernels_s", "zero_grad_s", "optimizer_s",
                                      "priced_now_s")}
        print(f"{r['plan']:16} {r['tensors']:7d} {r['param_bytes'] / 2**20:6.2f} {ms['gradients_s']:9.3f} "
              f"{ms['step_s']:6.3f} {ms['kernels_s']:9.3f} {ms['zero_grad_s']:9.3f} {ms['optimizer_s']:9.3f} "
              f"{ms['priced_now_s']:10.3f} {_pct(r['priced_now_s'], r['optimizer_s']):>7} {fit_s * 1e3:6.3f} "
              f"{_pct(fit_s, r['optimizer_s']):>7}")
    worst = max(abs(r["fit_s"] - r["optimizer_s"]) / r["optimizer_s"] for r in rows)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"\nfit of the whole part (gradients + step + zero_grad): {gbps:.1f} GB/s over 7 passes, "
          f"{per_tensor * 1e6:.2f} us a tensor (worst point {100 * worst:.1f} % off)")
    print(f"step_local alone (kernels): {k_gbps:.1f} GB/s, {k_tensor * 1e6:.2f} us a tensor")
    const_s, c_gbps, c_tensor = _fit_with_constant(rows)
    print(f"with a constant per step (diagnostic; the profile has no such term): {const_s * 1e3:.3f} ms + "
          f"{c_gbps:.1f} GB/s + {c_tensor * 1e6:.2f} us a tensor")
    print(f"profile lines ({stamp}):\noptimizer_bandwidth_gbps: {gbps:.1f}\n"
          f"optimizer_tensor_s: {per_tensor:.2e}")
    print(f"load average (1, 5, 15 min) before {' '.join(f'{x:.2f}' for x in load_before)}, after "
          f"{' '.join(f'{x:.2f}' for x in load_after)}; {args.rounds} rounds x {args.steps} steps; "
          f"{time.perf_counter() - start:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "fit": [gbps, per_tensor],
                                               "kernels_fit": [k_gbps, k_tensor], "load_before": load_before,
                                               "load_after": load_after}, indent=1))
    return 0


def _fit_with_constant(rows: list[dict]) -> tuple[float, float, float]:
    """Relative least squares ``time = constant + 7 bytes / bandwidth + tensors x per_tensor``:
    (constant_s, bandwidth_gbps, per_tensor_s), unconstrained (a diagnostic of the two-term fit)."""
    import numpy as np

    t = np.array([r["optimizer_s"] for r in rows])
    a = np.stack([np.ones_like(t), 7 * np.array([r["param_bytes"] for r in rows], float),
                  np.array([r["tensors"] for r in rows], float)], axis=1) / t[:, None]
    (const, inv_bw, per_tensor), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    return float(const), float(1 / inv_bw / 1e9) if inv_bw > 0 else float("inf"), float(per_tensor)


def _pct(predicted: float, measured: float) -> str:
    return f"{100 * (predicted - measured) / measured:+.1f}%" if measured else "-"


if __name__ == "__main__":
    from worker_launch import run_worker_if_asked

    run_worker_if_asked(worker)
    sys.exit(main())
