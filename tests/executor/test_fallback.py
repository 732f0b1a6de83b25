"""Ops with no parallel rule and no DTensor sharding strategy run through the executor's fallback.

``aten.im2col`` (F.unfold) has no DTensor strategy (DTensor raises NotImplementedError on it) and
``aten.pixel_shuffle`` only DTensor's decomposition path; both are captured opaque and run on local
tensors (tensoropt/executor/ops/fallback.py), replicated or batch-split as the plan says.
"""

from __future__ import annotations

import json

import pytest
import torch
from launch_helpers import parity_errors, run_plans, single_process

from tensoropt.config import Job
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.executor.ops.fallback import fallback_nodes
from tensoropt.planner import capture_job, plan_job
from tensoropt.plans import plan_file_text

JOB = {"model": {"factory": "fallback_models:Patches", "inputs": {"x": {"shape": [16]}},
                 "targets": {"shape": [], "dtype": "int64", "high": 4}, "loss": "cross_entropy"},
       "training": {"global_batch_size": 8, "optimizer": "momentum", "learning_rate": 0.1},
       "cluster": "cpu-local", "devices": [2]}


def test_ops_without_a_rule_are_the_fallback_nodes():
    graph = capture_job(Job.from_dict(JOB))
    opaque = {n for n, d in graph.nx.nodes(data=True) if d["kind"] == "opaque"}
    ops = {graph.nx.nodes[n]["op"] for n in opaque}
    assert ops == {"aten.pixel_shuffle.default", "aten.im2col.default"}
    assert fallback_nodes(graph.program.graph) == opaque


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_fallback_plans_replicated_and_batch_split_match_one_process(tmp_path):
    job = Job.from_dict(JOB)
    frontier_json = plan_job(job).to_json()
    plans = [p for f in frontier_json["frontiers"] for p in f["plans"]]
    shuffle = {p["id"]: p["ops"]["pixel_shuffle"] for p in plans}
    picks = [next(i for i, c in shuffle.items() if c == "replicate"),
             next(i for i, c in shuffle.items() if c.startswith("batch"))]
    picks.append(min(plans, key=lambda p: p["memory_bytes"])["id"])  # the most split
    spec = TrainSpec.from_job(job)
    runs = [("patches", spec, json.loads(plan_file_text(frontier_json, i))) for i in dict.fromkeys(picks)]
    rc, _ = run_plans(runs, 2, tmp_path, timeout_s=400)
    reference = single_process(spec)
    errors = [e for _, _, plan in runs for e in parity_errors("patches", plan["id"], tmp_path, reference)]
    assert not errors, "\n".join(errors)
    assert rc == 0
    assert torch.isfinite(torch.tensor(reference[0])).all()
