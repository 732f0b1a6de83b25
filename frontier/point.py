"""A point of the Pareto frontier: a cost vector and a plan reaching it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Point:
    """One non-dominated total cost vector and a configuration choice that reaches it.

    Example:
        >>> import numpy as np
        >>> p = Point(cost=np.array([1.0, 2.0]), assignment={"fc": 0})
        >>> p.cost.tolist(), p.assignment
        ([1.0, 2.0], {'fc': 0})
    """

    cost: np.ndarray
    """(K,) total cost of the plan, one entry per objective."""
    assignment: dict
    """Graph node -> index of its chosen configuration."""
