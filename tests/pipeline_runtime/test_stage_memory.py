"""Each pipeline stage's predicted tensor peak against the measured one (2 gloo processes).

The zoo GPT (2 layers x 128, seq 64, untied head, AdamW) is planned as ``tensoropt plan`` plans
a pipeline (:func:`tensoropt.pipeline_candidate.candidate_plans`: the stages' memory by part,
:mod:`tensoropt.pipeline.stage_memory`) with 1F1B (4 micro-batches: stage 0 keeps 2 in flight,
stage 1 one) and GPipe (2 micro-batches, both kept everywhere), and trained 3 steps by the
pipelined runtime, the second step measured for each rank's tensor peak (the worker's
``tensor_peak``: every live storage, torch's receive buffers included). Every stage's
``peak_bytes`` must be within :data:`TOLERANCE` of what its rank measured, and under 1F1B stage 0
must be the highest in both.
"""

from __future__ import annotations

import json

import pytest

from tensoropt.config import Job
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.launch import LaunchOptions, launch_module
from tensoropt.pipeline_candidate import candidate_plans

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(900)]

TOLERANCE = 0.02
"""Measured within 2 % of the predicted stage peak (here 1.001-1.003 with the backward walked in
order, :mod:`tensoropt.pipeline.stage_walk`; the ``2 x largest output`` bound it replaced put GPipe's
stage 0 at 0.976; benchmarks/pipeline_memory.py: 1.001-1.006 over 48 stage rows of the width-256
GPT, docs/results.md 2026-11-29). Tensor bytes do not move with the machine's load."""

JOB = {"model": {"name": "gpt", "kwargs": {"layers": 2, "width": 128, "heads": 4, "seq_len": 64,
                                           "vocab_size": 512, "dropout": 0.0, "tie_weights": False}},
       "cluster": "cpu-local", "devices": [2],
       "training": {"global_batch_size": 8, "optimizer": "adamw", "learning_rate": 0.001, "seed": 0}}


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("stage-memory")
    job = Job.from_dict(JOB)
    spec = TrainSpec.from_job(job, steps=3)
    plans = [candidate_plans(job, 2, 2, "1F1B", 4)[0], candidate_plans(job, 2, 2, "GPipe", 2)[0]]
    runs = [{"spec": spec.to_json(), "plan": p.to_json(), "steps": 3, "tensor_peak": True,
             "metrics": str(out / f"{p.id}.json")} for p in plans]
    (out / "runs.json").write_text(json.dumps({"runs": runs, "timeout_s": 120}))
    code = launch_module("tensoropt.pipeline_runtime.worker", [str(out / "runs.json")],
                         LaunchOptions(2, timeout_s=600))
    assert code == 0, f"the workers failed (exit code {code})"
    result = {}
    for p, run in zip(plans, runs):
        metrics = json.loads(open(run["metrics"]).read())
        ranks = {r["stage"]: r for r in metrics["measured"]["ranks"]}
        result[p.pipeline["schedule"]] = [
            (st["peak_bytes"], ranks[st["stage"]]["peak_tensor_bytes"] - ranks[st["stage"]]["before_bytes"])
            for st in p.pipeline_detail["stages"]]
    return result


@pytest.mark.parametrize("schedule", ["1F1B", "GPipe"])
def test_each_stage_peak_is_predicted_within_tolerance(measured, schedule):
    for stage, (predicted, got) in enumerate(measured[schedule]):
        assert abs(got / predicted - 1) <= TOLERANCE, (
            f"{schedule} stage {stage}: measured {got / 2**20:.2f} MiB, "
            f"predicted {predicted / 2**20:.2f} MiB")


def test_stage_0_holds_the_most_under_1f1b(measured):
    (pred0, got0), (pred1, got1) = measured["1F1B"]
    assert pred0 > pred1 and got0 > got1
