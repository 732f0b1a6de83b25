"""Which plan a (re)started worker takes for its world size: the job's rule under its budget."""

from __future__ import annotations

import pytest
from elastic_helpers import mlp_job

from tensoropt.elastic import ElasticPlanError, select_for_world_size
from tensoropt.plans import load_frontier_file

pytestmark = pytest.mark.timeout(120)


def test_fastest_plan_of_the_world_size_from_the_frontier(frontier_file):
    plan, line = select_for_world_size(2, frontier_file)
    frontier = load_frontier_file(frontier_file).frontier(2)
    assert plan["id"] == min(frontier.plans, key=lambda p: p.time_s).id
    assert plan["devices"] == 2 and plan["placements"]
    assert line.startswith(f"world size 2: plan {plan['id']} (") and f"from {frontier_file}" in line
    assert "rule fastest, budget 16.0 MiB" in line


def test_the_job_budget_decides(frontier_file):
    frontier = load_frontier_file(frontier_file).frontier(2)
    # the budget is checked against a plan's peak (its memory + its largest transient)
    budget = sorted(p.peak_memory_bytes for p in frontier.plans)[1]  # all but the leanest plan or so fail
    job = {**mlp_job([1, 2]), "memory_budget": int(budget)}
    plan, _ = select_for_world_size(2, frontier_file, job)
    fitting = [p for p in frontier.plans if p.peak_memory_bytes <= int(budget)]
    chosen = min(fitting, key=lambda p: p.time_s)
    assert plan["id"] == chosen.id
    assert chosen.peak_memory_bytes <= budget < max(p.peak_memory_bytes for p in frontier.plans)
    with pytest.raises(ElasticPlanError, match="world size 1: no plan fits"):
        select_for_world_size(1, frontier_file, job)  # one device needs the whole model


def test_nothing_to_select_from(tmp_path):
    with pytest.raises(ElasticPlanError, match="no frontier file .* and no job to plan"):
        select_for_world_size(2, tmp_path / "missing.json")


PIPELINED_JOB = {"model": {"name": "gpt", "kwargs": {"layers": 2, "width": 32, "heads": 2, "seq_len": 8,
                                                     "vocab_size": 64, "dropout": 0.0, "tie_weights": False}},
                 "cluster": "cpu-local", "devices": [2],
                 "training": {"global_batch_size": 8, "optimizer": "adamw", "learning_rate": 0.01, "seed": 0},
                 "planner": {"pipeline": {"stages": [2], "schedules": ["1F1B"], "micro_batches": [2, 4]}}}
"""The tiny zoo GPT (untied head) planned with pipelined plans beside the others."""


@pytest.mark.timeout(300)
def test_pipelined_plans_are_selected_where_the_worker_runs_them(tmp_path):
    """The executor's worker does not drive pipeline stages: for it (the default) selection leaves
    pipelined plans out and says so, rather than crash at the start. The trainer's loop runs them
    (``pipelined=True``, what `tensoropt run --elastic` asks): there a budget that only pipelined
    plans fit selects one."""
    from tensoropt.config import Job
    from tensoropt.planner import plan_job

    path = tmp_path / "frontier.json"
    plan_job(Job.from_dict(PIPELINED_JOB)).write(path)
    frontier = load_frontier_file(path).frontier(2)
    staged = [p for p in frontier.plans if p.pipeline]
    plain = [p for p in frontier.plans if not p.pipeline]
    assert staged and plain, "the test needs pipelined and other plans on the 2-device frontier"
    plan, line = select_for_world_size(2, path)
    assert plan["pipeline"] is None and plan["id"] in {p.id for p in plain}
    assert "pipelined plans skipped" in line and staged[0].id in line
    leanest_plain = min(p.peak_memory_bytes for p in plain)
    leanest_staged = min(p.peak_memory_bytes for p in staged)
    assert leanest_staged < leanest_plain, "the test needs a pipelined plan leaner than every other"
    job = {**PIPELINED_JOB, "memory_budget": int((leanest_staged + leanest_plain) / 2)}
    with pytest.raises(ElasticPlanError, match="pipelined plans d2-p.* were not considered"):
        select_for_world_size(2, path, job)
    plan, line = select_for_world_size(2, path, job, pipelined=True)
    fitting = {p.id: p.pipeline for p in staged if p.peak_memory_bytes <= job["memory_budget"]}
    assert plan["id"] in fitting and plan["pipeline"] == fitting[plan["id"]], (plan["id"], sorted(fitting))
    assert "skipped" not in line
