"""The preprocessing's row kernels against their definitions (random small matrices, ties and inf).

``_undominated_rows`` (:mod:`frontier.dominance`) against a pair-by-pair check of the definition: a
row is dropped when another row is ``<=`` it everywhere and ``<`` somewhere, or equal and earlier.
``equal_rows`` (:mod:`frontier.classes`) against ``np.unique(axis=0)``'s classes renumbered by
first member, ``-0.0`` and ``0.0`` equal.
"""

from __future__ import annotations

import numpy as np
import pytest

from frontier.classes import equal_rows
from frontier.dominance import _undominated_rows


def _matrices(seed: int, count: int = 300):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        m, width = int(rng.integers(1, 12)), int(rng.integers(1, 7))
        rows = rng.integers(0, 3, size=(m, width)).astype(float)
        if rng.random() < 0.3:
            rows[rng.random(rows.shape) < 0.2] = np.inf
        if rng.random() < 0.3:  # repeated rows: ties broken by position
            rows = np.concatenate([rows, rows[: max(1, m // 2)]])
        yield rows


def _undominated_by_definition(rows: np.ndarray) -> list[bool]:
    m = len(rows)
    out = []
    for j in range(m):
        beaten = False
        for i in range(m):
            if i == j or not (rows[i] <= rows[j]).all():
                continue
            if (rows[i] < rows[j]).any() or i < j:
                beaten = True
        out.append(not beaten)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_undominated_rows_follow_the_definition(seed):
    for rows in _matrices(seed):
        assert _undominated_rows(rows).tolist() == _undominated_by_definition(rows)


@pytest.mark.parametrize("first_columns", [1, 3])
def test_undominated_rows_on_wide_rows_compared_slice_by_slice(monkeypatch, first_columns):
    """Rows wider than the first slices (a node's edges to many configurations), with the block
    options' pattern of +inf between options: the pairs left after each slice give the definition."""
    import frontier.dominance as dominance

    monkeypatch.setattr(dominance, "FIRST_COLUMNS", first_columns)
    rng = np.random.default_rng(7)
    for _ in range(60):
        m, width = int(rng.integers(2, 16)), int(rng.integers(8, 80))
        rows = rng.integers(0, 2, size=(m, width)).astype(float)
        option = rng.integers(0, 3, size=m)
        rows[:, 2:] = np.where(option[:, None] == rng.integers(0, 3, size=width - 2)[None, :], rows[:, 2:],
                               np.inf)
        if rng.random() < 0.5:
            rows = np.concatenate([rows, rows[: m // 2]])
        assert _undominated_rows(rows).tolist() == _undominated_by_definition(rows)


@pytest.mark.parametrize("seed", [3, 4])
def test_equal_rows_are_numpy_unique_by_first_member(seed):
    for rows in _matrices(seed):
        rows = np.where(np.random.default_rng(seed).random(rows.shape) < 0.1, -0.0, rows)
        rep, cls = equal_rows(rows)
        _, first, inverse = np.unique(rows + 0.0, axis=0, return_index=True, return_inverse=True)
        rank = np.empty(len(first), dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(first))
        assert rep.tolist() == sorted(first.tolist())
        assert cls.tolist() == rank[np.asarray(inverse).reshape(-1)].tolist()
        assert all((rows[i] == rows[rep[cls[i]]]).all() for i in range(len(rows)))
