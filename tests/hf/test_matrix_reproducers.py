"""The support matrix's crash classes, each on a small reproducer (tests/hf/matrix_reproducers.py):
planned at 2 devices, a model-parallel plan run on 2 processes, matching 1 process."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tensoropt.config import Job
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.planner import plan_job

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "executor"))
sys.path.insert(0, str(HERE.parents[1] / "benchmarks"))
sys.path.insert(0, str(HERE))

from launch_helpers import run_and_compare  # noqa: E402
from model_matrix import model_parallel_plan  # noqa: E402

REPRODUCERS = ("ExpertRouter", "TensorOfSize", "Activations", "SplitRotary")
STEPS = 3


def _job(name: str) -> Job:
    return Job.from_dict({
        "model": {"factory": f"matrix_reproducers:{name}", "inputs": {"x": {"shape": [6, 16]}},
                  "targets": {"shape": [6], "dtype": "int64", "high": 4}, "loss": "cross_entropy"},
        "training": {"global_batch_size": 8, "optimizer": "momentum", "learning_rate": 0.05, "seed": 0},
        "cluster": "cpu-local", "devices": [2]})


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_reproducers_run_model_parallel_on_2_processes_and_match_1(tmp_path):
    runs = []
    for name in REPRODUCERS:
        job = _job(name)
        plan = model_parallel_plan(plan_job(job).to_json())
        assert plan is not None, f"{name}: no model-parallel plan on the 2-device frontier"
        runs.append((name, TrainSpec.from_job(job, steps=STEPS), plan))
    env = {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    rc, errors = run_and_compare(runs, tmp_path, env, STEPS)
    assert not errors, "\n".join(errors)
    assert rc == 0


def _conv_job() -> Job:
    return Job.from_dict({
        "model": {"factory": "matrix_reproducers:InvertedResidual", "inputs": {"x": {"shape": [3, 8, 8]}},
                  "targets": {"shape": [], "dtype": "int64", "high": 4}, "loss": "cross_entropy"},
        "training": {"global_batch_size": 8, "optimizer": "momentum", "learning_rate": 0.05, "seed": 0},
        "cluster": "cpu-local", "devices": [2]})


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_mobilenet_ops_split_on_channels_match_1_process_in_float32_and_float64(tmp_path, monkeypatch):
    """MobileNetV2's mismatch: its ops under a channel split match 1 process in float32 (rtol 1e-5),
    and the matrix's float64 check (what told MobileNetV2's float32 drift from a gradient bug) finds
    no difference."""
    from model_matrix import float64_parity_errors

    job = _conv_job()
    plan = model_parallel_plan(plan_job(job).to_json())
    assert plan is not None, "InvertedResidual: no model-parallel plan on the 2-device frontier"
    conv_labels = {c["label"] for name, c in plan["placements"].items() if name.startswith("conv2d")}
    assert conv_labels & {"in=2", "out=2"}, f"the plan splits no convolution's channels: {conv_labels}"
    spec = TrainSpec.from_job(job, steps=STEPS)
    path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)  # the float64 check's workers import the model too
    rc, errors = run_and_compare([("InvertedResidual", spec, plan)], tmp_path, {"PYTHONPATH": path}, STEPS)
    assert not errors, "\n".join(errors)
    assert rc == 0
    assert float64_parity_errors(spec, plan, tmp_path / "float64") == []
