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
