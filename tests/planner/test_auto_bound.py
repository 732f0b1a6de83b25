"""`planner.epsilon: auto` on a large solve: boxed eliminations and the cover, one honest bound."""

from __future__ import annotations

import pytest

import tensoropt.planner as planner
from tensoropt.config import Job
from tensoropt.planner import plan_job


def _job(epsilon) -> Job:
    return Job.from_dict({
        "model": {"name": "gpt", "kwargs": {"layers": 2, "width": 32, "heads": 2}, "seq_len": 16,
                  "vocab_size": 64},
        "training": {"global_batch_size": 8, "optimizer": "adamw", "memory_options": ["recompute"]},
        "cluster": "cpu-local", "devices": [2, 4], "planner": {"epsilon": epsilon, "max_plans": 6},
    })


def test_the_printed_bound_covers_both_the_boxing_and_the_thinning(monkeypatch):
    exact = plan_job(_job(0))
    # box every elimination coarsely, as a solve past the threshold would be
    monkeypatch.setattr(planner, "AUTO_BOX_MIN_CANDIDATES", 0)
    monkeypatch.setattr(planner, "AUTO_STEP_EPSILON", 0.05)
    auto = plan_job(_job("auto"))
    for full, thin in zip(exact.frontiers, auto.frontiers):
        assert len(thin.plans) <= 6 < len(full.plans)
        bound = thin.epsilon_bound
        assert 0 < bound
        for p in full.plans:
            assert any(q.time_s <= p.time_s * (1 + bound) * (1 + 1e-9)
                       and q.memory_bytes <= p.memory_bytes * (1 + bound) + 1 for q in thin.plans)


def test_a_solve_below_the_threshold_is_exact_before_the_cover(monkeypatch):
    """No elimination past the threshold: nothing is boxed, and a cover that keeps every plan
    leaves the exact frontier with bound 0."""
    monkeypatch.setattr(planner, "AUTO_BOX_MIN_CANDIDATES", 1e15)
    exact = plan_job(_job(0))
    auto = plan_job(Job.from_dict({**_job("auto").to_dict(), "planner": {"max_plans": 10_000}}))
    for full, thin in zip(exact.frontiers, auto.frontiers):
        assert thin.epsilon_bound == 0
        assert [p.time_s for p in thin.plans] == pytest.approx([p.time_s for p in full.plans], rel=1e-12)
