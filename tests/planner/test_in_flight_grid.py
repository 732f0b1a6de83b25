"""Middle pipeline stages re-priced from their neighbouring in-flight counts (issue 27): the computed
bound holds against every plan (random plan sets, brute force; against the exact stage frontier of
HF Llama: tests/planner/test_pipeline_chain.py); ``auto``'s stage counts on a multi-node cluster."""

from __future__ import annotations

import numpy as np
import pytest

from frontier.pareto import pareto_select
from tensoropt.pipeline.in_flight_grid import brackets, in_flight_grid, neighbours, reprice_bound


def _covered(points, by, factor):
    """Every row of ``points`` is weakly dominated by a row of ``by`` scaled down by ``factor``."""
    return all(((by[:, 0] <= factor * p[0]) & (by[:, 1] <= factor * p[1])).any() for p in points)


def _cover_bound(points, kept):
    """The least ``e``: every row of ``points`` within ``1 + e`` of a row of ``kept`` (by definition)."""
    return max(max(0.0, min(max(q[0] / p[0], q[1] / p[1]) - 1.0 for q in kept)) for p in points)


def _at(plans, k):
    """(time, state + k x activations) of plans given as rows (time, state, activations)."""
    return np.stack([plans[:, 0], plans[:, 1] + k * plans[:, 2]], axis=1)


@pytest.mark.parametrize("seed", range(40))
def test_the_computed_bound_holds_for_every_plan(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 60))
    plans = np.stack([rng.integers(1, 20, n), rng.integers(1, 30, n), rng.integers(0, 10, n)], axis=1)
    plans = plans.astype(float) * (1.0 if seed % 2 else rng.uniform(0.5, 2.0, (n, 3)))  # ties on half
    plans[:, 0] = np.maximum(plans[:, 0], 0.5)
    k1, k2 = sorted(rng.choice([1, 2, 4, 8], 2, replace=False))
    k = int(rng.integers(k1, k2 + 1))
    low, high = _at(plans, k1), _at(plans, k2)
    # what the solve keeps: the exact frontier, or a thinned part of it (a cover with its bound)
    thin = seed % 3
    kept_low, kept_high = low[pareto_select(low)], high[pareto_select(high)]
    b_low = b_high = 0.0
    if thin:
        kept_low, kept_high = kept_low[::2], kept_high[::2]
        b_low, b_high = _cover_bound(low, kept_low), _cover_bound(high, kept_high)
    # the options at k: the plans behind the kept points (some of them), re-priced at k
    rows = [i for i in range(n) if any((low[i] == q).all() for q in kept_low)
            or any((high[i] == q).all() for q in kept_high)]
    if thin == 2 and len(rows) > 1:
        rows = rows[1:]  # one plan dropped: the bound must grow or stay, never be wrong
    options = _at(plans[rows], k)
    lam = (k2 - k) / (k2 - k1)
    beta = reprice_bound(kept_low, kept_high, b_low, b_high, lam, options)
    assert beta >= 0.0
    if np.isfinite(beta):
        assert _covered(_at(plans, k), options, 1 + beta + 1e-9), (beta, k1, k, k2)
    if k in (k1, k2) and not thin:  # the exact frontier at an end re-priced at that end: exact
        assert beta == pytest.approx(0.0, abs=1e-12)


def test_the_bound_is_zero_where_the_ends_agree_and_the_gap_where_they_do_not():
    # rows (time, state, activations); all at time 1
    plans = np.array([[1.0, 0.0, 10.0], [1.0, 40.0, 0.0], [1.0, 14.0, 4.0]])
    low, high = _at(plans, 1), _at(plans, 4)  # best: 10 (plan 0) at k = 1, 30 (plan 2) at k = 4
    kept_low, kept_high = low[pareto_select(low)], high[pareto_select(high)]
    lam = (4 - 2) / 3
    # offered at k = 2: plans 0 and 1 (20, 40); the lower bound is 2/3 x 10 + 1/3 x 30 = 16.67
    beta = reprice_bound(kept_low, kept_high, 0.0, 0.0, lam, _at(plans[:2], 2))
    assert beta == pytest.approx(20 / (50 / 3) - 1)
    assert _covered(_at(plans, 2), _at(plans[:2], 2), 1 + beta + 1e-12)
    # one plan best at both ends: re-pricing it is exact
    plans = np.array([[1.0, 5.0, 1.0], [1.0, 40.0, 0.0], [2.0, 1.0, 1.0]])
    low, high = _at(plans, 1), _at(plans, 4)
    beta = reprice_bound(low[pareto_select(low)], high[pareto_select(high)], 0.0, 0.0, lam,
                         _at(plans[[0, 2]], 2))
    assert beta == pytest.approx(0.0, abs=1e-12)
    # the fast plan not offered: the bound is the time it costs (2 against 1)
    assert reprice_bound(low[pareto_select(low)], high[pareto_select(high)], 0.0, 0.0, lam,
                         _at(plans[[2]], 2)) == pytest.approx(1.0)


def test_grid_and_neighbours():
    assert in_flight_grid(8) == [1, 2, 4, 8] and in_flight_grid(4) == [1, 2, 4]
    assert in_flight_grid(3) == [1, 2, 3]
    assert [neighbours(k, in_flight_grid(8)) for k in range(1, 9)] == [
        None, None, (2, 4), None, (4, 8), (4, 8), (4, 8), None]
    assert [brackets(k, 8) for k in range(1, 9)] == [
        [], [(1, 8)], [(1, 8), (2, 4)], [(1, 8)], [(1, 8), (4, 8)], [(1, 8), (4, 8)], [(1, 8), (4, 8)], []]
    assert brackets(3, 4) == [(1, 4), (2, 4)] and brackets(2, 4) == [(1, 4)]


def test_auto_proposes_whole_nodes_per_stage_beyond_one_node():
    from estimators.profiles import load_cluster
    from tensoropt.config import Job
    from tensoropt.planner import auto_stage_counts, pipeline_candidates

    cluster = load_cluster("h100-128x8-ib")
    job = Job.from_dict({"model": {"name": "mlp"}, "cluster": "h100-128x8-ib",
                         "devices": [8, 16, 32, 64, 512], "training": {"global_batch_size": 64},
                         "planner": {"pipeline": "auto"}})
    got = {d: pipeline_candidates(job, d, cluster, True) for d in (8, 16, 32, 64, 512)}
    assert got[8] == []  # one node, a plan fits: no pipeline
    assert [p for p, _, _ in got[16]] == [2] and [p for p, _, _ in got[32]] == [2, 4]
    assert [p for p, _, _ in got[64]] == [2, 4, 8] and [p for p, _, _ in got[512]] == [2, 4, 8]
    assert {m for c in got.values() for _, _, m in c} == {16}  # one micro-batch count for every count
    assert all(d // p % 8 == 0 for d, c in got.items() for p, _, _ in c)  # stages of whole nodes
    # no plan fits the budget: every stage count dividing the devices, within a node too
    assert [p for p, _, _ in pipeline_candidates(job, 16, cluster, False)] == [2, 4, 8]
    assert [p for p, _, _ in pipeline_candidates(job, 8, cluster, False)] == [2, 4, 8]
    assert auto_stage_counts(24, 8, 64) == [] and auto_stage_counts(24, 8, 64, whole_nodes=False) == [2, 4, 8]
    # an explicit request still gets every stage count it asks for
    explicit = Job.from_dict({"model": {"name": "mlp"}, "cluster": "h100-128x8-ib", "devices": [16],
                              "training": {"global_batch_size": 64},
                              "planner": {"pipeline": {"stages": [8]}}})
    assert [p for p, _, _ in pipeline_candidates(explicit, 16, cluster, True)] == [8]

