"""The exact time/memory frontier over pipeline partitions (one stage count, micro-batch count and
schedule at a time).

Formulation. A model is a chain of ``L`` blocks ``0 .. L-1`` (the embedding and the head count as
blocks). A pipeline of ``p`` stages cuts it into consecutive ranges ``[f_0, l_0], [f_1, l_1], ...,
[f_{p-1}, l_{p-1}]`` (``f_0 = 0``, ``f_{s+1} = l_s + 1``, ``l_{p-1} = L - 1``, every stage holds at
least one block). Stage ``s`` holding ``[f, l]`` has a set of *stage options* (its intra-operator
plans, each priced with the micro-batches ``k_s`` the schedule keeps in flight on it), each a
vector ``(t, d, w)``:

* ``t``: forward + backward time of one micro-batch on the stage, its sends and receives included;
* ``d``: the stage's once-per-step time (gradient synchronisation, optimizer step);
* ``w``: the stage's memory per device, ``k_s`` micro-batches of activations included.

With ``m`` micro-batches a plan (a partition and one option per stage) costs::

    T = (m - 1) * max_s t_s + sum_s t_s + max_s d_s          (step_time_s)
    M = max_s w_s                                            (memory per device)

(Mist's form of a 1F1B / GPipe step on unbalanced stages: the slowest stage paces the steady
state, the fill and drain pass through every stage once, the stages synchronise their gradients in
parallel at the end.) The answer is the Pareto set of ``(T, M)`` over all partitions and options.

The DP. ``F(s, j)`` is the Pareto set of partial vectors ``(max t, sum t, max d, max w)`` over the
first ``s`` stages holding blocks ``0 .. j-1``::

    F(0, 0) = {(0, 0, 0, 0)}
    F(s + 1, j') = prune U_{j < j'} U_{o in options(s, j, j'-1)}
                   {(max(a0, t_o), a1 + t_o, max(a2, d_o), max(a3, w_o)) : a in F(s, j)}

and the frontier is ``prune{(T(a), a3) : a in F(p, L)}`` with ``T(a) = (m - 1) a0 + a1 + a2``.
Exact: each coordinate combines by ``max`` or ``+``, both monotone, so if ``a`` dominates ``b`` in
``F(s, j)`` then every completion of ``a`` dominates the same completion of ``b``, and ``T`` and
``M`` are monotone in the coordinates: dropping dominated partial vectors loses no frontier point.
With ``epsilon > 0`` each ``F(s, j)`` first keeps one vector per ``(1 + epsilon)``-box of every
coordinate; a kept vector is within ``(1 + epsilon)`` of each dropped one in every coordinate, and
max / sum of inflated terms are inflated by the same factor, so after ``p`` stages every exact point
is within ``(1 + epsilon)^p`` of a returned one (:attr:`PipelineResult.bound`).

Where each term lives: the stage options come from the caller (tensoropt solves each stage's
intra-operator frontier with the FT solver); the DP is :func:`pipeline_frontier`; ``T`` is
:func:`step_time_s`; the bubble is :func:`bubble_fraction`; the check against enumeration is
``tests/frontier/test_pipeline.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from frontier.pareto import pareto_select

__all__ = ["PipelinePoint", "PipelineResult", "StageOptions", "bubble_fraction", "pipeline_frontier",
           "step_time_s"]

StageOptions = Callable[[int, int, int], np.ndarray]
"""``options(stage, first_block, last_block) -> (n, 3)`` array of ``(t, d, w)`` rows (time per
micro-batch, once-per-step time, memory); an empty array: the stage cannot hold that range."""


def step_time_s(max_t: float, sum_t: float, max_d: float, micro_batches: int) -> float:
    """The step time of a pipeline: ``(m - 1) * max_s t_s + sum_s t_s + max_s d_s``.

    Example:
        >>> step_time_s(max_t=2.0, sum_t=5.0, max_d=0.5, micro_batches=4)  # 3*2 + 5 + 0.5
        11.5
    """
    return (micro_batches - 1) * max_t + sum_t + max_d


def bubble_fraction(max_t: float, sum_t: float, micro_batches: int) -> float:
    """The share of a step's per-micro-batch time the slowest stage idles: ``1 - m max_t / T_mb``.

    ``T_mb = (m - 1) max t + sum t`` is the time of the micro-batch phase; the slowest stage computes
    ``m max t`` of it. Balanced stages give ``(p - 1) / (m + p - 1)`` of the step (``(p - 1) / m``
    of the work).

    Example:
        >>> round(bubble_fraction(max_t=1.0, sum_t=4.0, micro_batches=8), 4)  # p = 4 balanced: 3 / 11
        0.2727
    """
    total = (micro_batches - 1) * max_t + sum_t
    return 0.0 if total <= 0 else 1.0 - micro_batches * max_t / total


@dataclass
class PipelinePoint:
    """One frontier point of a pipeline: its cost, partition and stage options.

    Example:
        >>> p = PipelinePoint(11.5, 8.0, [(0, 1), (2, 3)], [0, 2], 2.0, 5.0, 0.5)
        >>> p.blocks, p.options
        ([(0, 1), (2, 3)], [0, 2])
    """

    time_s: float
    """Step time ``T`` (:func:`step_time_s`)."""
    memory_bytes: float
    """Memory per device: the largest stage's."""
    blocks: list[tuple[int, int]]
    """``[first, last]`` block of each stage (inclusive)."""
    options: list[int]
    """Row of each stage's option array the plan takes."""
    max_t: float = 0.0
    """Slowest stage's time per micro-batch."""
    sum_t: float = 0.0
    """Sum of the stages' times per micro-batch."""
    max_d: float = 0.0
    """Largest once-per-step time."""


@dataclass
class PipelineResult:
    """What :func:`pipeline_frontier` returns: the points (by time) and the bound they carry."""

    points: list[PipelinePoint] = field(default_factory=list)
    bound: float = 0.0
    """Every exact frontier point is within ``1 + bound`` of a returned one (0: exact)."""
    states: int = 0
    """Partial vectors kept over all DP states (a measure of the work)."""


def pipeline_frontier(num_blocks: int, num_stages: int, micro_batches: int, options: StageOptions,
                      stage_sizes: Callable[[int], Sequence[int]] | None = None,
                      epsilon: float = 0.0) -> PipelineResult:
    """The Pareto frontier of ``(step time, memory)`` over partitions into stages and stage options.

    Args:
        num_blocks: ``L``, blocks in the chain.
        num_stages: ``p``, stages (each holds at least one block).
        micro_batches: ``m``.
        options: the stage options (:data:`StageOptions`); called once per (stage, range) reached.
        stage_sizes: ``stage_sizes(s)`` lists the block counts stage ``s`` may hold (default: any);
            the frontier is exact over the partitions they allow.
        epsilon: ``0`` for the exact frontier; ``> 0`` keeps one partial vector per
            ``(1 + epsilon)``-box per DP state (bound ``(1 + epsilon)^p - 1``).

    Returns:
        A :class:`PipelineResult`, points sorted by time, mutually non-dominated.

    Raises:
        ValueError: fewer blocks than stages, or ``m < 1``.

    Example:
        >>> import numpy as np
        >>> def options(stage, first, last):  # each block costs 1 s and 1 byte per micro-batch
        ...     n = last - first + 1
        ...     return np.array([[n, 0.0, n * (2 - stage)]])
        >>> r = pipeline_frontier(4, 2, micro_batches=4, options=options)
        >>> [(p.time_s, p.memory_bytes, p.blocks) for p in r.points]
        [(10.0, 4.0, [(0, 1), (2, 3)]), (13.0, 3.0, [(0, 0), (1, 3)])]
    """
    if num_stages < 1 or num_blocks < num_stages:
        raise ValueError(f"cannot cut {num_blocks} blocks into {num_stages} stages of at least one block")
    if micro_batches < 1:
        raise ValueError(f"micro_batches must be >= 1, got {micro_batches}")
    L, p = num_blocks, num_stages
    # state (s, j): vals (n, 4), and per row its predecessor (j, row) and the option taken
    empty = _State(np.zeros((0, 4)), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    layer = {0: _State(np.zeros((1, 4)), np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64))}
    history: list[dict[int, _State]] = [layer]
    kept = 1
    for s in range(p):
        sizes = range(1, L + 1) if stage_sizes is None else sorted(set(stage_sizes(s)))
        nxt: dict[int, list] = {}
        for j, state in layer.items():
            if not len(state.vals):
                continue
            for n in sizes:
                end = j + n
                if n < 1 or end > L - (p - 1 - s) or (s == p - 1 and end != L):
                    continue
                opts = np.asarray(options(s, j, end - 1), dtype=np.float64).reshape(-1, 3)
                if not len(opts):
                    continue
                a = state.vals[:, None, :]
                o = opts[None, :, :]
                vals = np.stack(np.broadcast_arrays(
                    np.maximum(a[..., 0], o[..., 0]), a[..., 1] + o[..., 0],
                    np.maximum(a[..., 2], o[..., 1]), np.maximum(a[..., 3], o[..., 2])), axis=-1)
                rows, opt = np.divmod(np.arange(vals.shape[0] * vals.shape[1]), vals.shape[1])
                nxt.setdefault(end, []).append((vals.reshape(-1, 4), np.full(len(rows), j), rows, opt))
        layer = {}
        for end, parts in nxt.items():
            vals = np.concatenate([x[0] for x in parts])
            keep = pareto_select(vals, box_eps=epsilon)
            layer[end] = _State(vals[keep], np.concatenate([x[1] for x in parts])[keep],
                                np.concatenate([x[2] for x in parts])[keep],
                                np.concatenate([x[3] for x in parts])[keep])
            kept += len(keep)
        history.append(layer)
    final = layer.get(L, empty)
    result = PipelineResult(bound=(1.0 + epsilon) ** p - 1.0 if epsilon > 0 else 0.0, states=kept)
    if not len(final.vals):
        return result
    v = final.vals
    cost = np.stack([(micro_batches - 1) * v[:, 0] + v[:, 1] + v[:, 2], v[:, 3]], axis=1)
    for row in pareto_select(cost):
        blocks, chosen = _walk(history, L, int(row))
        result.points.append(PipelinePoint(
            float(cost[row, 0]), float(cost[row, 1]), blocks, chosen,
            float(v[row, 0]), float(v[row, 1]), float(v[row, 2])))
    return result


@dataclass
class _State:
    vals: np.ndarray
    prev_end: np.ndarray
    prev_row: np.ndarray
    option: np.ndarray


def _walk(history: list[dict[int, _State]], end: int, row: int) -> tuple[list[tuple[int, int]], list[int]]:
    """Follow the back-pointers of the final state's ``row`` to the partition and options."""
    blocks, chosen = [], []
    for s in range(len(history) - 1, 0, -1):
        state = history[s][end]
        start = int(state.prev_end[row])
        blocks.append((start, end - 1))
        chosen.append(int(state.option[row]))
        end, row = start, int(state.prev_row[row])
    return blocks[::-1], chosen[::-1]
