"""torchrun worker of test_batch_norm.py: the toy CNN's data-parallel plan with ``training.batch_norm``
``local`` against DistributedDataParallel on the same module and rows, and the collectives of both modes.

Rank 0 writes ``{"local": [...], "ddp": [...], "param_diff": {...}, "buffer_diff": {...},
"collectives": {"local": n, "synchronized": m}}`` to the path given as the first argument.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from hand_plans import SPECS, cnn_plans
from torch.nn.parallel import DistributedDataParallel

from tensoropt.executor.job.data import synthetic_batch
from tensoropt.executor.job.plan import ExecPlan
from tensoropt.executor.state.worker import end_process_group, init_process_group
from tensoropt.training.trainer import Trainer

STEPS = 3


def ddp_run(spec, rank: int, world: int) -> tuple[list[float], torch.nn.Module]:
    """Plain DDP (per-rank batch norm, rank 0's buffers broadcast each forward): losses, module."""
    model = DistributedDataParallel(spec.build_model())
    opt = spec.make_optimizer(list(model.parameters()))
    losses = []
    for step in range(STEPS):
        x, y = synthetic_batch(list(spec.inputs), spec.global_batch_size, spec.seed, step)
        rows = spec.global_batch_size // world
        loss = model(x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows])
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(float(total) / world)
    return losses, model.module


def one_process_buffers(spec) -> dict[str, torch.Tensor]:
    """Running statistics of the plain module trained on the whole global batch (every rank alike)."""
    model = spec.build_model()
    opt = spec.make_optimizer(list(model.parameters()))
    for step in range(STEPS):
        loss = model(*synthetic_batch(list(spec.inputs), spec.global_batch_size, spec.seed, step))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return dict(model.named_buffers())


def buffer_errors(trainer, reference: dict[str, torch.Tensor]) -> dict[str, float]:
    """Largest difference of each of ``trainer``'s buffers (its whole value) from ``reference``'s."""
    def whole(t):
        return t.full_tensor() if hasattr(t, "full_tensor") else t
    return {k: float((whole(trainer.buffers[k]).float() - v.float()).abs().max())
            for k, v in reference.items()}


def main(out: str) -> None:
    init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    plan = ExecPlan.from_json(next(p for p in cnn_plans(world) if p["id"] == "cnn-dp"))
    local_spec = dataclasses.replace(SPECS["cnn"], batch_norm="local")
    local = Trainer(local_spec, plan)
    result = local.train(STEPS)
    params = local.full_params()
    synced = Trainer(SPECS["cnn"], plan)
    synced_result = synced.train(STEPS)
    channels = Trainer(SPECS["cnn"], ExecPlan.from_json(next(p for p in cnn_plans(world)
                                                             if "convout" in p["id"] or "out2" in p["id"])))
    channels.train(STEPS)
    reference_buffers = one_process_buffers(SPECS["cnn"])
    half = Trainer(dataclasses.replace(SPECS["cnn"], dtype="bfloat16", precision="bf16-mixed"), plan)
    half_losses = [s["loss"] for s in half.train(STEPS).steps]
    synced_buffers = {"dp": buffer_errors(synced, reference_buffers),
                      "channels": buffer_errors(channels, reference_buffers)}
    ddp_losses, module = ddp_run(local_spec, rank, world)
    reference = dict(module.named_parameters())
    mine = {k: v.to_local() if hasattr(v, "to_local") else v for k, v in local.buffers.items()}
    buffers = {k: float((mine[k].float() - b.float()).abs().max()) for k, b in module.named_buffers()}
    report = {
        "local": [s["loss"] for s in result.steps], "ddp": ddp_losses,
        "synchronized": [s["loss"] for s in synced_result.steps],
        "param_diff": {k: float((params[k] - reference[k]).abs().max()) for k in reference},
        "param_scale": {k: float(reference[k].abs().max()) for k in reference},
        "buffer_diff": buffers,
        "synchronized_buffer_diff": synced_buffers,
        "bf16_mixed": half_losses,
        "collectives": {"local": local.runtime_info()["collectives"],
                        "synchronized": synced.runtime_info()["collectives"]},
    }
    if rank == 0:
        Path(out).write_text(json.dumps(report))
    end_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
