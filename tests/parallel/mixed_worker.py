"""Run by tests/parallel/test_mixed_api.py under torchrun: one bf16-mixed plan trained 3 steps by
``tensoropt run``'s loop (:class:`~tensoropt.training.trainer.Trainer`) and 3 steps by a user loop
over ``tensoropt.parallelize`` (a meta model, a stock AdamW, the global batches); rank 0 writes both.

``python mixed_worker.py PLAN.json OUT.pt``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import tensoropt

STEPS = 3


def _full(tensors: dict) -> dict:
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in tensors.items()}


def main() -> None:
    tensoropt.init_distributed()
    doc, out = json.loads(Path(sys.argv[1]).read_text()), sys.argv[2]
    try:
        from tensoropt.executor.job.plan import ExecPlan
        from tensoropt.executor.job.spec import TrainSpec
        from tensoropt.models.gpt import GPT
        from tensoropt.training.trainer import Trainer

        spec = TrainSpec.from_job(doc["job"])
        trainer = Trainer(spec, ExecPlan.from_json(doc))
        run = [s["loss"] for s in trainer.train(STEPS).steps]
        run_params = trainer.full_params()
        with torch.device("meta"):
            model = GPT(**doc["job"]["model"]["kwargs"])
        pm = tensoropt.parallelize(model, doc)
        initial = _full(dict(pm.named_parameters()))
        opt = torch.optim.AdamW(pm.parameters(), lr=spec.lr)
        source = spec.batch_source()
        whole = [tuple((0, n) for n in (spec.global_batch_size, *s.shape)) for s in spec.inputs]
        api = []
        for step in range(STEPS):
            api.append(float(pm.train_step(dict(zip(pm.input_names, source.local(step, whole))))))
            opt.step()
            opt.zero_grad()
        dtypes = sorted({str(p.dtype) for p in pm.parameters()})
        api_params = _full(dict(pm.named_parameters()))
        if dist.get_rank() == 0:
            torch.save({"run": run, "api": api, "run_params": run_params, "api_params": api_params,
                        "dtypes": dtypes, "initial": initial}, out)
        dist.barrier()
    finally:
        from tensoropt.executor.state.worker import end_process_group

        end_process_group()


if __name__ == "__main__":
    main()
