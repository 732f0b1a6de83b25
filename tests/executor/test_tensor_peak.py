"""``measured.peak_tensor_bytes``: the high-water mark of live tensor bytes (issue 29, item 5).

The CPU counterpart of ``max_memory_allocated``: counted from the storages operators make and free,
so no allocator setting changes it, and the memory model is judged against it on the CPU.
"""

from __future__ import annotations

import json

import pytest
import torch

from tensoropt.config import Job
from tensoropt.executor.job.plan import ExecPlan
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.executor.state.peak_memory import predicted_peak_bytes
from tensoropt.executor.state.tensor_peak import TensorPeak
from tensoropt.planner import plan_job
from tensoropt.plans import plan_file_text
from tensoropt.training.trainer import Trainer

MLP = {"model": {"name": "mlp", "input_shape": [512], "num_classes": 512,
                 "kwargs": {"in_features": 512, "hidden": [1024, 1024], "num_classes": 512}},
       "training": {"global_batch_size": 32, "optimizer": "adamw", "learning_rate": 0.001, "steps": 3},
       "cluster": "cpu-local", "devices": [1]}


def test_the_tracker_counts_new_storages_once_and_frees_them():
    with TensorPeak(baseline_bytes=100) as peak:
        a = torch.zeros(256)                 # 1 KiB
        b = a.view(16, 16)                   # same storage: nothing new
        a.add_(1)                            # in place: nothing new
        c = torch.cat([a, a])                # 2 KiB: 3 KiB alive
        del a, b, c
        d = torch.ones(128)                  # 0.5 KiB after the frees
    assert peak.peak_bytes == 100 + 3 * 1024
    assert peak.live_bytes == 100 + 512
    del d


@pytest.fixture(scope="module")
def mlp_run():
    job = Job.from_dict(MLP)
    doc = plan_job(job).to_json()
    plan = ExecPlan.from_json(json.loads(plan_file_text(doc, doc["frontiers"][0]["plans"][0]["id"])))
    trainer = Trainer(TrainSpec.from_job(job, steps=3), plan)
    return trainer, trainer.train(3)


def test_the_memory_model_predicts_the_tensor_peak_of_a_cpu_run_within_2_percent(mlp_run):
    trainer, result = mlp_run
    predicted = predicted_peak_bytes(trainer, runtime=False)
    assert result.peak_tensor_bytes > trainer.resident_tensor_bytes() > 0
    measured = result.peak_tensor_bytes
    assert abs(measured - predicted) <= 0.02 * predicted, (measured, predicted)


def test_the_tensor_peak_is_the_same_in_every_run_of_the_same_plan(mlp_run):
    trainer, result = mlp_run
    again = Trainer(trainer.spec, trainer.plan, mode="interpret").train(2)
    assert again.peak_tensor_bytes == result.peak_tensor_bytes


def test_the_first_steps_peak_holds_the_optimizer_state_it_creates():
    """AdamW makes its moments in the first ``optimizer.step()``, after that step's activations are
    freed; every later step holds them through forward and backward. The first step's measured peak
    is the later steps' (it read the whole state low before: an activation-heavy MLP here)."""
    job = Job.from_dict({**MLP, "model": {"name": "mlp", "input_shape": [256], "num_classes": 64,
                                          "kwargs": {"in_features": 256, "hidden": [512, 512],
                                                     "num_classes": 64}},
                         "training": {**MLP["training"], "global_batch_size": 1024}})
    doc = plan_job(job).to_json()
    plan = ExecPlan.from_json(json.loads(plan_file_text(doc, doc["frontiers"][0]["plans"][0]["id"])))
    trainer = Trainer(TrainSpec.from_job(job, steps=3), plan)
    first = trainer.train(1).peak_tensor_bytes
    state = trainer.meter.optimizer_state_bytes()
    later = trainer.train(1, start_step=1).peak_tensor_bytes
    assert state > 0.02 * later  # the state is large enough to tell the two apart
    assert abs(first - later) <= 0.005 * later, (first, later, state)
