"""A data-parallel ViT's tensor peak is at the end of backward, and the step-order peak predicts it
(issue 29: peak within 5 % of ``measured.peak_tensor_bytes`` per family).

The plan's ``memory_bytes`` counts every parameter, gradient, optimizer state and saved activation at
once. A data-parallel HF ViT (width 256) never holds them together: its peak is at the end of backward,
where the gradients and their bucket copies for the all-reduce are alive and almost every saved
activation is freed; the sum form predicted 8.5 % over (docs/results.md, 2026-11-28 step-order peak).
The step-order peak (:mod:`estimators.step_peak`, :mod:`tensoropt.peak_transients`) takes the largest
moment of the step instead, and the planner's ``peak_memory_bytes`` is the same figure as the
executor's ``predicted.peak_tensor_bytes`` (issue 25's loose end).
"""

from __future__ import annotations

import json

import pytest
from launch_helpers import outputs, run_plans

from tensoropt.config import Job
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.planner import plan_job
from tensoropt.plans import plan_file_text

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

WIDTH = 128
VIT = {"model": {"factory": "tensoropt.models.hf_auto:build",
                 "kwargs": {"architecture": "ViTForImageClassification", "hidden_size": WIDTH,
                            "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 4 * WIDTH,
                            "image_size": 32, "patch_size": 4, "num_labels": 10, "hidden_dropout_prob": 0.0,
                            "attention_probs_dropout_prob": 0.0},
                 "inputs": {"pixel_values": {"shape": [3, 32, 32], "dtype": "float32"},
                            "labels": {"shape": [], "dtype": "int64", "high": 10}},
                 "loss": "model"},
       "training": {"global_batch_size": 8, "optimizer": "adamw", "learning_rate": 0.001, "seed": 0,
                    "steps": 2},
       "cluster": "cpu-local", "devices": [2]}
"""A small HF ViT whose gradients and their bucket copies outweigh its saved activations at batch 4 a rank."""

TOLERANCE = 0.05
"""The issue's target."""


def test_a_data_parallel_vits_peak_is_the_step_orders(tmp_path):
    pytest.importorskip("transformers", reason="the HuggingFace tests need the dev extra (transformers 5.x)")
    job = Job.from_dict(VIT)
    frontier_json = plan_job(job).to_json()
    frontier = next(f for f in frontier_json["frontiers"] if f["devices"] == 2)
    dp = frontier["data_parallel"]
    plan = json.loads(plan_file_text(frontier_json, dp["id"]))
    assert {c["label"] for c in plan["placements"].values()} <= {"batch=2", "replicate"}, plan["placements"]
    rc, _ = run_plans([("vit", TrainSpec.from_job(job), plan)], 2, tmp_path, steps=2)
    assert rc == 0
    metrics = outputs(tmp_path, "vit", dp["id"])[0]
    measured = metrics["measured"]["peak_tensor_bytes"]
    predicted = metrics["predicted"]["peak_tensor_bytes"]
    error = (predicted - measured) / measured
    assert abs(error) <= TOLERANCE, (predicted, measured, f"{100 * error:+.1f} %")
    # the reproducer: every term at once (memory_bytes) is more than 5 % over what the step holds
    assert (dp["memory_bytes"] - measured) / measured > TOLERANCE, (dp["memory_bytes"], measured)
    # the planner's peak (what the selector holds against a budget) is the executor's prediction
    planned = dp["peak_tensor_bytes"]
    assert planned == pytest.approx(predicted, rel=1e-6, abs=1024), (planned, predicted)
