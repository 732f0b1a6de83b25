"""Middle stages re-priced from the stage frontiers at neighbouring in-flight counts, with a computed
bound (issue 27).

Under 1F1B stage ``s`` of ``p`` holds ``k_s = min(p - s, m)`` micro-batches, so ``p = 8`` asks for a
stage frontier at every count 1..8, each from its own transfer tables and sweeps. A middle stage's
memory is linear in ``k`` (``state + k x activations``,
:func:`tensoropt.pipeline.in_flight_memory.split_memory`), so the frontiers at two counts
``k1 < k < k2`` bound every plan's memory at ``k`` from below. The pipeline search
(:meth:`tensoropt.pipeline.search.StageSolver.options`) takes a middle stage at ``k`` as the plans of
the frontiers at two counts around it re-priced at ``k`` (:func:`brackets`: first 1 and ``p``, which
the last and first stages need anyway, then its neighbours on :func:`in_flight_grid`, 1, 2, 4, ...,
p), the first pair :func:`reprice_bound` proves within the allowed bound of every plan at ``k``;
otherwise it solves ``k`` exactly.

The bound. Let ``C_j`` be the frontier points the solve keeps at ``k_j`` (time, memory at ``k_j``),
each exact plan's point within ``1 + b_j`` of one of them (the boxing bound). For any plan ``x`` of
the stage, ``w_x(k_j) >= L_j(t_x) = min{w : (t, w) in C_j, t <= (1 + b_j) t_x} / (1 + b_j)`` (the
point covering the plan's dominating frontier point), and, memory being linear in ``k``,
``w_x(k) = lam w_x(k1) + (1 - lam) w_x(k2) >= LB(t_x) = lam L_1(t_x) + (1 - lam) L_2(t_x)`` with
``lam = (k2 - k) / (k2 - k1)``. ``LB`` is a step function, constant between its breakpoints
``t / (1 + b_j)``; ``beta`` is the least value such that at every breakpoint ``tau`` some kept option
``o`` has ``t_o <= (1 + beta) tau`` and ``w_o <= (1 + beta) LB(tau)``. Then every plan at ``k`` is
within ``1 + beta`` of an option in time and memory: a true bound, computed on the data, not a worst
case (which is ``k2 / k`` in memory).
"""

from __future__ import annotations

import numpy as np


def in_flight_grid(num_stages: int) -> list[int]:
    """The in-flight counts solved exactly for ``num_stages`` stages under 1F1B: the powers of two
    below ``p`` and ``p`` itself (the last stage holds 1, the first ``p``).

    Example:
        >>> in_flight_grid(2), in_flight_grid(8), in_flight_grid(6)
        ([1, 2], [1, 2, 4, 8], [1, 2, 4, 6])
    """
    grid, k = [], 1
    while k < num_stages:
        grid.append(k)
        k *= 2
    return [*grid, num_stages]


def neighbours(k: int, grid: list[int]) -> tuple[int, int] | None:
    """The nearest counts of ``grid`` below and above ``k``; None where ``k`` is in the grid or
    outside it.

    Example:
        >>> neighbours(3, [1, 2, 4, 8]), neighbours(7, [1, 2, 4, 8]), neighbours(4, [1, 2, 4, 8])
        ((2, 4), (4, 8), None)
    """
    if k in grid:
        return None
    low = [g for g in grid if g < k]
    high = [g for g in grid if g > k]
    return (max(low), min(high)) if low and high else None


def brackets(k: int, num_stages: int) -> list[tuple[int, int]]:
    """The pairs of counts a middle stage at ``k`` tries to be re-priced from, in order: the last
    and first stages' counts ``(1, p)`` (solved anyway; ``p``: the first stage's count, ``min(p, m)``
    under 1F1B), then its neighbours on :func:`in_flight_grid` (none when ``k`` is on it: then ``k``
    is solved itself).

    Example:
        >>> brackets(3, 8), brackets(4, 8), brackets(2, 2)
        ([(1, 8), (2, 4)], [(1, 8)], [])
    """
    out = [(1, num_stages)] if 1 < k < num_stages else []
    pair = neighbours(k, in_flight_grid(num_stages))
    return out + ([pair] if pair is not None and pair not in out else [])


def _staircase(points: np.ndarray, bound: float, tau: np.ndarray) -> np.ndarray:
    """``L(tau) = min{w : (t, w) in points, t <= (1 + bound) tau} / (1 + bound)`` (inf where none)."""
    order = np.argsort(points[:, 0], kind="stable")
    t = points[order, 0]
    w = np.minimum.accumulate(points[order, 1])
    i = np.searchsorted(t, (1.0 + bound) * tau, side="right") - 1
    out = np.full(len(tau), np.inf)
    out[i >= 0] = w[i[i >= 0]] / (1.0 + bound)
    return out


def reprice_bound(low: np.ndarray, high: np.ndarray, low_bound: float, high_bound: float,
                  weight_low: float, options: np.ndarray) -> float:
    """How close the ``options`` at ``k`` come to every plan at ``k`` (see the module docstring).

    Args:
        low, high: ``(n, 2)`` points (time, memory) of the stage frontier at ``k1`` and at ``k2``,
            covering every plan's point there within ``1 + low_bound`` and ``1 + high_bound``.
        low_bound, high_bound: those bounds (0: exact).
        weight_low: ``lam = (k2 - k) / (k2 - k1)``.
        options: ``(n, 2)`` (time, memory at ``k``) of the options kept at ``k``.

    Returns:
        ``beta``: every plan's (time, memory at ``k``) is within ``1 + beta`` of an option
        (``inf`` when no option covers the fastest plans).

    Example:
        >>> low = np.array([[1.0, 10.0], [2.0, 6.0]])     # k1 = 1: (time, state + 1 x activations)
        >>> high = np.array([[1.0, 24.0], [2.0, 12.0]])   # k2 = 3: the same plans at 3
        >>> at2 = np.array([[1.0, 17.0], [2.0, 9.0]])     # both plans at k = 2: exact
        >>> reprice_bound(low, high, 0.0, 0.0, 0.5, at2)
        0.0
        >>> round(reprice_bound(low, high, 0.0, 0.0, 0.5, at2[1:]), 3)  # the fast plan missing
        1.0
    """
    low, high, options = (np.asarray(a, dtype=np.float64).reshape(-1, 2) for a in (low, high, options))
    if not len(low) or not len(high):
        return 0.0
    if not len(options):
        return float("inf")
    tau = np.unique(np.concatenate([low[:, 0] / (1.0 + low_bound), high[:, 0] / (1.0 + high_bound)]))
    lo, hi = _staircase(low, low_bound, tau), _staircase(high, high_bound, tau)
    live = np.isfinite(lo) & np.isfinite(hi)  # elsewhere no plan has that time (w >= inf at an end)
    lb = np.where(live, weight_low * np.where(live, lo, 0.0) + (1.0 - weight_low) * np.where(live, hi, 0.0),
                  np.inf)
    tau, lb = tau[live], lb[live]
    if not len(tau):
        return 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        time_ratio = options[None, :, 0] / tau[:, None]
        memory_ratio = np.where(options[None, :, 1] <= lb[:, None], 1.0, options[None, :, 1] / lb[:, None])
    need = np.maximum(np.maximum(time_ratio, memory_ratio) - 1.0, 0.0)
    return float(need.min(axis=1).max())
