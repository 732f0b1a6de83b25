"""Scenarios of tensoropt.parallelize run under torchrun by tests/parallel/test_api.py.

``python api_worker.py CONFIG.json``: ``{"out": dir, "gpt2": plan path, "batch_plan": plan path,
"one_device": plan path, "llama": plan path, "pretrained": dir, ...}``; each scenario writes
``out/<scenario>.pt`` from rank 0 (errors are caught on every rank, so the ranks stay in step).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loop_reference import build_model, make_batch, make_optimizer  # noqa: E402

import tensoropt  # noqa: E402


def _full(state: dict) -> dict:
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in state.items()}


def _error(fn) -> str | None:
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - the message is what the test reads
        return f"{type(err).__name__}: {err}"
    return None


def errors(cfg: dict) -> dict:
    """Each bad input's error message (None where nothing was raised)."""
    case = cfg["case"]
    out = {}
    model = build_model("gpt2", case["config"])
    out["world_size"] = _error(lambda: tensoropt.parallelize(build_model("gpt2", case["config"]),
                                                             cfg["one_device"]))
    llama = build_model("llama", cfg["llama_config"])
    out["graph"] = _error(lambda: tensoropt.parallelize(llama, cfg["gpt2"]))
    early = torch.optim.AdamW(model.parameters(), lr=1e-3)  # built before parallelize: the originals
    pm = tensoropt.parallelize(model, cfg["gpt2"])
    batch = make_batch(case, 0)
    out["missing_input"] = _error(lambda: pm.train_step({"input_ids": batch["input_ids"]}))
    short = {"input_ids": batch["input_ids"], "labels": batch["labels"][:3]}
    out["rows"] = _error(lambda: pm.train_step(short))
    out["seq"] = _error(lambda: pm.train_step({k: v[:, :8] for k, v in batch.items()}))
    pm.train_step(batch)
    before = _full(pm.state_dict())
    out["early_optimizer"] = _error(early.step)
    stray = torch.nn.Parameter(torch.zeros(3))
    mixed = torch.optim.SGD([*pm.parameters(), stray], lr=0.1)
    out["mixed_optimizer"] = _error(mixed.step)
    out["unchanged"] = all(torch.equal(before[k], v) for k, v in _full(pm.state_dict()).items())
    blocker = Path(cfg["out"]) / "a-file"
    if dist.get_rank() == 0:
        blocker.write_text("not a directory")
    dist.barrier()
    out["unwritable"] = _error(lambda: tensoropt.save_model(pm, blocker / "model"))
    out["left_behind"] = sorted(p.name for p in Path(cfg["out"]).iterdir())
    return out


class CountCollectives(TorchDispatchMode):
    """Counts the collectives dispatched (functional ones of the replayed program and eager c10d ones)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if (name.startswith("_c10d_functional.") and "wait_tensor" not in name) or name.startswith("c10d."):
            self.count += 1
        return func(*args, **(kwargs or {}))


def no_sync(cfg: dict) -> dict:
    """Collectives and gradient synchronisations of 4 micro-batches, with and without no_sync."""
    case = cfg["case"]
    pm = tensoropt.parallelize(build_model("gpt2", case["config"]), cfg["batch_plan"])
    runtime = pm.tensoropt_runtime
    batch = make_batch(case, 0)  # the plan's batch (4 rows): each micro-batch is one of 4 such
    for defers in ((True, False), (False,)):  # trace every program first: tracing runs collectives too
        for defer in defers:
            with pm.no_sync() if defer else contextlib.nullcontext():
                pm.train_step(batch)
        pm.zero_grad(set_to_none=True)
    out = {}
    for label, deferred in (("no_sync", True), ("sync", False)):
        syncs = runtime.grad_syncs
        with CountCollectives() as counter:
            for i in range(4):
                with pm.no_sync() if deferred and i < 3 else contextlib.nullcontext():
                    pm.train_step(batch, loss_scale=0.25)
        out[label] = {"collectives": counter.count, "grad_syncs": runtime.grad_syncs - syncs,
                      "grads": _full({n: p.grad for n, p in pm.named_parameters()})}
        pm.zero_grad(set_to_none=True)
    for label, deferred in (("one_no_sync", True), ("one_sync", False)):
        with CountCollectives() as counter, pm.no_sync() if deferred else contextlib.nullcontext():
            pm.train_step(batch)
        out[label] = counter.count
        pm.zero_grad(set_to_none=True)
    return out


def meta_init(cfg: dict) -> dict:
    """A model built on meta, parallelized: its weights as `tensoropt run` makes them."""
    from tensoropt.models import hf

    with torch.device("meta"):
        model = hf.gpt2(**cfg["case"]["config"])
    pm = tensoropt.parallelize(model, cfg["gpt2"])
    return {"state": _full(pm.state_dict())}


def finetune(cfg: dict) -> dict:
    """from_pretrained -> parallelize -> 3 steps of the user loop -> save_model."""
    from transformers import AutoModelForCausalLM

    case = cfg["case"]
    model = AutoModelForCausalLM.from_pretrained(cfg["pretrained"])
    pm = tensoropt.parallelize(model, cfg["gpt2"])
    opt, sched = make_optimizer(pm, 3)
    losses = []
    for step in range(3):
        losses.append(float(pm.train_step(make_batch(case, step))))
        pm.clip_grad_norm_(case["max_norm"])
        opt.step()
        sched.step()
        opt.zero_grad()
    tensoropt.save_model(pm, Path(cfg["out"]) / "finetuned")
    return {"losses": losses, "state": _full(pm.state_dict()), "class": type(pm).__name__,
            "is_parallel": isinstance(pm, tensoropt.ParallelModel)}


SCENARIOS = {"errors": errors, "no_sync": no_sync, "meta_init": meta_init, "finetune": finetune}


def main() -> None:
    tensoropt.init_distributed()
    cfg = json.loads(Path(sys.argv[1]).read_text())
    try:
        for name in cfg["scenarios"]:
            result = SCENARIOS[name](cfg)
            if dist.get_rank() == 0:
                torch.save(result, os.path.join(cfg["out"], f"{name}.pt"))
            dist.barrier()
    finally:
        from tensoropt.executor.state.worker import end_process_group

        end_process_group()


if __name__ == "__main__":
    main()
