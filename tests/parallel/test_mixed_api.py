"""``tensoropt.parallelize`` trains a ``bf16-mixed`` plan as ``tensoropt run`` does: float32 master
parameters, the graph in bfloat16; a user loop (meta model, stock AdamW, global batches) and
``tensoropt run``'s loop on one model-parallel 2-process plan give the same losses and parameters
at bfloat16's tolerance."""

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


def _model_parallel_plan() -> dict:
    job = Job.from_dict({"model": {"name": "gpt", "kwargs": KWARGS}, "cluster": "cpu-local", "devices": [2],
                         "training": {"global_batch_size": 4, "optimizer": "adamw", "learning_rate": 0.01,
                                      "precision": "bf16-mixed"}})
    return model_parallel_plan(job)


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
    moved = max(float((got["api_params"][k] - v).abs().max()) for k, v in got["initial"].items())
    assert moved > 1e-3  # it trains (the losses, read in bfloat16, may round alike)
    for run, api in zip(got["run"], got["api"]):
        assert abs(run - api) <= BF16_TOL * abs(run), (got["run"], got["api"])
    for key, value in got["run_params"].items():
        api = got["api_params"][key]
        assert api.dtype == torch.float32
        assert torch.allclose(api, value, rtol=BF16_TOL, atol=BF16_TOL), (key, (api - value).abs().max())
