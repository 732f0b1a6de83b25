"""The selector on synthetic frontiers, checked against brute force over every plan."""

from __future__ import annotations

import numpy as np
import pytest

from tensoropt.selector import DeviceCountNotPlanned, NoFeasiblePlan, select


def all_plans(ff, max_devices=None):
    return [(f, p) for f in ff.frontiers for p in f.plans if max_devices is None or f.devices <= max_devices]


@pytest.mark.parametrize("seed", range(5))
def test_fastest_is_the_fastest_plan_under_the_budget(make_frontier_file, seed):
    ff = make_frontier_file(seed=seed)
    rng = np.random.default_rng(seed)
    for devices in (2, 4, 8):
        mems = [p.memory_bytes for p in ff.frontier(devices).plans]
        for budget in rng.uniform(min(mems), max(mems) * 1.1, 20):
            chosen = select(ff, memory_budget_bytes=budget, devices=devices).plan
            feasible = [p for p in ff.frontier(devices).plans if p.memory_bytes <= budget]
            assert chosen.memory_bytes <= budget
            assert chosen.time_s == min(p.time_s for p in feasible)
            assert chosen in ff.frontier(devices).plans


@pytest.mark.parametrize("seed", range(5))
def test_tightening_the_budget_never_selects_a_faster_plan(make_frontier_file, seed):
    ff = make_frontier_file(seed=seed, plans_per_frontier=12)
    frontier = ff.frontier(8)
    budgets = sorted(
        {p.memory_bytes for p in frontier.plans} | {p.memory_bytes * 1.01 for p in frontier.plans},
        reverse=True,
    )
    previous = None
    for budget in budgets:
        plan = select(ff, memory_budget_bytes=budget, devices=8).plan
        if previous is not None:
            assert plan.time_s >= previous.time_s
        previous = plan


def test_infeasible_budget_names_least_memory_and_fitting_device_count(make_frontier_file):
    ff = make_frontier_file()
    smallest_on_2 = min(p.memory_bytes for p in ff.frontier(2).plans)
    budget = min(p.memory_bytes for p in ff.frontier(8).plans)
    assert budget < smallest_on_2
    with pytest.raises(NoFeasiblePlan) as info:
        select(ff, memory_budget_bytes=budget, devices=2)
    err = info.value
    assert err.min_memory_bytes == smallest_on_2
    expected_fit = min(f.devices for f in ff.frontiers if any(p.memory_bytes <= budget for p in f.plans))
    assert err.fitting_devices == expected_fit and expected_fit > 2
    assert f"{smallest_on_2:.0f} bytes" in str(err)
    assert f"--devices {expected_fit}" in str(err)


def test_infeasible_everywhere_says_no_count_fits(make_frontier_file):
    ff = make_frontier_file()
    with pytest.raises(NoFeasiblePlan, match="No planned device count fits") as info:
        select(ff, memory_budget_bytes=1.0, devices=8)
    assert info.value.fitting_devices is None


def test_max_time_limit(make_frontier_file):
    ff = make_frontier_file(seed=3)
    frontier = ff.frontier(4)
    limit = sorted(p.time_s for p in frontier.plans)[2]
    chosen = select(ff, memory_budget_bytes=None, devices=4, max_time_s=limit).plan
    assert chosen.time_s <= limit and chosen.time_s == frontier.plans[0].time_s
    with pytest.raises(NoFeasiblePlan, match="s per step"):
        select(
            ff,
            memory_budget_bytes=min(p.memory_bytes for p in frontier.plans),
            devices=4,
            max_time_s=frontier.plans[0].time_s * 0.5,
        )


@pytest.mark.parametrize("seed", range(3))
def test_fewest_devices_and_best_per_device_match_brute_force(make_frontier_file, seed):
    ff = make_frontier_file(seed=seed)
    budget = float(np.median([p.memory_bytes for _, p in all_plans(ff)]))
    for cap in (None, 4, 8):
        feasible = [(f, p) for f, p in all_plans(ff, cap) if p.memory_bytes <= budget]
        got = select(ff, memory_budget_bytes=budget, devices=cap, rule="fewest_devices")
        fewest = min(f.devices for f, _ in feasible)
        assert got.frontier.devices == fewest
        assert got.plan.time_s == min(p.time_s for f, p in feasible if f.devices == fewest)
        got = select(ff, memory_budget_bytes=budget, devices=cap, rule="best_per_device")
        best = min(p.time_s * f.devices for f, p in feasible)
        assert got.plan.time_s * got.frontier.devices == best


def test_fastest_over_all_counts_when_devices_not_given(make_frontier_file):
    ff = make_frontier_file(seed=1)
    got = select(ff, memory_budget_bytes=None)
    assert got.plan.time_s == min(p.time_s for _, p in all_plans(ff))


def test_unplanned_device_count_and_unknown_rule(make_frontier_file):
    ff = make_frontier_file()
    with pytest.raises(DeviceCountNotPlanned, match=r"no frontier for 3 devices.*planned: 1, 2, 4, 8"):
        select(ff, memory_budget_bytes=None, devices=3)
    with pytest.raises(ValueError, match="unknown selection rule"):
        select(ff, rule="cheapest")


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("epsilon", [0.0, 0.01, 0.1])
def test_thinning_keeps_a_cover_within_epsilon(seed, epsilon):
    from types import SimpleNamespace

    from tensoropt.planner import thin_frontier

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 200))
    times = np.sort(rng.uniform(0.01, 1.0, n))
    mems = np.sort(rng.uniform(1e6, 1e9, n))[::-1]
    points = [SimpleNamespace(cost=np.array([t, m])) for t, m in zip(times, mems)]
    kept = thin_frontier(points, epsilon)
    assert kept[0] is points[0] and all(any(k is p for p in points) for k in kept)
    if epsilon == 0:
        assert kept == points
    for p in points:
        assert any(
            k.cost[0] <= p.cost[0] * (1 + epsilon) and k.cost[1] <= p.cost[1] * (1 + epsilon) for k in kept
        )
    # the leanest plan is kept too; no two other kept points are within epsilon of each other in
    # memory: the cover keeps no redundant plan
    assert kept[-1] is points[-1]
    for a, b in zip(kept, kept[1:-1]):
        assert b.cost[1] * (1 + epsilon) < a.cost[1] or epsilon == 0
