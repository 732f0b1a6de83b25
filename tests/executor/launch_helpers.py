"""Run executor workers from tests: one torchrun launch for many plans, outputs in a folder."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import torch

from tensoropt.executor.job.plan import ExecPlan
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.launch import LaunchOptions, launch_workers
from tensoropt.training.trainer import Trainer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ENV = {"PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)]), "TENSOROPT_COLLECTIVE_TIMEOUT_S": "60"}
"""The workers' environment: this folder (the probes' modules) and the checkout under test, ahead of
an editable install of another checkout (a git worktree's tests then run the worktree's code)."""
STEPS = 3


def run_plans(runs: list[tuple[str, TrainSpec, dict]], nproc: int, out: Path, timeout_s: float = 400,
              env: dict | None = None, steps: int = STEPS, **extra) -> tuple[int, float]:
    """Train every (name, spec, plan) for ``steps`` steps in one launch; returns (exit code, seconds)."""
    config = {"steps": steps, "runs": [
        {"spec": spec.to_json(), "plan": plan, "metrics": str(out / f"{name}-{plan['id']}.json"),
         "params_out": str(out / f"{name}-{plan['id']}.pt")} for name, spec, plan in runs], **extra}
    start = time.perf_counter()
    rc = launch_workers(config, LaunchOptions(nproc, timeout_s=timeout_s), env={**ENV, **(env or {})})
    return rc, time.perf_counter() - start


def outputs(out: Path, name: str, plan_id: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(metrics, final parameters) a run wrote."""
    metrics = json.loads((out / f"{name}-{plan_id}.json").read_text())
    return metrics, torch.load(out / f"{name}-{plan_id}.pt")


def single_process(spec: TrainSpec, steps: int = STEPS,
                   mode: str = "interpret") -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses and final parameters of the plain 1-process run (no mesh, no DTensor; eager PyTorch
    through the fx interpreter unless ``mode="replay"``)."""
    trainer = Trainer(spec, ExecPlan.from_json({"id": "single", "mesh": {"shape": [], "levels": []},
                                                "placements": {}}), mode=mode)
    result = trainer.train(steps)
    return [s["loss"] for s in result.steps], trainer.full_params()


def parity_errors(name: str, plan_id: str, out: Path, reference, loss_rtol: float = 1e-5,
                  param_rtol: float = 1e-5) -> list[str]:
    """What differs between a run's outputs and the 1-process reference (empty: parity holds)."""
    ref_losses, ref_params = reference
    try:
        metrics, params = outputs(out, name, plan_id)
    except FileNotFoundError:
        return [f"{name} {plan_id}: no outputs (the launch failed before or during this plan)"]
    errors = []
    losses = [s["loss"] for s in metrics["steps"]]
    if [s["step"] for s in metrics["steps"]] != list(range(len(ref_losses))):
        errors.append(f"{name} {plan_id}: steps {metrics['steps']}")
    for i, (a, b) in enumerate(zip(losses, ref_losses)):
        if abs(a - b) > loss_rtol * abs(b):
            errors.append(f"{name} {plan_id}: loss at step {i} is {a}, 1 process gives {b}")
    if set(params) != set(ref_params):
        errors.append(f"{name} {plan_id}: parameters {sorted(params)} != {sorted(ref_params)}")
    for key, ref in ref_params.items():
        if key in params:
            diff = float((params[key] - ref).abs().max())
            scale = float(ref.abs().max())
            if diff > param_rtol * scale:
                errors.append(f"{name} {plan_id}: parameter {key} differs by {diff:.3g} (scale {scale:.3g})")
    return errors


def run_and_compare(runs: list[tuple[str, TrainSpec, dict]], out: Path, env: dict, steps: int = STEPS,
                    timeout_s: float = 500) -> tuple[int, list[str]]:
    """Train every (name, spec, plan) on 2 processes in one launch; returns (exit code, what differs
    from each spec's 1-process run: :func:`parity_errors`)."""
    rc, _ = run_plans(runs, 2, out, timeout_s=timeout_s, env=env, steps=steps)
    errors = []
    for name, spec, plan in runs:
        errors += parity_errors(name, plan["id"], out, single_process(spec, steps))
    return rc, errors


def plan_doc(cg, job, plan_id: str, assignment: dict) -> tuple[dict, float]:
    """(plan.json dict, predicted memory bytes per device) of ``assignment`` (node -> configuration index)
    on cost graph ``cg`` of ``job``: the plans tests build by hand from a frontier's configurations."""
    confs = {n: cg.nodes[n]["configurations"][assignment[n]] for n in cg}
    doc = {"id": plan_id, "devices": cg.graph["mesh"].num_devices, "mesh": cg.graph["mesh"].to_json(),
           "job": job.to_dict(), "placements": {n: c.to_json() for n, c in confs.items()}}
    predicted = sum(float(cg.nodes[n]["cost"][assignment[n], 1]) for n in cg) + sum(
        float(cg.edges[u, v]["cost"][assignment[u], assignment[v], 1]) for u, v in cg.edges)
    return doc, predicted


@contextlib.contextmanager
def one_rank_mesh(folder: Path):
    """A 1-rank gloo process group in this process (its store in ``folder``) and its CPU mesh."""
    import torch.distributed as dist
    from torch.distributed.tensor import DeviceMesh

    from tensoropt.executor.state.worker import end_process_group

    dist.init_process_group("gloo", store=dist.FileStore(str(folder / "store"), 1), rank=0, world_size=1)
    try:
        yield DeviceMesh("cpu", [0])
    finally:
        end_process_group()
