"""The exact time/memory frontier of an interleaved pipeline: ``v`` virtual stages per rank.

Formulation. As in :mod:`frontier.pipeline`, a chain of ``L`` blocks is cut into consecutive
ranges, here ``v · p`` of them (*virtual stages* ``0 .. vp-1``), and virtual stage ``s`` runs on
rank ``s mod p`` (torch's ``ScheduleInterleaved1F1B``: rank ``r`` holds stages ``r, r + p, ...``).
Each virtual stage holding ``[f, l]`` has options ``(t, d, w)`` (time per micro-batch with its sends
and receives, once-per-step time, memory with its own in-flight micro-batches of activations).
Rank ``r`` sums its virtual stages::

    tau_r = sum_c t_{cp+r}      D_r = sum_c d_{cp+r}      W_r = sum_c w_{cp+r}

and with ``m`` micro-batches a plan costs::

    T = (m - 1/v) * max_r tau_r + (1/v) * sum_s t_s + max_r D_r      (interleaved_step_time_s)
    M = max_r W_r

The slowest rank computes ``m · max tau`` in the step; fill and drain pass the other ranks' work
once per chunk, ``(sum_s t_s - max tau) / v``. Balanced stages (``t_s = t/v``) give
``T = (m + (p - 1)/v) t``: the bubble ``(p - 1)/(v m)`` of Megatron's interleaved schedule (arXiv
2104.04473 §2.2.2); ``v = 1`` is :func:`frontier.pipeline.step_time_s`. ``W_r`` adds each virtual
stage's own peak of in-flight activations: an upper bound of the rank's joint peak (the two peaks
need not coincide in time), exact where they do.

The DP. Ranks are closed in chain order but a rank's chunks lie ``p`` stages apart, so a partial
vector over the first ``s`` virtual stages keeps, beside ``(max tau, sum t, max D, max W)`` of the
ranks already closed, the *open* sums ``(tau_r, D_r, W_r)`` of every rank with chunks still to come
(``4 + 3p`` coordinates, an open slot 0 once closed)::

    F(0, 0) = {0}
    F(s + 1, j') = prune U_{j < j'} U_{o in options(s, j, j'-1)} step(a, o, s)   for a in F(s, j)

where ``step`` adds ``o`` to rank ``s mod p``'s open slot and, at the rank's last chunk, moves the
slot into the maxima. Every coordinate combines by ``+`` or ``max`` (monotone) and ``T``, ``M`` are
monotone in every coordinate, so dropping a dominated partial vector loses no frontier point: the
DP is exact (checked against enumeration in ``tests/frontier/test_interleaved_dp.py``). With
``epsilon > 0`` each DP state keeps one vector per ``(1 + epsilon)``-box, bound
``(1 + epsilon)^(v p) - 1``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from frontier.pareto import pareto_select
from frontier.pipeline import PipelinePoint, PipelineResult, StageOptions

__all__ = ["interleaved_bubble_fraction", "interleaved_frontier", "interleaved_step_time_s"]


def interleaved_step_time_s(max_rank_t: float, sum_t: float, max_rank_d: float, micro_batches: int,
                            chunks: int = 2) -> float:
    """The step time of an interleaved pipeline: ``(m - 1/v) max tau + (1/v) sum t + max D``.

    Example:
        >>> # 2 ranks x 2 chunks of 1 s each: tau = 2 s, sum t = 4 s, m = 4 -> 3.5*2 + 2 = 9 s
        >>> interleaved_step_time_s(2.0, 4.0, 0.0, 4, chunks=2)
        9.0
    """
    return (micro_batches - 1.0 / chunks) * max_rank_t + sum_t / chunks + max_rank_d


def interleaved_bubble_fraction(max_rank_t: float, sum_t: float, micro_batches: int,
                                chunks: int = 2) -> float:
    """The share of the micro-batch phase the slowest rank idles: ``1 - m max tau / T_mb``.

    Balanced stages give ``(p - 1) / (v m + p - 1)`` of the phase (``(p - 1) / (v m)`` of the work).

    Example:
        >>> round(interleaved_bubble_fraction(2.0, 8.0, 8, chunks=2), 4)  # p = 4, v = 2: 3 / 19
        0.1579
    """
    total = (micro_batches - 1.0 / chunks) * max_rank_t + sum_t / chunks
    return 0.0 if total <= 0 else 1.0 - micro_batches * max_rank_t / total


def interleaved_frontier(num_blocks: int, num_ranks: int, micro_batches: int, options: StageOptions,
                         chunks: int = 2, stage_sizes: Callable[[int], Sequence[int]] | None = None,
                         epsilon: float = 0.0) -> PipelineResult:
    """The Pareto frontier of ``(step time, memory per rank)`` over cuts into ``chunks · num_ranks``
    virtual stages and an option per virtual stage (see the module docstring).

    Args:
        num_blocks: ``L``, blocks in the chain.
        num_ranks: ``p``, pipeline ranks.
        micro_batches: ``m``.
        options: ``options(virtual_stage, first, last) -> (n, 3)`` rows ``(t, d, w)``; called once
            per (virtual stage, range) reached.
        chunks: ``v``, virtual stages per rank.
        stage_sizes: ``stage_sizes(s)``: the block counts virtual stage ``s`` may hold (default any).
        epsilon: ``0`` exact; ``> 0`` one partial vector per box per state.

    Returns:
        A :class:`frontier.pipeline.PipelineResult`; each point's ``blocks`` and ``options`` list the
        ``v p`` virtual stages in chain order, ``max_t`` is ``max tau``, ``sum_t`` the sum over
        virtual stages, ``max_d`` ``max D``.

    Raises:
        ValueError: fewer blocks than virtual stages, ``m < 1`` or ``v < 1``.

    Example:
        >>> import numpy as np
        >>> def options(s, first, last):  # a block costs 1 s; memory 1 byte per block
        ...     n = last - first + 1
        ...     return np.array([[n, 0.0, n]])
        >>> r = interleaved_frontier(4, 2, 4, options)  # 4 virtual stages of one block each
        >>> [(p.time_s, p.memory_bytes, p.blocks) for p in r.points]
        [(9.0, 2.0, [(0, 0), (1, 1), (2, 2), (3, 3)])]
    """
    p, v, L = num_ranks, chunks, num_blocks
    n_virtual = p * v
    if v < 1 or p < 1 or L < n_virtual:
        raise ValueError(f"cannot cut {L} blocks into {n_virtual} virtual stages ({p} ranks x {v} chunks) "
                         "of at least one block")
    if micro_batches < 1:
        raise ValueError(f"micro_batches must be >= 1, got {micro_batches}")
    width = 4 + 3 * p
    start = np.zeros((1, width))
    layer = {0: (start, np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64))}
    history = [layer]
    kept = 1
    for s in range(n_virtual):
        rank, last_chunk = s % p, s // p == v - 1
        slot = 4 + 3 * rank
        sizes = range(1, L + 1) if stage_sizes is None else sorted(set(stage_sizes(s)))
        nxt: dict[int, list] = {}
        for j, (vals_in, *_rest) in layer.items():
            if not len(vals_in):
                continue
            for n in sizes:
                end = j + n
                if n < 1 or end > L - (n_virtual - 1 - s) or (s == n_virtual - 1 and end != L):
                    continue
                opts = np.asarray(options(s, j, end - 1), dtype=np.float64).reshape(-1, 3)
                if not len(opts):
                    continue
                a = np.repeat(vals_in, len(opts), axis=0)
                o = np.tile(opts, (len(vals_in), 1))
                out = a.copy()
                out[:, 1] += o[:, 0]
                opened = a[:, slot:slot + 3] + o
                if last_chunk:  # the rank's last chunk: its sums join the maxima, the slot closes
                    out[:, 0] = np.maximum(out[:, 0], opened[:, 0])
                    out[:, 2] = np.maximum(out[:, 2], opened[:, 1])
                    out[:, 3] = np.maximum(out[:, 3], opened[:, 2])
                    out[:, slot:slot + 3] = 0.0
                else:
                    out[:, slot:slot + 3] = opened
                rows, opt = np.divmod(np.arange(len(out)), len(opts))
                nxt.setdefault(end, []).append((out, np.full(len(out), j), rows, opt))
        layer = {}
        for end, parts in nxt.items():
            vals = np.concatenate([x[0] for x in parts])
            keep = pareto_select(vals, box_eps=epsilon)
            layer[end] = (vals[keep], *(np.concatenate([x[i] for x in parts])[keep] for i in (1, 2, 3)))
            kept += len(keep)
        history.append(layer)
    bound = (1.0 + epsilon) ** n_virtual - 1.0 if epsilon > 0 else 0.0
    result = PipelineResult(bound=bound, states=kept)
    if L not in layer or not len(layer[L][0]):
        return result
    vals = layer[L][0]
    cost = np.stack([interleaved_step_time_s(vals[:, 0], vals[:, 1], vals[:, 2], micro_batches, v),
                     vals[:, 3]], axis=1)
    for row in pareto_select(cost):
        blocks, chosen = _walk(history, L, int(row))
        result.points.append(PipelinePoint(float(cost[row, 0]), float(cost[row, 1]), blocks, chosen,
                                           float(vals[row, 0]), float(vals[row, 1]), float(vals[row, 2])))
    return result


def _walk(history: list[dict], end: int, row: int) -> tuple[list[tuple[int, int]], list[int]]:
    """Follow the back-pointers of the final state's ``row`` to the cuts and options."""
    blocks, chosen = [], []
    for s in range(len(history) - 1, 0, -1):
        _vals, prev_end, prev_row, option = history[s][end]
        start = int(prev_end[row])
        blocks.append((start, end - 1))
        chosen.append(int(option[row]))
        end, row = start, int(prev_row[row])
    return blocks[::-1], chosen[::-1]
