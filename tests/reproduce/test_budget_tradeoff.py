"""As the memory budget shrinks, the selected plans trade time for memory monotonically.

Runs the planner's own path (capture on meta -> plan_devices -> selector.select) for AlexNet on
8 V100s (32 images per GPU) and the zoo's 4-layer GPT on 8 H100s (16 sequences of 256 tokens),
sweeping the budget from the fastest plan's memory down to the leanest plan's.
"""

from __future__ import annotations

import numpy as np
import pytest
from reproduce_baselines import capture_zoo

from tensoropt.planner import plan_devices
from tensoropt.plans import FrontierFile
from tensoropt.selector import NoFeasiblePlan, select

CASES = [("alexnet", "v100-16x1-25gbe", 8, 256), ("gpt", "h100x8", 8, 16)]


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def planned(request):
    name, cluster_name, devices, batch = request.param
    graph, job, cluster = capture_zoo(name, cluster_name, devices, batch)
    frontier = plan_devices(graph, job, cluster, devices)
    return FrontierFile(job=job.to_dict(), frontiers=[frontier]), frontier


def test_frontier_trades_time_for_memory(planned):
    _, frontier = planned
    times = np.array([p.time_s for p in frontier.plans])
    memory = np.array([p.memory_bytes for p in frontier.plans])
    assert len(frontier.plans) >= 3
    assert (np.diff(times) >= 0).all() and (np.diff(memory) < 0).all()
    assert memory[0] / memory[-1] > 1.2, "the frontier offers no real memory saving"


def test_shrinking_budget_selects_slower_leaner_plans(planned):
    file, frontier = planned
    # a budget is met at a plan's peak (its memory + its largest transient: tensoropt.selector)
    lo = min(p.peak_memory_bytes for p in frontier.plans)
    hi = frontier.plans[0].peak_memory_bytes
    previous = None
    for budget in np.linspace(hi, lo, 25):  # the rule alone (no margin: tensoropt.selector)
        chosen = select(file, memory_budget_bytes=float(budget), devices=frontier.devices, margin=None).plan
        assert chosen.peak_memory_bytes <= budget
        fits = [p for p in frontier.plans if p.peak_memory_bytes <= budget]
        assert chosen.time_s == min(p.time_s for p in fits)
        if previous is not None:
            assert chosen.time_s >= previous.time_s and chosen.memory_bytes <= previous.memory_bytes
        previous = chosen
    assert previous.time_s > frontier.plans[0].time_s
    with pytest.raises(NoFeasiblePlan):
        select(file, memory_budget_bytes=lo * 0.99, devices=frontier.devices)
