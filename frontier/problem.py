"""The validated cost-graph problem as plain arrays, and the cost of any plan.

A plan gives every node ``n`` one configuration ``s_n``; its cost vector is::

    cost(s) = sum_n c_n[s_n] + sum_(u, v) c_uv[s_u, s_v]

:meth:`Problem.costs` evaluates it for many plans at once; the solver reports every
point's cost recomputed this way, and the reference solvers use the same function.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Problem:
    """Node and edge cost tables indexed by node number (a topological numbering).

    Example:
        >>> import numpy as np
        >>> p = Problem(names=["a", "b"], node_cost=[np.array([[1.0, 0.0]]), np.array([[2.0, 1.0]])],
        ...             edges=[(0, 1)], edge_cost=[np.array([[[0.5, 0.5]]])])
        >>> p.costs(np.array([[0, 0]])).tolist()
        [[3.5, 1.5]]
    """

    names: list
    """Graph node of each number."""
    node_cost: list[np.ndarray]
    """(C_n, K) cost of each configuration of node n."""
    edges: list[tuple[int, int]]
    """(u, v) node numbers of each edge, u < v."""
    edge_cost: list[np.ndarray]
    """(C_u, C_v, K) cost of each configuration pair of each edge."""

    @property
    def sizes(self) -> list[int]:
        """Number of configurations of each node."""
        return [len(c) for c in self.node_cost]

    @property
    def num_objectives(self) -> int:
        """K, the length of every cost vector."""
        return self.node_cost[0].shape[1]

    def restrict(self, kept: list[np.ndarray]) -> Problem:
        """The problem with only configurations ``kept[n]`` (indices, in order) of each node n.

        Example:
            >>> import numpy as np
            >>> p = Problem(names=["a"], node_cost=[np.array([[1.0], [2.0]])], edges=[], edge_cost=[])
            >>> p.restrict([np.array([1])]).node_cost[0].tolist()
            [[2.0]]
        """
        return Problem(
            names=self.names,
            node_cost=[c[k] for c, k in zip(self.node_cost, kept)],
            edges=self.edges,
            edge_cost=[c[np.ix_(kept[u], kept[v])] for (u, v), c in zip(self.edges, self.edge_cost)],
        )

    def costs(self, configs: np.ndarray) -> np.ndarray:
        """Cost vectors ``(P, K)`` of the plans ``configs`` (``(P, n)`` configuration indices).

        Example:
            >>> import numpy as np
            >>> p = Problem(names=["a"], node_cost=[np.array([[1.0], [2.0]])], edges=[], edge_cost=[])
            >>> p.costs(np.array([[0], [1]])).tolist()
            [[1.0], [2.0]]
        """
        configs = np.asarray(configs, dtype=np.int64)
        total = np.zeros((len(configs), self.num_objectives))
        for n, c in enumerate(self.node_cost):
            total += c[configs[:, n]]
        for (u, v), c in zip(self.edges, self.edge_cost):
            total += c[configs[:, u], configs[:, v]]
        return total
