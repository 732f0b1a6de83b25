"""``pm.eval_step`` is ``model.eval()``'s forward loss (issue 24): dropout off, on a model-parallel
2-process plan of a GPT whose dropout is 0.3 (in ``nn.Dropout`` and in attention's ``dropout_p``),
after two training steps; the training graph's loss (dropout on) differs from it by far more than
the tolerance, so a forward of the training graph fails here."""

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

KWARGS = {"vocab_size": 64, "seq_len": 16, "layers": 1, "width": 32, "heads": 2, "dropout": 0.3}


def _model_parallel_plan() -> dict:
    job = Job.from_dict({"model": {"name": "gpt", "kwargs": KWARGS}, "cluster": "cpu-local", "devices": [2],
                         "training": {"global_batch_size": 4, "optimizer": "sgd"}})
    return model_parallel_plan(job)


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_eval_step_is_the_eval_mode_forward_loss(tmp_path):
    from tensoropt.models.gpt import GPT

    plan, kwargs, out = tmp_path / "plan.json", tmp_path / "kwargs.json", tmp_path / "out.pt"
    plan.write_text(json.dumps(_model_parallel_plan()))
    kwargs.write_text(json.dumps(KWARGS))
    proc = torchrun(HERE / "eval_worker.py", [str(plan), str(kwargs), str(out)], timeout_s=500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = torch.load(out)
    model = GPT(**KWARGS)
    model.load_state_dict(got["state"])
    ids = got["batch"]
    model.eval()
    with torch.no_grad():
        expected = float(model(ids, ids))
    model.train()
    torch.manual_seed(1)
    with torch.no_grad():
        training = float(model(ids, ids))
    assert abs(training - expected) > 1e-3  # dropout matters here
    assert got["eval"][0] == got["eval"][1] and got["rng_unchanged"]  # no state change
    assert abs(got["eval"][0] - expected) <= 1e-5 * max(1.0, abs(expected)), (got["eval"][0], expected)
