"""Frontier tables: a Pareto set of cost vectors for every joint configuration of a scope.

A :class:`Table` over the scope ``(a, b)`` (variables = graph nodes, numbered) holds, for
each pair ``(s_a, s_b)``, the Pareto set of the total cost of everything already
eliminated "behind" that pair. Rows are stored flat and grouped: group ``g`` (the
row-major index of the joint configuration) owns rows ``start[g]:start[g + 1]``, sorted
by objective 0. Each row keeps a back-pointer (one row index into every child table,
plus the configuration chosen for the variable the table eliminated) so a plan can be
rebuilt from any point (:mod:`frontier.plan`).

Leaf tables hold the input costs: one per node (scope ``(n,)``) and one per edge
(scope ``(u, v)``), with one row per finite configuration.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np


@dataclass(eq=False)
class Table:
    """Grouped Pareto sets over the joint configurations of ``scope``.

    Example:
        >>> import numpy as np
        >>> t = leaf_table((0,), np.array([[1.0, 2.0], [3.0, 0.5]]))
        >>> t.counts.tolist(), t.cost.tolist()
        ([1, 1], [[1.0, 2.0], [3.0, 0.5]])
    """

    scope: tuple[int, ...]
    """Variables (node numbers), ascending."""
    shape: tuple[int, ...]
    """Number of configurations of each scope variable."""
    cost: np.ndarray
    """(N, K) cost vectors of all rows."""
    start: np.ndarray
    """(G + 1,) row offsets of the G = prod(shape) groups."""
    digest: bytes
    """Content key: equal digests mean equal cost, start, rows and vals arrays."""
    children: tuple[Table, ...] = ()
    """Tables this one was computed from (empty for a leaf)."""
    rows: np.ndarray | None = None
    """(N, len(children)) row index into each child that made each row."""
    var: int | None = None
    """Variable eliminated (minimised over) by this table, if any."""
    vals: np.ndarray | None = None
    """(N,) configuration of ``var`` behind each row."""
    depth: int = 0
    """Most epsilon-boxing steps on a derivation path below this table (0: exact)."""
    height: int = 0
    """Most combines on a derivation path below this table (0: a leaf); the elimination order
    composes low tables first (:meth:`frontier.reductions.Reducer.pick`)."""

    @property
    def counts(self) -> np.ndarray:
        """Number of rows of each group."""
        return np.diff(self.start)

    @property
    def size(self) -> int:
        """Total number of rows."""
        return len(self.cost)


def leaf_table(scope: tuple[int, ...], cost: np.ndarray) -> Table:
    """Table of raw costs: ``cost`` has shape ``shape + (K,)`` in the order of ``scope``.

    Scopes are stored ascending; a descending two-variable scope is transposed here.
    Configurations with an infinite cost get no row (they are infeasible).

    Example:
        >>> import numpy as np
        >>> t = leaf_table((3, 1), np.zeros((2, 4, 2)))
        >>> t.scope, t.shape
        ((1, 3), (4, 2))
    """
    cost = np.asarray(cost, dtype=np.float64)
    order = np.argsort(scope, kind="stable")
    if tuple(order) != tuple(range(len(scope))):
        cost = np.transpose(cost, tuple(order) + (len(scope),))
        scope = tuple(scope[i] for i in order)
    shape = cost.shape[:-1]
    flat = np.ascontiguousarray(cost.reshape(-1, cost.shape[-1]))
    finite = np.flatnonzero(np.isfinite(flat).all(axis=1))
    counts = np.zeros(len(flat), dtype=np.int64)
    counts[finite] = 1
    start = np.r_[0, np.cumsum(counts)].astype(np.int64)
    h = hashlib.blake2b(digest_size=16)
    h.update(np.asarray(shape, dtype=np.int64).tobytes())
    h.update(flat.tobytes())
    return Table(scope=tuple(scope), shape=tuple(shape), cost=flat[finite], start=start, digest=h.digest())
