"""Tensor constants a model makes in ``forward`` (issue 29, item 1).

Exported on meta (as capture and the executor export), a tensor that ``forward`` builds from Python
data has no value. ``export_program`` evaluates it on fake CPU stand-ins of the model, so GPT-Neo
(``torch.tensor(finfo.min, device=...)``) and Falcon (a list index ``qkv[..., [-2]]``), which
planned but crashed at ``tensoropt run``, now run a model-parallel plan on 2 processes and match
1 process; a constant that cannot have a value is a planning error naming the module and the line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tensoropt.capture.export import export_program
from tensoropt.config import Job
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.job_model import PlanningError
from tensoropt.planner import plan_job
from tensoropt.plans import plan_file_text

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "executor"))
import forward_constant_models as fcm  # noqa: E402
from launch_helpers import run_and_compare  # noqa: E402

STEPS = 3
TOKENS = {"shape": [16], "dtype": "int64", "high": 64}
HF = {
    "gpt_neo": {"num_layers": 2, "hidden_size": 32, "num_heads": 4, "vocab_size": 64,
                "max_position_embeddings": 32, "attention_types": [[["global", "local"], 1]],
                "window_size": 8, "embed_dropout": 0.0, "attention_dropout": 0.0, "resid_dropout": 0.0},
    "falcon": {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "vocab_size": 64,
               "hidden_dropout": 0.0, "attention_dropout": 0.0},
}


def _job(name: str, devices=(2,)) -> Job:
    if name in HF:
        model = {"factory": f"forward_constant_models:{name}", "kwargs": HF[name],
                 "inputs": {"input_ids": TOKENS, "labels": TOKENS}, "loss": "model"}
    else:
        model = {"factory": f"forward_constant_models:{name}", "inputs": {"x": {"shape": [16]}},
                 "targets": {"shape": [], "dtype": "int64", "high": 4}, "loss": "cross_entropy"}
    return Job.from_dict({"model": model, "cluster": "cpu-local", "devices": list(devices),
                          "training": {"global_batch_size": 8, "optimizer": "momentum",
                                       "learning_rate": 0.05, "seed": 0, "steps": STEPS}})


def test_constants_made_in_forward_have_their_values_when_exported_on_meta():
    x = torch.empty(4, 16, device="meta")
    with torch.device("meta"):
        scalar, listed = fcm.ScalarConstant(), fcm.ListIndexConstant()
    values = export_program(scalar, (x,)).constants
    assert [(k, v.device.type, float(v)) for k, v in values.items()] == [
        ("lifted_tensor_0", "cpu", torch.finfo(torch.float32).min)]
    values = export_program(listed, (x,)).constants
    assert sorted((k, v.tolist()) for k, v in values.items()) == [("lifted_tensor_0", [-2]),
                                                                  ("lifted_tensor_1", [-1])]
    assert listed.fc1.weight.is_meta  # the stand-ins are put back


def test_a_constant_without_a_value_is_a_planning_error_naming_its_module_and_line():
    with pytest.raises(PlanningError) as err:
        plan_job(_job("MetaConstant", devices=(1,)))
    message = str(err.value)
    line = next(i for i, text in enumerate(Path(fcm.__file__).read_text().splitlines(), 1)
                if 'device="meta"' in text)
    assert "'model.lifted_tensor_0'" in message and "forward_constant_models.MetaConstant" in message
    assert f"forward_constant_models.py:{line}" in message
    assert "When a model is not supported" in message and "Traceback" not in message


def _split_plan(job: Job) -> dict:
    """The lowest-memory 2-device plan that splits a parameter (a model-parallel plan)."""
    doc = plan_job(job).to_json()
    plans = sorted(doc["frontiers"][0]["plans"], key=lambda p: p["memory_bytes"])
    for p in plans:
        plan = json.loads(plan_file_text(doc, p["id"]))
        if any(any(d != "R" for d in layout) for c in plan["placements"].values()
               for layout in dict(c.get("params") or {}).values()):
            return plan
    raise AssertionError(f"{job.model.factory}: no model-parallel plan on the 2-device frontier")


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_models_with_forward_constants_run_model_parallel_on_2_processes_and_match_1(tmp_path):
    names = ["ScalarConstant", "ListIndexConstant", "gpt_neo", "falcon"]
    runs = []
    for name in names:
        job = _job(name)
        runs.append((name, TrainSpec.from_job(job, steps=STEPS), _split_plan(job)))
    env = {"PYTHONPATH": f"{HERE}:{HERE.parent / 'executor'}"}
    rc, errors = run_and_compare(runs, tmp_path, env, STEPS)
    assert not errors, "\n".join(errors)
    assert rc == 0
