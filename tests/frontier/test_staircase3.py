"""The compiled three-objective merge (frontier.staircase3) equals enumerate-and-prune and the numpy
combine: the same Pareto set per group, one row per distinct vector, back-pointers that rebuild it.

Random grouped tables with small integer costs (many exact ties and duplicate sums), rows with an
infinite cost, 1-4 tables, with and without a dropped variable, and sets long enough to use the
skipped blocks of 4..4096 points.
"""

from __future__ import annotations

import numpy as np
import pytest
from frontier_graphs import cost_graphs
from hypothesis import HealthCheck, given, settings
from test_solve_vs_brute import _check_against_brute_force

import frontier.combine as combine
from frontier import staircase3
from frontier.combine import Combiner
from frontier.pareto import pareto_select
from frontier.table import Table


def _random_table(rng, n_groups: int, max_rows: int, scale: int, pareto: bool, inf_prob: float = 0.0):
    """Grouped sets of integer cost vectors: Pareto sets sorted as the combine makes them, or raw rows
    in any order (some with an infinite entry)."""
    costs, counts = [], []
    for _ in range(n_groups):
        pts = rng.integers(0, scale, size=(rng.integers(0, max_rows + 1), 3)).astype(float)
        if pareto:
            pts = pts[pareto_select(pts)] if len(pts) else pts
        elif len(pts):
            pts[rng.random(pts.shape) < inf_prob] = np.inf
        costs.append(pts)
        counts.append(len(pts))
    start = np.r_[0, np.cumsum(counts)].astype(np.int64)
    return np.concatenate(costs), start


def _plain(costs, starts, groups, n_out, width):
    """Every sum of one row per table, for every joint configuration, then one prune."""
    xs, cands = [], []
    for x in range(n_out * width):
        parts = [np.arange(s[g[x]], s[g[x] + 1]) for s, g in zip(starts, groups)]
        if any(len(p) == 0 for p in parts):
            continue
        mesh = np.stack(np.meshgrid(*parts, indexing="ij"), -1).reshape(-1, len(parts))
        cands.append(sum(c[mesh[:, i]] for i, c in enumerate(costs)))
        xs.append(np.full(len(mesh), x))
    if not cands:
        return np.zeros((0, 3)), np.zeros(0, dtype=np.int64)
    x = np.concatenate(xs)
    cost = np.concatenate(cands)
    keep = pareto_select(cost, x // width)
    return cost[keep], (x // width)[keep]


#: Both merges: the grid from any size, and the heap everywhere.
WAYS = [0, 1 << 62]


def _check(costs, starts, groups, n_out, width, grid_min):
    cost, group, rows, vals = staircase3.sum_union_3d(costs, starts, groups, n_out, width, grid_min=grid_min)
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
    return cost


@pytest.mark.parametrize("grid_min", WAYS)
@pytest.mark.parametrize("seed", range(60))
def test_compiled_merge_equals_enumeration(seed, grid_min):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 5))
    n_out, width = int(rng.integers(1, 4)), int(rng.integers(1, 5))
    scale = int(rng.choice([3, 12, 1000]))
    pareto = bool(seed % 3)  # a third of the cases: raw rows, unsorted, some infinite
    tables = [_random_table(rng, int(rng.integers(1, 5)), 14, scale, pareto, inf_prob=0.15)
              for _ in range(m)]
    costs, starts = [t[0] for t in tables], [t[1] for t in tables]
    groups = [rng.integers(0, len(s) - 1, size=n_out * width) for s in starts]
    _check(costs, starts, groups, n_out, width, grid_min)


@pytest.mark.parametrize("grid_min", WAYS)
@pytest.mark.parametrize("seed", range(4))
def test_long_sets_use_the_skipped_blocks(seed, grid_min):
    """Sets of hundreds to thousands of points (blocks of 4..4096 skipped whole, grids of up to
    hundreds of cells a side) with ties."""
    rng = np.random.default_rng(100 + seed)
    n = [300, 1500, 3000, 800][seed]
    # points near the plane x + y + z = 3n: large Pareto sets, many duplicate sums
    a = rng.integers(0, n, size=(4 * n, 2)).astype(float)
    a = np.c_[a, 3 * n - a.sum(axis=1) + rng.integers(0, 3, size=len(a))]
    a = a[pareto_select(a)]
    b = a[: max(2, len(a) // 100)] * 2.0
    b = b[pareto_select(b)]
    start_a, start_b = np.array([0, len(a)]), np.array([0, len(b)])
    got = _check([a, b], [start_a, start_b], [np.zeros(1, int)] * 2, 1, 1, grid_min)
    assert len(got) > len(b)


def _table(cost, start):
    return Table(scope=(0, 1), shape=(3, 4), cost=cost, start=start, digest=cost.tobytes()[:16] + b"x")


@pytest.mark.parametrize("seed", range(12))
def test_combiner_compiled_equals_numpy_path(seed, monkeypatch):
    """Combiner.combine with K = 3: the compiled kernel and the numpy path give the same tables
    (exact), and with a box factor the compiled result (1 + e)-covers the exact set."""
    rng = np.random.default_rng(seed)
    scale = [3, 50, 1000][seed % 3]
    t1 = _table(*_random_table(rng, 12, 10, scale, pareto=True))
    c2, s2 = _random_table(rng, 4 * 5, 10, scale, pareto=True)
    t2 = Table(scope=(1, 2), shape=(4, 5), cost=c2, start=s2, digest=c2.tobytes()[:16] + b"y")
    compiled = Combiner(sizes=[3, 4, 5], reuse=False).combine([t1, t2], drop=1)
    monkeypatch.setattr(combine, "COMPILED_KERNEL", False)
    numpy_path = Combiner(sizes=[3, 4, 5], reuse=False).combine([t1, t2], drop=1)
    np.testing.assert_array_equal(compiled.start, numpy_path.start)
    np.testing.assert_array_equal(compiled.cost, numpy_path.cost)
    monkeypatch.setattr(combine, "COMPILED_KERNEL", True)
    eps = 0.05
    boxed = Combiner(sizes=[3, 4, 5], reuse=False, box_eps=eps).combine([t1, t2], drop=1)
    assert boxed.depth == 1 and len(boxed.cost) <= len(compiled.cost)
    for g in range(len(compiled.start) - 1):
        exact = compiled.cost[compiled.start[g]:compiled.start[g + 1]]
        kept = boxed.cost[boxed.start[g]:boxed.start[g + 1]]
        assert len(kept) > 0 or len(exact) == 0
        for p in exact:
            assert ((kept <= (1 + eps) * p + 1e-12).all(axis=1)).any()


SETTINGS = dict(
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)


@settings(max_examples=80, **SETTINGS)
@given(G=cost_graphs(k=3, max_nodes=8, max_configs=4, integer=True))
def test_three_objective_solve_with_ties_matches_brute_force(G):
    """The FT solve on the compiled K = 3 kernel (the default) against brute force, integer costs."""
    _check_against_brute_force(G)


@settings(max_examples=40, **SETTINGS)
@given(G=cost_graphs(k=3))
def test_three_objective_numpy_path_matches_brute_force(monkeypatch, G):
    monkeypatch.setattr(combine, "COMPILED_KERNEL", False)
    _check_against_brute_force(G)
