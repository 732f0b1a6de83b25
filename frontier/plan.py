"""Plan reconstruction: follow the back-pointers from frontier points down to every node."""

from __future__ import annotations

import numpy as np

from frontier.table import Table


def reconstruct(root: Table, rows: np.ndarray, num_vars: int) -> np.ndarray:
    """Configurations ``(P, num_vars)`` of the plans behind rows ``rows`` of ``root``.

    Every table records, per row, the row of each child that made it and the configuration
    of the variable it eliminated; the tables form a tree (each is consumed once), so one
    walk from the root, vectorised over all P points, assigns every variable exactly once.
    Variables never eliminated under ``root`` stay -1.

    Example:
        >>> import numpy as np
        >>> from frontier.combine import Combiner
        >>> from frontier.table import leaf_table
        >>> t = Combiner(sizes=[3]).combine([leaf_table((0,), np.array([[2.0], [1.0], [5.0]]))], drop=0)
        >>> reconstruct(t, np.array([0]), 1).tolist()
        [[1]]
    """
    rows = np.asarray(rows, dtype=np.int64)
    configs = np.full((len(rows), num_vars), -1, dtype=np.int64)
    stack = [(root, rows)]
    while stack:
        table, r = stack.pop()
        if table.var is not None:
            configs[:, table.var] = table.vals[r]
        for i, child in enumerate(table.children):
            stack.append((child, table.rows[r, i]))
    return configs
