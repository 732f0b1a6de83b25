"""Output groups copied instead of computed (:mod:`frontier.equal_slices`): the same tables, their own
back-pointers; against brute force through ``solve``: tests/frontier/test_block_options_vs_brute.py."""

from __future__ import annotations

import numpy as np
import pytest

from frontier import combine as combine_module
from frontier.combine import Combiner
from frontier.equal_slices import slice_classes, value_classes
from frontier.table import leaf_table


@pytest.fixture
def every_combine(monkeypatch):
    """Look for copies in every combine, however small (the solver skips those under 20 000
    candidates)."""
    monkeypatch.setattr(combine_module, "COPIES_MIN_CANDIDATES", 0)


def _tables(rng, sizes: list[int], duplicated: dict[int, tuple[int, int]]):
    """A node table over 1, edge tables (0, 1) and (1, 2) with random costs (some infinite), where
    variable ``v``'s value ``b`` copies value ``a``'s slices for ``v: (a, b)`` in ``duplicated``."""
    def table(scope):
        shape = tuple(sizes[v] for v in scope)
        cost = rng.integers(0, 6, size=shape + (2,)).astype(float)
        cost[rng.random(shape) < 0.2] = np.inf
        for v, (a, b) in duplicated.items():
            if v in scope:
                ax = scope.index(v)
                idx_a, idx_b = [slice(None)] * len(scope), [slice(None)] * len(scope)
                idx_a[ax], idx_b[ax] = a, b
                cost[tuple(idx_b)] = cost[tuple(idx_a)]
        return leaf_table(scope, cost)
    return [table((1,)), table((0, 1)), table((1, 2))]


@pytest.mark.parametrize("seed", range(6))
def test_a_combine_with_copied_groups_equals_the_full_combine(every_combine, seed):
    rng = np.random.default_rng(seed)
    sizes = [4, 5, 3]
    tables = _tables(rng, sizes, {0: (1, 3), 2: (0, 2)})
    # a sum of two one-point-per-group tables first: groups with several points, ties across values
    pair = Combiner(sizes=sizes, reuse=False, copies=False).combine(tables[:2], drop=None)
    exact = Combiner(sizes=sizes, reuse=False, copies=False).combine([pair, tables[2]], drop=1)
    fast = Combiner(sizes=sizes, reuse=False)
    copied = fast.combine([pair, tables[2]], drop=1)
    assert fast.stats.copied > 0
    np.testing.assert_array_equal(copied.start, exact.start)
    np.testing.assert_array_equal(copied.cost, exact.cost)
    # every copied point's back-pointers lead into its own groups, to points that sum to its cost
    for table in (copied, exact):
        group = np.repeat(np.arange(len(table.start) - 1), np.diff(table.start))
        value = {0: group // sizes[2], 2: group % sizes[2], 1: table.vals}
        total = np.zeros_like(table.cost)
        for i, child in enumerate(table.children):
            r = table.rows[:, i]
            want = np.zeros(len(r), dtype=np.int64)
            for v, n in zip(child.scope, child.shape):
                want = want * n + value[v]
            np.testing.assert_array_equal(np.searchsorted(child.start, r, side="right") - 1, want)
            total += child.cost[r]
        np.testing.assert_allclose(total, table.cost)


def test_slice_classes_tell_equal_slices_apart_from_equal_costs_in_other_groups():
    t = leaf_table((0, 1), np.array([[[1.0, 0.0], [2.0, 0.0]], [[2.0, 0.0], [1.0, 0.0]],
                                     [[1.0, 0.0], [2.0, 0.0]]]))
    assert slice_classes(t, 0).tolist() == [0, 1, 0]
    assert slice_classes(t, 1).tolist() == [0, 1]
    other = leaf_table((0,), np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0]]))
    assert value_classes([t, other], 0, {}).tolist() == [0, 1, 2]
