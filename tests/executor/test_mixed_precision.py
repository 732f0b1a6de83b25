"""Mixed precision in the executor (issue 17 part 5): bf16-mixed and fp16-mixed plans as users train them.

The zoo GPT (2 layers, width 32) is planned in ``bf16-mixed`` with ``recompute`` and ``zero3``
offered, on 2 devices of cpu-local, by the real planner. A model-parallel plan (split heads /
output features, no zero3) and a plan with zero3 and recompute train 3 steps on 2 processes
(gloo) in bf16-mixed, the model-parallel plan also in fp16-mixed (dynamic loss scaling); each must
match the 1-process run of the same precision within bf16 tolerance, and the executor's measured
memory (float32 master parameters, gradients and optimizer state + saved activations, the bf16
parameter copies among them) must be within 2 % of the cost model's prediction. In one process,
bf16-mixed losses stay close to float32's.
"""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest
import torch
from launch_helpers import outputs, parity_errors, run_plans, single_process

from tensoropt.config import Job
from tensoropt.executor.job.plan import ExecPlan
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.planner import plan_job
from tensoropt.plans import plan_file_text
from tensoropt.training.trainer import Trainer

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

JOB = {"model": {"name": "gpt", "kwargs": {"layers": 2, "width": 32, "heads": 2, "dropout": 0.0},
                 "seq_len": 16, "vocab_size": 64},
       "training": {"global_batch_size": 4, "optimizer": "momentum", "learning_rate": 0.05,
                    "precision": "bf16-mixed", "memory_options": ["recompute", "zero3"]},
       "cluster": "cpu-local", "devices": [2], "planner": {"epsilon": 0.0}}
"""Momentum, not AdamW: AdamW turns rounding noise in near-zero gradients into lr-sized steps."""
LOSS_RTOL, PARAM_RTOL, PARAM_ATOL = 1e-2, 2e-2, 1e-4
"""bf16 keeps 8 bits of mantissa: reductions summed in another order differ by ~0.4 % per op. A
parameter that starts at 0 (a norm's bias) is compared within 1e-4 besides 2 % of its scale: its
3 updates of ~5e-4 each carry the gradient's bf16 noise; a wrong gradient moves it by the update."""
SINGLE = ExecPlan.from_json({"id": "single", "mesh": {"shape": [], "levels": []}, "placements": {}})


def _job(precision: str) -> Job:
    return Job.from_dict({**JOB, "training": {**JOB["training"], "precision": precision}})


def _spec(precision: str, steps: int = 3) -> TrainSpec:
    return TrainSpec.from_job(_job(precision), steps=steps)


def _parallel(summary: str) -> bool:
    return any(s in summary for s in ("out=", "in=", "heads=")) and "zero3" not in summary


@functools.cache
def _runs() -> list[tuple[str, TrainSpec, dict, float]]:
    """(precision, spec, plan.json dict, predicted memory bytes) of each run (a plan is made for the
    graph of its precision: fp16-mixed is planned on its own)."""
    out = []
    for precision, kinds in (("bf16-mixed", ("parallel", "zero3")), ("fp16-mixed", ("parallel",))):
        frontier = plan_job(_job(precision)).to_json()
        plans = frontier["frontiers"][0]["plans"]
        for kind in kinds:
            plan = next(p for p in plans if (_parallel(p["summary"]) if kind == "parallel"
                                             else "zero3" in p["summary"] and "recompute" in p["summary"]))
            doc = json.loads(plan_file_text(frontier, plan["id"]))
            out.append((precision, _spec(precision), doc, plan["memory_bytes"]))
    return out


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    out = tmp_path_factory.mktemp("mixed")
    rc, seconds = run_plans([(n, s, d) for n, s, d, _ in _runs()], 2, out)
    print(f"{len(_runs())} mixed-precision plans at 2 processes in {seconds:.1f} s")
    return out, rc


def test_plans_are_model_parallel_and_zero3():
    summaries = [d["placements"] for _, _, d, _ in _runs()]
    assert any(any("heads" in json.dumps(c) or "out" in json.dumps(c) for c in s.values()) for s in summaries)
    assert any("zero3" in json.dumps(s) and "recompute" in json.dumps(s) for s in summaries)


@pytest.mark.parametrize("precision", ["bf16-mixed", "fp16-mixed"])
def test_mixed_plans_match_single_process(launched, precision):
    out, rc = launched
    reference = single_process(_spec(precision))
    errors = []
    for name, _, doc, _ in _runs():
        if name == precision:
            found = parity_errors(name, doc["id"], out, reference, LOSS_RTOL, param_rtol=float("inf"))
            errors += found
            params = {} if found else outputs(out, name, doc["id"])[1]
            for key, value in params.items():
                ref = reference[1][key]
                diff, scale = float((value - ref).abs().max()), float(ref.abs().max())
                if diff > PARAM_RTOL * scale + PARAM_ATOL:
                    errors.append(f"{name} {doc['id']}: {key} differs by {diff:.3g} (scale {scale:.3g})")
    assert rc == 0 or errors, f"the launch failed (exit {rc})"
    assert not errors, "\n".join(errors)
    assert all(p.dtype == torch.float32 for p in reference[1].values())  # float32 master parameters


def test_predicted_memory_within_two_percent(launched):
    out, _ = launched
    rows = []
    for name, _, doc, predicted in _runs():
        measured = outputs(out, name, doc["id"])[0]["measured"]["memory_bytes"]
        rows.append((name, doc["id"], predicted, measured))
    bad = [r for r in rows if abs(r[2] - r[3]) > 0.02 * r[3]]
    assert not bad, f"predicted vs measured bytes off by more than 2 %: {bad} (all: {rows})"


def test_bf16_mixed_losses_stay_close_to_fp32():
    fp32, _ = single_process(_spec("fp32", steps=4), 4)
    mixed, _ = single_process(_spec("bf16-mixed", steps=4), 4)
    assert len(mixed) == 4 and mixed != fp32  # really computed in bf16
    for a, b in zip(mixed, fp32):
        assert abs(a - b) <= 2e-2 * abs(b), (mixed, fp32)


def test_mixed_trainer_keeps_fp32_masters_and_runs_the_graph_in_bf16():
    trainer = Trainer(_spec("bf16-mixed"), SINGLE, mode="interpret")
    assert {p.dtype for p in trainer.params.values()} == {torch.float32}
    floats = {n.meta["val"].dtype for n in trainer.ep.graph.nodes
              if n.op == "placeholder" and n.meta["val"].is_floating_point()}
    assert floats == {torch.bfloat16}
    trainer.train(1)
    assert trainer.optimizer.state and all(  # momentum buffers of the float32 masters
        s["momentum_buffer"].dtype == torch.float32 for s in trainer.optimizer.state.values())


@pytest.mark.parametrize("mode", ["interpret", "replay"])
def test_fp16_mixed_skips_a_step_whose_scaled_gradients_overflow(mode):
    spec = dataclasses.replace(_spec("fp16-mixed"), optimizer="sgd")
    trainer = Trainer(spec, SINGLE, mode=mode)
    trainer.scaler.scale = 2.0**40  # overflows float16 (max 65504) in the first backward
    trainer.interpreter.loss_scale = trainer.scaler.scale
    before = {k: p.detach().clone() for k, p in trainer.params.items()}
    trainer.train(1)
    assert trainer.scaler.skipped == 1 and trainer.scaler.scale == 2.0**39
    assert all(torch.equal(before[k], p) for k, p in trainer.params.items())  # the step was skipped
    trainer.scaler.scale = trainer.interpreter.loss_scale = 2.0**8
    trainer.train(2, start_step=1)
    assert trainer.scaler.skipped == 1
    assert any(not torch.equal(before[k], p) for k, p in trainer.params.items())
