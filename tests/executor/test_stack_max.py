"""``aten.stack`` and ``aten.max.dim`` have parallel rules (issue 29): the configuration space offers
their operands' splits (stack's new dim and max's reduced dim stay whole) and the executor runs
them on 2 processes equal to one process, split on the batch and on the features."""

from __future__ import annotations

import warnings

import pytest
import torch
from launch_helpers import ENV, run_and_compare
from stack_models import StackMax

from tensoropt.baselines import data_parallel_plan_json
from tensoropt.capture import capture
from tensoropt.capture.graph import CaptureWarning
from tensoropt.config import Job
from tensoropt.configspace import configurations
from tensoropt.configspace.configuration import Mesh
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.planner import capture_job

MESH = Mesh((2,), ("gpu",))


def _job() -> Job:
    return Job.from_dict({
        "model": {"factory": "stack_models:StackMax", "kwargs": {},
                  "inputs": {"x": {"shape": [8]}, "labels": {"shape": [], "dtype": "int64", "high": 4}}},
        "training": {"global_batch_size": 8, "optimizer": "adamw", "learning_rate": 0.01},
        "cluster": "cpu-local", "devices": [2]})


def _offered() -> tuple[dict, dict]:
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureWarning)  # neither op is opaque any more
        graph = capture(StackMax(), (torch.randn(8, 8), torch.randint(0, 4, (8,))))
    confs = configurations(graph, MESH)
    by_op = {graph.nx.nodes[n]["op"]: {c.label: c for c in confs[n]} for n in graph.compute_nodes()}
    return graph, by_op


def test_stack_and_max_offer_their_operands_splits_but_not_the_new_or_reduced_dim():
    graph, by_op = _offered()
    stack, mx = by_op["aten.stack.default"], by_op["aten.max.dim"]
    assert set(stack) == {"replicate", "batch=2", "out=2"}, set(stack)
    assert stack["out=2"].inputs == (("S(1)",), ("S(1)",)) and stack["out=2"].output == ("S(1)",)
    assert stack["batch=2"].output == ("S(0)",)
    assert set(mx) == {"replicate", "batch=2", "out=2"}, set(mx)  # the stacked (reduced) dim: never split
    assert mx["out=2"].inputs == (("S(1)",),) and mx["out=2"].output == ("S(1)",)
    assert not mx["out=2"].partial_axes


def _feature_plan(job: Job) -> dict:
    """The data-parallel plan with fc1 column-split, the product, stack and max split on the
    features, and fc2 row-split (its output a partial sum, then the batch-split loss)."""
    plan = data_parallel_plan_json(job, 2)
    graph = capture_job(job)
    confs = configurations(graph, MESH)
    wanted = {"aten.linear.default": ["out=2", "in=2"], "aten.mul.Tensor": ["out=2"],
              "aten.sub.Tensor": ["out=2"], "aten.stack.default": ["out=2"], "aten.max.dim": ["out=2"]}
    seen: dict[str, int] = {}
    for n in graph.compute_nodes():
        op = graph.nx.nodes[n]["op"]
        if op in wanted:
            label = wanted[op][min(seen.get(op, 0), len(wanted[op]) - 1)]
            seen[op] = seen.get(op, 0) + 1
            (conf,) = [c for c in confs[n] if c.label == label]
            plan["placements"][n] = conf.to_json()
    assert seen["aten.stack.default"] == 1 and seen["aten.max.dim"] == 1, seen
    plan["id"] = "d2-features"
    return plan


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_stack_and_max_split_on_batch_and_features_match_one_process(tmp_path):
    job = _job()
    spec = TrainSpec.from_job(job)
    dp = data_parallel_plan_json(job, 2)
    assert {dp["placements"][n]["label"] for n in dp["placements"] if n.startswith(("stack", "max"))} \
        == {"batch=2"}
    runs = [("batch", spec, dp), ("features", spec, _feature_plan(job))]
    rc, errors = run_and_compare(runs, tmp_path, ENV)
    assert not errors, "\n".join(errors)
    assert rc == 0
