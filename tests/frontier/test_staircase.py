"""The compiled staircase merge (frontier.staircase) equals a plain enumerate-and-prune.

Random grouped tables with integer costs (many exact ties and duplicate sums, the hard case
for the slice tests), 1-3 tables, with and without a dropped variable.
"""

from __future__ import annotations

import numpy as np
import pytest

from frontier import staircase
from frontier.pareto import pareto_select


def _random_table(rng, n_groups: int, max_rows: int, scale: int):
    """Grouped staircases (x ascending, y strictly descending) with small integer costs."""
    costs, counts = [], []
    for _ in range(n_groups):
        pts = rng.integers(0, scale, size=(rng.integers(0, max_rows + 1), 2)).astype(float)
        keep = pareto_select(pts) if len(pts) else np.empty(0, dtype=np.int64)
        costs.append(pts[keep])
        counts.append(len(keep))
    start = np.r_[0, np.cumsum(counts)].astype(np.int64)
    return np.concatenate(costs) if costs else np.zeros((0, 2)), start


def _plain(costs, starts, groups, n_out, width):
    """Every sum of one row per table, for every joint configuration, then one prune."""
    xs, cands, rows = [], [], []
    for x in range(n_out * width):
        parts = [np.arange(s[g[x]], s[g[x] + 1]) for s, g in zip(starts, groups)]
        if any(len(p) == 0 for p in parts):
            continue
        mesh = np.stack(np.meshgrid(*parts, indexing="ij"), -1).reshape(-1, len(parts))
        cands.append(sum(c[mesh[:, i]] for i, c in enumerate(costs)))
        xs.append(np.full(len(mesh), x))
        rows.append(mesh)
    if not cands:
        return np.zeros((0, 2)), np.zeros(0, dtype=np.int64)
    x = np.concatenate(xs)
    cost = np.concatenate(cands)
    keep = pareto_select(cost, x // width)
    return cost[keep], (x // width)[keep]


@pytest.mark.parametrize("seed", range(40))
def test_compiled_merge_equals_enumeration(seed):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 4))
    n_out, width = int(rng.integers(1, 4)), int(rng.integers(1, 5))
    scale = int(rng.choice([4, 30, 1000]))
    tables = [_random_table(rng, int(rng.integers(1, 5)), max_rows=12, scale=scale) for _ in range(m)]
    costs = [t[0] for t in tables]
    starts = [t[1] for t in tables]
    groups = [rng.integers(0, len(s) - 1, size=n_out * width) for s in starts]
    cost, group, rows, vals = staircase.sum_union_2d(costs, starts, groups, n_out, width)
    want_cost, want_group = _plain(costs, starts, groups, n_out, width)
    np.testing.assert_array_equal(group, want_group)
    np.testing.assert_array_equal(cost, want_cost)
    # back-pointers: each kept point is the sum of the rows it names, in the groups of its x
    x = group * width + vals
    assert ((vals >= 0) & (vals < width)).all()
    rebuilt = sum(c[rows[:, i]] for i, c in enumerate(costs))
    np.testing.assert_array_equal(rebuilt, cost)
    for i, (s, g) in enumerate(zip(starts, groups)):
        assert ((rows[:, i] >= s[g[x]]) & (rows[:, i] < s[g[x] + 1])).all()


def test_many_copies_of_one_staircase_with_duplicate_sums():
    """A staircase summed with itself: every frontier point is reached many times."""
    xs = np.arange(300, dtype=float)
    a = np.stack([xs, 300.0 - xs], 1)  # 300 points on a line: all sums tie on x + y
    start = np.array([0, 300])
    cost, group, rows, vals = staircase.sum_union_2d([a, a], [start, start], [np.zeros(1, int)] * 2, 1, 1)
    assert cost.tolist() == [[float(s), 600.0 - s] for s in range(599)]
    assert (rows.sum(axis=1) == cost[:, 0]).all()


def test_threaded_ranges_equal_one_thread(monkeypatch):
    """Output groups split over threads give the same arrays as one pass."""
    rng = np.random.default_rng(7)
    cost, start = _random_table(rng, 24, max_rows=40, scale=1000)
    groups = [np.arange(24), rng.permutation(24)]
    monkeypatch.setattr(staircase, "PARALLEL_MIN_CANDIDATES", 0)
    monkeypatch.setenv("TENSOROPT_THREADS", "3")
    threaded = staircase.sum_union_2d([cost, cost], [start, start], groups, 24, 1, work=1.0)
    monkeypatch.setenv("TENSOROPT_THREADS", "1")
    single = staircase.sum_union_2d([cost, cost], [start, start], groups, 24, 1, work=1.0)
    for a, b in zip(threaded, single):
        np.testing.assert_array_equal(a, b)
    assert len(single[0]) > 24
