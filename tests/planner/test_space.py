"""planner.space: the full space up to full_space_max_devices, the hierarchical one beyond."""

import pytest

from estimators.profiles import load_cluster
from tensoropt.config import Job, PlannerConfig
from tensoropt.configspace.configuration import parse_label
from tensoropt.planner import capture_job, plan_devices


def _job(space: str) -> Job:
    return Job.from_dict({
        "model": {"name": "mlp", "kwargs": {"in_features": 32, "hidden": [64, 64], "num_classes": 8}},
        "training": {"global_batch_size": 32, "optimizer": "sgd"},
        "cluster": "h100-4x8-ib", "devices": [16], "memory_budget": "1GiB",
        "planner": {"space": space},
    })


def test_auto_switches_at_the_limit():
    cfg = PlannerConfig(full_space_max_devices=4)
    assert [cfg.hierarchical_for(p) for p in (1, 4, 8)] == [False, False, True]
    assert PlannerConfig(space="full").hierarchical_for(1024) is False
    assert PlannerConfig(space="hierarchical").hierarchical_for(2) is True


def test_bad_space_names_the_field():
    with pytest.raises(ValueError, match="space"):
        PlannerConfig(space="everything")


def test_hierarchical_frontier_is_inside_the_full_one():
    """Each level's axes split one dim only; the full space is a superset, so its fastest plan is
    no slower and every hierarchical label uses at most one dim per level (2 levels here)."""
    cluster = load_cluster("h100-4x8-ib")
    results = {}
    for space in ("full", "hierarchical"):
        job = _job(space)
        graph = capture_job(job)
        results[space] = plan_devices(graph, job, cluster, 16)
    hier, full = results["hierarchical"], results["full"]
    for plan in hier.plans:
        for label in plan.ops.values():
            assert len(parse_label(label)) <= 2, label
    assert full.plans[0].time_s <= hier.plans[0].time_s * (1 + 1e-9)
    assert min(p.memory_bytes for p in full.plans) <= min(p.memory_bytes for p in hier.plans) * (1 + 1e-9)
