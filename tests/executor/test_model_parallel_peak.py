"""A model-parallel plan's tensor peak is the memory model's (issue 29: peak within 5 % of
``measured.peak_tensor_bytes`` per family).

The measured step runs through the DTensor interpreter, which memoises the views and redistributions
it makes within a forward pass (q, k and v of one split share it). The memo held every gathered copy,
and the tensor it was gathered from, to the end of forward, beside the activations the model prices:
the leanest plan of a width-256 GPT-2 peaked 32 % above the prediction (docs/results.md,
2026-11-28 model-parallel peaks). A memoised value is now dropped with its source at the source's last
use.
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

GPT2 = {"model": {"factory": "tensoropt.models.hf:gpt2",
                  "kwargs": {"n_layer": 2, "n_embd": 128, "n_head": 4, "n_positions": 64, "vocab_size": 512,
                             "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
                  "inputs": {"input_ids": {"shape": [64], "dtype": "int64", "high": 512},
                             "labels": {"shape": [64], "dtype": "int64", "high": 512}},
                  "loss": "model"},
        "training": {"global_batch_size": 8, "optimizer": "adamw", "learning_rate": 0.001, "seed": 0,
                     "steps": 2},
        "cluster": "cpu-local", "devices": [2]}
"""A small HF GPT-2 whose activations outweigh its parameters (what the interpreter kept shows)."""

TOLERANCE = 0.05
"""The issue's target. Measured (docs/results.md, 2026-11-28; tensor bytes do not depend on the load):
this plan (the roofline frontier's leanest at 2 devices) predicted 12.86 MiB, measured 12.36 (+4.0 %)
with the memo dropped at last use; 19.67 measured (-31.5 %) before."""


def test_a_model_parallel_plans_tensor_peak_is_predicted(tmp_path):
    pytest.importorskip("transformers", reason="the HuggingFace tests need the dev extra (transformers 5.x)")
    job = Job.from_dict(GPT2)
    frontier_json = plan_job(job).to_json()
    plans = next(f["plans"] for f in frontier_json["frontiers"] if f["devices"] == 2)
    leanest = min(plans, key=lambda p: (p["memory_bytes"], p["time_s"]))
    plan = json.loads(plan_file_text(frontier_json, leanest["id"]))
    labels = {c["label"] for c in plan["placements"].values()}
    assert any(label.split("=")[0] in ("out", "in", "heads") for label in labels), labels  # model-parallel
    rc, _ = run_plans([("gpt2", TrainSpec.from_job(job), plan)], 2, tmp_path, steps=2)
    assert rc == 0
    metrics = outputs(tmp_path, "gpt2", leanest["id"])[0]
    measured = metrics["measured"]["peak_tensor_bytes"]
    predicted = metrics["predicted"]["peak_tensor_bytes"]
    error = (predicted - measured) / measured
    assert abs(error) <= TOLERANCE, (leanest["id"], predicted, measured, f"{100 * error:+.1f} %")
