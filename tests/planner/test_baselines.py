"""The data-parallel baseline: the plan users would write by hand, priced on the planner's tables."""

from __future__ import annotations

import json

import pytest

from estimators.profiles import load_cluster
from tensoropt.baselines import (
    data_parallel_assignment,
    data_parallel_frontier,
    data_parallel_plan_json,
    plan_cost,
)
from tensoropt.config import Job
from tensoropt.executor.job.plan import ExecPlan
from tensoropt.planner import capture_job, job_cost_graph, plan_job

JOB = {"model": {"name": "gpt"}, "cluster": "cpu-local", "devices": [2],
       "training": {"global_batch_size": 8}, "planner": {"epsilon": 0}}


@pytest.fixture(scope="module")
def gpt():
    job = Job.from_dict(JOB)
    graph = capture_job(job)
    return job, graph, job_cost_graph(graph, job, load_cluster("cpu-local"), 2)


def test_every_node_splits_its_batch_or_is_replicated(gpt):
    _, _, G = gpt
    assignment = data_parallel_assignment(G)
    assert set(assignment) == set(G.nodes)
    labels = {n: G.nodes[n]["configs"][c] for n, c in assignment.items()}
    for n, label in labels.items():
        has_batch = "batch=2" in G.nodes[n]["configs"]
        assert label == ("batch=2" if has_batch else "replicate"), (n, label)
    assert sum(label == "batch=2" for label in labels.values()) > len(labels) // 2


def test_the_exact_frontier_covers_the_data_parallel_plan(gpt):
    """No plan of the space beats every frontier plan: some frontier plan is at least as fast and as lean."""
    job, graph, G = gpt
    dp = data_parallel_frontier(G, graph, 8).plans[0]
    frontier = plan_job(job).frontier(2)
    assert any(p.time_s <= dp.time_s * (1 + 1e-9) and p.memory_bytes <= dp.memory_bytes + 1
               for p in frontier.plans), (dp.time_s, dp.memory_bytes)
    # and its cost is the tables' sum, node plus edge, as a solver point's would be
    total = plan_cost(G, data_parallel_assignment(G))
    assert (dp.time_s, dp.memory_bytes) == pytest.approx((total[0], round(total[1])))


def test_the_plan_document_is_what_run_reads(gpt):
    job, _, _ = gpt
    doc = data_parallel_plan_json(job, 2)
    plan = ExecPlan.from_json(json.loads(json.dumps(doc)))
    assert plan.devices == 2 and plan.plan_id == "d2-dp" and doc["graph"]
    splits = [dict(c.splits).get("batch") for c in plan.placements.values()]
    assert splits.count((0,)) > len(splits) // 2


def test_the_fully_sharded_plan_is_fsdps_layout_and_leaner():
    """``options=("zero3",)``: every operator with parameters takes its ZeRO-3 batch split, the rest
    stay plain data parallel; the plan is leaner than plain data parallelism and costs more time."""
    job = Job.from_dict({**JOB, "training": {"global_batch_size": 8, "memory_options": ["zero3"]}})
    graph = capture_job(job)
    G = job_cost_graph(graph, job, load_cluster("cpu-local"), 2)
    plain, sharded = data_parallel_assignment(G), data_parallel_assignment(G, ("zero3",))
    for n, c in sharded.items():
        labels = G.nodes[n]["configs"]
        want = labels[plain[n]] + ",zero3"
        assert labels[c] == (want if want in labels else labels[plain[n]]), (n, labels[c])
    assert sum(G.nodes[n]["configs"][c].endswith("zero3") for n, c in sharded.items()) >= 4
    plain_cost, sharded_cost = plan_cost(G, plain), plan_cost(G, sharded)
    assert sharded_cost[1] < plain_cost[1] and sharded_cost[0] > plain_cost[0]
    doc = data_parallel_plan_json(job, 2, ("zero3",))
    assert doc["id"] == "d2-dp-zero3" and doc["memory_bytes"] == pytest.approx(sharded_cost[1], abs=1)


def test_a_fully_sharded_plan_needs_the_option_in_the_job():
    with pytest.raises(ValueError, match="training.memory_options"):
        data_parallel_plan_json(Job.from_dict(JOB), 2, ("zero3",))
