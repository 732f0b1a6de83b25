"""A stage's memory as a function of its in-flight count ``k``: ``state + k x activations``.

Every cost of a stage graph is linear in ``k`` (:meth:`tensoropt.pipeline.search.StageSolver._stage_graph`),
so its memory at the two ends of a range of counts fixes it at every count between
(:func:`memory_at`). Tables kept in (time, memory at ``k1``, memory at ``k2``) therefore serve every
count of ``[k1, k2]`` by projection, exactly: a plan beaten at both ends is beaten everywhere between.
"""

from __future__ import annotations

import numpy as np


def split_memory(cost: np.ndarray, state, activations: np.ndarray, k) -> np.ndarray:
    """A stage cost table's memory at ``k`` in flight, ``state + k x activations`` in column 1, or
    for ``k = (k1, k2)`` the memory at both ends of the range: columns (time, state + k1 x
    activations, state + k2 x activations).

    The memory at any ``k`` between is a convex combination of the two (:func:`memory_at`), so a
    plan beaten at both ends is beaten at every ``k`` of the range: one table in three objectives
    serves every in-flight count of the range (:class:`tensoropt.pipeline.chain_stages.StageChain`).

    Example:
        >>> cost = np.array([[1.0, 9.0], [2.0, 9.0]])
        >>> split_memory(cost.copy(), 3.0, np.array([1.0, 2.0]), 4)[:, 1].tolist()
        [7.0, 11.0]
        >>> split_memory(cost, 3.0, np.array([1.0, 2.0]), (1, 8)).tolist()
        [[1.0, 4.0, 11.0], [2.0, 5.0, 19.0]]
    """
    if not isinstance(k, tuple):
        cost[..., 1] = state + k * activations
        return cost
    out = np.empty(cost.shape[:-1] + (3,))
    out[..., 0] = cost[..., 0]
    out[..., 1] = state + k[0] * activations
    out[..., 2] = state + k[1] * activations
    return out


def memory_at(low: np.ndarray, high: np.ndarray, in_flight: tuple[int, int], k: int) -> np.ndarray:
    """The memory at ``k`` from the memory at the ends of ``in_flight = (k1, k2)`` (``k1 < k2``):
    ``state + k x activations``, linear in ``k``.

    Example:
        >>> memory_at(np.array([4.0]), np.array([11.0]), (1, 8), 3).tolist()
        [6.0]
    """
    k1, k2 = in_flight
    return ((k2 - k) * low + (k - k1) * high) / (k2 - k1)
