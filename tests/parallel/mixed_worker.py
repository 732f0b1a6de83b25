"""Run by tests/parallel/test_mixed_api.py under torchrun: one mixed-precision plan (bf16-mixed or
fp16-mixed, as its job says) trained 3 steps by ``tensoropt run``'s loop
(:class:`~tensoropt.training.trainer.Trainer`) and 3 steps by a user loop over
``tensoropt.parallelize`` (a meta model, a stock AdamW, the global batches); rank 0 writes both.

With ``overflow`` (fp16-mixed), each side first trains one step at a loss scale of 2**40, whose
scaled gradients overflow float16: that step is to be skipped (the parameters as they were, the
scale halved, one skip counted); the scale is then set to 2**8, at which no gradient overflows, for
the 3 steps. Rank 0 writes each side's parameters after that step and its scaler's state at the end.

``python mixed_worker.py PLAN.json OUT.pt [overflow]``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import tensoropt

STEPS = 3
OVERFLOW_SCALE = 2.0**40  # float16's largest value is 65504: every scaled gradient overflows
SCALE = 2.0**8  # no gradient of this model overflows at it (at the initial 2**16 some do)


def _moved(before: dict, after: dict) -> float:
    """The largest change of any parameter between two full copies."""
    return max(float((after[k] - v).abs().max()) for k, v in before.items())


def _full(tensors: dict) -> dict:
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in tensors.items()}


def _set_loss_scale(runtime, scale: float) -> None:
    """The parallel model's loss scale, as :meth:`Runtime.unscale` moves it (programs traced again)."""
    runtime.scaler.scale = scale
    for graph in runtime.graphs.values():
        graph.interpreter.loss_scale = scale
        if graph.program is not None:
            graph.program.programs.clear()


def _scaler_state(runtime) -> dict:
    return {"scale": runtime.scaler.scale, "skipped": runtime.scaler.skipped}


def main() -> None:
    tensoropt.init_distributed()
    doc, out = json.loads(Path(sys.argv[1]).read_text()), sys.argv[2]
    overflow = sys.argv[3:] == ["overflow"]
    result = {}
    try:
        from tensoropt.executor.job.plan import ExecPlan
        from tensoropt.executor.job.spec import TrainSpec
        from tensoropt.models.gpt import GPT
        from tensoropt.training.trainer import Trainer

        spec = TrainSpec.from_job(doc["job"])
        trainer = Trainer(spec, ExecPlan.from_json(doc))
        start = 0
        if overflow:
            run_initial = trainer.full_params()
            _set_loss_scale(trainer.runtime, OVERFLOW_SCALE)
            trainer.train(1)
            result["run_overflow"] = {"moved": _moved(run_initial, trainer.full_params()),
                                      **_scaler_state(trainer.runtime)}
            _set_loss_scale(trainer.runtime, SCALE)
            start = 1
        run = [s["loss"] for s in trainer.train(STEPS, start_step=start).steps]
        run_params = trainer.full_params()
        if trainer.runtime.scaler is not None:
            result["run_scaler"] = _scaler_state(trainer.runtime)
        with torch.device("meta"):
            model = GPT(**doc["job"]["model"]["kwargs"])
        pm = tensoropt.parallelize(model, doc)
        initial = _full(dict(pm.named_parameters()))
        opt = torch.optim.AdamW(pm.parameters(), lr=spec.lr)
        source = spec.batch_source()
        whole = [tuple((0, n) for n in (spec.global_batch_size, *s.shape)) for s in spec.inputs]
        api = []

        def api_step(step: int) -> float:
            loss = float(pm.train_step(dict(zip(pm.input_names, source.local(step, whole)))))
            opt.step()
            opt.zero_grad()
            return loss

        if overflow:
            _set_loss_scale(pm.tensoropt_runtime, OVERFLOW_SCALE)
            api_step(0)
            result["api_overflow"] = {"moved": _moved(initial, _full(dict(pm.named_parameters()))),
                                      **_scaler_state(pm.tensoropt_runtime)}
            _set_loss_scale(pm.tensoropt_runtime, SCALE)
        for step in range(start, start + STEPS):
            api.append(api_step(step))
        if pm.tensoropt_runtime.scaler is not None:
            result["api_scaler"] = _scaler_state(pm.tensoropt_runtime)
        dtypes = sorted({str(p.dtype) for p in pm.parameters()})
        api_params = _full(dict(pm.named_parameters()))
        if dist.get_rank() == 0:
            torch.save({"run": run, "api": api, "run_params": run_params, "api_params": api_params,
                        "dtypes": dtypes, "initial": initial, **result}, out)
        dist.barrier()
    finally:
        from tensoropt.executor.state.worker import end_process_group

        end_process_group()


if __name__ == "__main__":
    main()
