"""Hypervolume of a two-objective point set (the area it dominates up to a reference point)."""

from __future__ import annotations

import numpy as np

from frontier.pareto import pareto_select


def hypervolume_2d(costs: np.ndarray, reference: np.ndarray) -> float:
    """Area dominated by ``costs`` ``(N, 2)`` inside the box below ``reference`` (minimisation).

    Example:
        >>> import numpy as np
        >>> hypervolume_2d(np.array([[1.0, 2.0], [2.0, 1.0]]), np.array([3.0, 3.0]))
        3.0
    """
    costs = np.asarray(costs, dtype=np.float64).reshape(-1, 2)
    costs = costs[(costs < reference).all(axis=1)]
    if len(costs) == 0:
        return 0.0
    front = costs[pareto_select(costs)]  # ascending objective 0, descending objective 1
    widths = np.diff(np.r_[front[:, 0], reference[0]])
    return float(np.sum(widths * (reference[1] - front[:, 1])))
