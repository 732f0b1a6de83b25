"""``tensoropt.parallelize`` trains a ``bf16-mixed`` plan as ``tensoropt run`` does: float32 master
parameters, the graph in bfloat16; a user loop (meta model, stock AdamW, global batches) and
``tensoropt run``'s loop on one model-parallel 2-process plan give the same losses and parameters
at bfloat16's tolerance. The same for ``fp16-mixed`` with its dynamic loss scaling, after a first
step whose scaled gradients overflow float16, which both skip alike (parameters unchanged, the scale
halved, one skip counted)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from loop_plans import model_parallel_plan  # noqa: E402
from torchrun import torchrun  # noqa: E402

from tensoropt.config import Job  # noqa: E402

KWARGS = {"vocab_size": 64, "seq_len": 16, "layers": 1, "width": 32, "heads": 2, "dropout": 0.0}
BF16_TOL = 1e-2  # bfloat16 keeps 8 bits of mantissa: 4e-3 relative rounding per operation


def _model_parallel_plan(precision: str = "bf16-mixed") -> dict:
    job = Job.from_dict({"model": {"name": "gpt", "kwargs": KWARGS}, "cluster": "cpu-local", "devices": [2],
                         "training": {"global_batch_size": 4, "optimizer": "adamw", "learning_rate": 0.01,
                                      "precision": precision}})
    return model_parallel_plan(job)


def _assert_trained_alike(got: dict, tol: float) -> None:
    """The user loop's parameters moved from their start; its losses and float32 parameters equal
    ``tensoropt run``'s within ``tol`` (relative; absolute too for parameters)."""
    moved = max(float((got["api_params"][k] - v).abs().max()) for k, v in got["initial"].items())
    assert moved > 1e-3, moved
    for run, api in zip(got["run"], got["api"]):
        assert abs(run - api) <= tol * abs(run), (got["run"], got["api"])
    for key, value in got["run_params"].items():
        api = got["api_params"][key]
        assert api.dtype == torch.float32
        assert torch.allclose(api, value, rtol=tol, atol=tol), (key, (api - value).abs().max())


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_bf16_mixed_through_parallelize_matches_tensoropt_run(tmp_path):
    plan, out = tmp_path / "plan.json", tmp_path / "out.pt"
    doc = _model_parallel_plan()
    assert doc["job"]["training"]["precision"] == "bf16-mixed"
    plan.write_text(json.dumps(doc))
    proc = torchrun(HERE / "mixed_worker.py", [str(plan), str(out)], timeout_s=500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = torch.load(out)
    assert got["dtypes"] == ["torch.float32"]  # the masters; the graph computes in bfloat16
    _assert_trained_alike(got, BF16_TOL)  # the losses, read in bfloat16, may round alike: parameters move


FP16_TOL = 1e-2  # the tolerance for mixed precision (float16 keeps 11 bits: 5e-4 per operation)


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_fp16_mixed_through_parallelize_matches_tensoropt_run_and_skips_an_overflow_alike(tmp_path):
    plan, out = tmp_path / "plan.json", tmp_path / "out.pt"
    doc = _model_parallel_plan("fp16-mixed")
    assert doc["job"]["training"]["precision"] == "fp16-mixed"
    plan.write_text(json.dumps(doc))
    proc = torchrun(HERE / "mixed_worker.py", [str(plan), str(out), "overflow"], timeout_s=500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = torch.load(out)
    assert got["dtypes"] == ["torch.float32"]  # the masters; the graph computes in float16
    # the first step (loss scale 2**40) overflowed on both sides: skipped, the scale halved
    for side in ("run_overflow", "api_overflow"):
        assert got[side] == {"moved": 0.0, "scale": 2.0**39, "skipped": 1}, (side, got[side])
    # then 3 steps at a scale of 2**8: trained alike, no further skip on either side
    assert got["run_scaler"] == got["api_scaler"] == {"scale": 2.0**8, "skipped": 1}, \
        (got["run_scaler"], got["api_scaler"])
    assert len(got["run"]) == len(got["api"]) == 3
    _assert_trained_alike(got, FP16_TOL)  # it trains after the skipped step, both sides alike
