"""The interleaved pipeline DP (frontier/pipeline_interleaved.py) against enumeration of every cut
into virtual stages and every option per virtual stage on small chains; v = 1 against the plain DP."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from frontier.pareto import pareto_select
from frontier.pipeline import pipeline_frontier
from frontier.pipeline_interleaved import interleaved_frontier, interleaved_step_time_s


def _random_options(seed: int, num_blocks: int, num_virtual: int, max_options: int = 3, ties: bool = False):
    rng = np.random.default_rng(seed)
    table = {}
    for s in range(num_virtual):
        for f in range(num_blocks):
            for last in range(f, num_blocks):
                n = rng.integers(0 if rng.random() < 0.1 else 1, max_options + 1)
                rows = rng.random((n, 3)) * (last - f + 1)
                table[s, f, last] = np.round(rows * 2) / 2 if ties else rows
    return table


def _cost(rows: np.ndarray, num_ranks: int, chunks: int, m: int) -> tuple[float, float]:
    """(T, M) of one plan straight from the definition: each rank sums its virtual stages."""
    rank_of = np.arange(len(rows)) % num_ranks
    tau = np.array([rows[rank_of == r, 0].sum() for r in range(num_ranks)])
    d = np.array([rows[rank_of == r, 1].sum() for r in range(num_ranks)])
    w = np.array([rows[rank_of == r, 2].sum() for r in range(num_ranks)])
    return interleaved_step_time_s(tau.max(), rows[:, 0].sum(), d.max(), m, chunks), float(w.max())


def _brute_force(table, num_blocks, num_ranks, chunks, m):
    n_virtual = num_ranks * chunks
    costs = []
    for cuts in itertools.combinations(range(1, num_blocks), n_virtual - 1):
        bounds = [0, *cuts, num_blocks]
        lists = [table[s, bounds[s], bounds[s + 1] - 1] for s in range(n_virtual)]
        for choice in itertools.product(*[range(len(o)) for o in lists]):
            costs.append(_cost(np.array([lists[s][c] for s, c in enumerate(choice)]), num_ranks, chunks, m))
    if not costs:
        return []
    costs = np.array(costs)
    return sorted(map(tuple, np.round(costs[pareto_select(costs)], 9)))


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("num_blocks,num_ranks,chunks",
                         [(4, 2, 2), (5, 2, 2), (6, 2, 2), (7, 3, 2), (6, 2, 3)])
def test_interleaved_dp_equals_brute_force(seed, num_blocks, num_ranks, chunks):
    table = _random_options(seed, num_blocks, num_ranks * chunks, ties=seed % 3 == 0)
    for m in (1, 2, 4):
        result = interleaved_frontier(num_blocks, num_ranks, m, lambda s, f, last: table[s, f, last], chunks)
        got = sorted((round(p.time_s, 9), round(p.memory_bytes, 9)) for p in result.points)
        assert got == _brute_force(table, num_blocks, num_ranks, chunks, m)
        assert result.bound == 0.0
        for p in result.points:  # each point's cuts and options reach its cost
            assert len(p.blocks) == num_ranks * chunks and p.blocks[0][0] == 0
            assert p.blocks[-1][1] == num_blocks - 1
            assert all(p.blocks[i][1] + 1 == p.blocks[i + 1][0] for i in range(len(p.blocks) - 1))
            rows = np.array([table[s, a, b][o] for s, ((a, b), o) in enumerate(zip(p.blocks, p.options))])
            assert (p.time_s, p.memory_bytes) == pytest.approx(_cost(rows, num_ranks, chunks, m))


@pytest.mark.parametrize("seed", range(6))
def test_one_chunk_per_rank_is_the_plain_pipeline_dp(seed):
    table = _random_options(50 + seed, 6, 3)
    options = lambda s, f, last: table[s, f, last]  # noqa: E731
    for m in (3, 5):
        plain = pipeline_frontier(6, 3, m, options)
        one = interleaved_frontier(6, 3, m, options, chunks=1)
        assert [(round(p.time_s, 9), p.memory_bytes, p.blocks) for p in plain.points] == \
               [(round(p.time_s, 9), p.memory_bytes, p.blocks) for p in one.points]


def test_balanced_stages_have_megatrons_bubble():
    # 8 identical blocks, 2 ranks x 2 chunks: each virtual stage 2 blocks; T = (m + (p - 1)/v) * t_rank
    def options(s, f, last):
        n = last - f + 1
        return np.array([[float(n), 0.0, float(n)]])

    for m in (2, 4, 8):
        fastest = interleaved_frontier(8, 2, m, options).points[0]
        assert fastest.time_s == pytest.approx((m + 1 / 2) * 4.0)  # t_rank = 4 blocks
        plain = pipeline_frontier(8, 2, m, options).points[0]
        assert plain.time_s == pytest.approx((m + 1) * 4.0)  # the 1F1B bubble is twice as long


def test_epsilon_bound_and_errors():
    table = _random_options(9, 6, 4, max_options=5)
    options = lambda s, f, last: table[s, f, last]  # noqa: E731
    exact = interleaved_frontier(6, 2, 4, options)
    approx = interleaved_frontier(6, 2, 4, options, epsilon=0.05)
    assert approx.bound == pytest.approx(1.05 ** 4 - 1)
    kept = np.array([(p.time_s, p.memory_bytes) for p in approx.points])
    for p in exact.points:
        assert ((kept <= np.array([p.time_s, p.memory_bytes]) * (1 + approx.bound) + 1e-12).all(axis=1)).any()
    with pytest.raises(ValueError, match="3 blocks into 4 virtual stages"):
        interleaved_frontier(3, 2, 4, options)
    with pytest.raises(ValueError, match="micro_batches"):
        interleaved_frontier(6, 2, 0, options)
