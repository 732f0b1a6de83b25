"""The pipeline DP (frontier/pipeline.py) against enumeration of every partition, micro-batch count
and stage plan on small chains; its epsilon bound; its errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from frontier.pareto import pareto_select
from frontier.pipeline import bubble_fraction, pipeline_frontier, step_time_s


def _random_options(seed: int, num_blocks: int, num_stages: int, max_options: int = 4, ties: bool = False):
    """A table of stage options per (stage, first, last): random, with sizes growing with the range."""
    rng = np.random.default_rng(seed)
    table = {}
    for s in range(num_stages):
        for f in range(num_blocks):
            for last in range(f, num_blocks):
                n = rng.integers(0 if rng.random() < 0.1 else 1, max_options + 1)
                rows = rng.random((n, 3)) * (last - f + 1)
                if ties:
                    rows = np.round(rows * 2) / 2
                table[s, f, last] = rows
    return table


def _brute_force(table, num_blocks, num_stages, m, sizes=None):
    """Every partition, every option per stage: the 2-D Pareto set of (T, M) as a sorted list."""
    costs = []
    for cuts in itertools.combinations(range(1, num_blocks), num_stages - 1):
        bounds = [0, *cuts, num_blocks]
        ranges = [(bounds[i], bounds[i + 1] - 1) for i in range(num_stages)]
        if sizes is not None and any(b - a + 1 not in sizes(s) for s, (a, b) in enumerate(ranges)):
            continue
        option_lists = [table[s, a, b] for s, (a, b) in enumerate(ranges)]
        for choice in itertools.product(*[range(len(o)) for o in option_lists]):
            rows = np.array([option_lists[s][c] for s, c in enumerate(choice)])
            t = step_time_s(rows[:, 0].max(), rows[:, 0].sum(), rows[:, 1].max(), m)
            costs.append((t, rows[:, 2].max()))
    if not costs:
        return []
    costs = np.array(costs)
    return sorted(map(tuple, np.round(costs[pareto_select(costs)], 9)))


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("num_blocks,num_stages", [(3, 1), (4, 2), (5, 3), (6, 3), (6, 4)])
def test_dp_equals_brute_force(seed, num_blocks, num_stages):
    table = _random_options(seed, num_blocks, num_stages, ties=seed % 3 == 0)
    for m in (1, 2, 5):
        calls = []

        def options(s, f, last, calls=calls):
            calls.append((s, f, last))
            return table[s, f, last]

        result = pipeline_frontier(num_blocks, num_stages, m, options)
        got = sorted((round(p.time_s, 9), round(p.memory_bytes, 9)) for p in result.points)
        assert got == _brute_force(table, num_blocks, num_stages, m)
        assert result.bound == 0.0
        for p in result.points:  # each point's partition and options reach its cost
            rows = np.array([table[s, a, b][o] for s, ((a, b), o) in enumerate(zip(p.blocks, p.options))])
            assert p.blocks[0][0] == 0 and p.blocks[-1][1] == num_blocks - 1
            assert all(p.blocks[i][1] + 1 == p.blocks[i + 1][0] for i in range(num_stages - 1))
            assert p.time_s == pytest.approx(step_time_s(rows[:, 0].max(), rows[:, 0].sum(),
                                                         rows[:, 1].max(), m))
            assert p.memory_bytes == pytest.approx(rows[:, 2].max())
        assert len(set(calls)) == len(calls)  # each (stage, range) asked once


def test_stage_sizes_restrict_the_partitions():
    table = _random_options(7, 7, 3)
    sizes = lambda s: [2, 3]  # noqa: E731
    result = pipeline_frontier(7, 3, 4, lambda s, f, last: table[s, f, last], stage_sizes=sizes)
    got = sorted((round(p.time_s, 9), round(p.memory_bytes, 9)) for p in result.points)
    assert got == _brute_force(table, 7, 3, 4, sizes)
    assert all(b - a + 1 in (2, 3) for p in result.points for a, b in p.blocks)


@pytest.mark.parametrize("seed", range(6))
def test_epsilon_covers_the_exact_frontier_within_its_bound(seed):
    table = _random_options(100 + seed, 6, 3, max_options=6)
    options = lambda s, f, last: table[s, f, last]  # noqa: E731
    exact = pipeline_frontier(6, 3, 4, options)
    approx = pipeline_frontier(6, 3, 4, options, epsilon=0.05)
    assert approx.bound == pytest.approx(1.05 ** 3 - 1)
    kept = np.array([(p.time_s, p.memory_bytes) for p in approx.points])
    for p in exact.points:
        assert ((kept <= np.array([p.time_s, p.memory_bytes]) * (1 + approx.bound) + 1e-12).all(axis=1)).any()


def test_unbalanced_memory_favours_fewer_blocks_early():
    # stage s keeps (p - s) micro-batches of activations: the leanest plan puts fewer blocks first
    def options(s, f, last):
        n = last - f + 1
        return np.array([[n, 0.0, n * (3 - s)]])

    points = pipeline_frontier(6, 3, 6, options).points
    leanest = min(points, key=lambda p: p.memory_bytes)
    fastest = min(points, key=lambda p: p.time_s)
    assert fastest.blocks == [(0, 1), (2, 3), (4, 5)]
    sizes = [b - a + 1 for a, b in leanest.blocks]
    assert sizes[0] < sizes[-1] and leanest.memory_bytes < fastest.memory_bytes


def test_errors_and_formulas():
    with pytest.raises(ValueError, match="3 blocks into 4 stages"):
        pipeline_frontier(3, 4, 4, lambda *a: np.zeros((1, 3)))
    with pytest.raises(ValueError, match="micro_batches"):
        pipeline_frontier(3, 2, 0, lambda *a: np.zeros((1, 3)))
    assert pipeline_frontier(3, 2, 2, lambda *a: np.zeros((0, 3))).points == []
    assert bubble_fraction(1.0, 4.0, 8) == pytest.approx(3 / 11)
    assert bubble_fraction(1.0, 1.0, 8) == 0.0
