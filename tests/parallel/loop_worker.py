"""A user's training loop over tensoropt.parallelize, run under torchrun by tests/parallel.

``python loop_worker.py CASES.json``: each case ``{"name", "model": "gpt2" | "llama", "config": {...},
"plan": path, "out": path, "steps", "max_norm", "micro": n, "no_sync": bool}``. Every rank builds the
same HF model from its config with real weights (seeded), parallelizes it, and trains with AdamW (two
param groups), a warmup + cosine LambdaLR, micro-batches and clipping; rank 0 writes the losses, the
gradient norms and the final full state dict to ``out`` (torch.save).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loop_reference import build_model, make_batch, make_optimizer  # noqa: E402

import tensoropt  # noqa: E402


def run_case(case: dict) -> None:
    model = build_model(case["model"], case["config"], case.get("seed", 0))
    pm = tensoropt.parallelize(model, case["plan"], mode=case.get("mode", "replay"))
    opt, sched = make_optimizer(pm, case["steps"])
    losses, norms = [], []
    for step in range(case["steps"]):
        batch = make_batch(case, step)
        mbs = tensoropt.micro_batches(batch, case["micro"])
        total = 0.0
        for i, mb in enumerate(mbs):
            defer = case.get("no_sync", True) and i < len(mbs) - 1
            with pm.no_sync() if defer else contextlib.nullcontext():
                total += float(pm.train_step(mb, loss_scale=1 / len(mbs))) / len(mbs)
        norms.append(float(pm.clip_grad_norm_(case["max_norm"])))
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(total)
    eval_loss = float(pm.eval_step(make_batch(case, case["steps"])))
    moments = [s["exp_avg"] for s in opt.state.values()]  # AdamW's first moments: sharded with the plan?
    state_numel = [sum(m.to_local().numel() for m in moments), sum(m.numel() for m in moments)]
    state = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
             for k, v in pm.state_dict().items()}
    if case.get("save"):
        tensoropt.save_model(pm, case["save"])
    if dist.get_rank() == 0:
        torch.save({"losses": losses, "norms": norms, "eval": eval_loss, "state": state,
                    "state_numel": state_numel}, case["out"])


def main() -> None:
    tensoropt.init_distributed()
    try:
        for case in json.loads(Path(sys.argv[1]).read_text()):
            run_case(case)
            dist.barrier()
    finally:
        from tensoropt.executor.state.worker import end_process_group

        end_process_group()


if __name__ == "__main__":
    main()
