"""Graph reductions over frontier tables (one connected component at a time).

The graph is held as tables (:mod:`frontier.table`): one per remaining node, one per
remaining (possibly derived) edge. Every reduction below is one call of
:meth:`frontier.combine.Combiner.combine`, and each is exact because it only regroups a
sum over all plans -- the total cost is a sum of the table entries, and the frontier of
a union is the frontier of the union of frontiers:

- edge elimination / parallel-edge merge (:meth:`Reducer.add`): two tables over the same
  pair ``(u, v)`` are replaced by their sum ``F1[s_u, s_v] (+) F2[s_u, s_v]``;
- node elimination / series (:meth:`Reducer.eliminate` on a variable with two
  neighbours): ``F(u, w)[s_u, s_w] = U_{s_v} F(u, v) (+) F(v) (+) F(v, w)``, whatever the
  edge directions;
- triangle: the same with ``u`` and ``w`` already joined; the new ``(u, w)`` table is
  then merged with the existing one;
- merge / contract of a degree-one source or sink (a variable with one neighbour ``u``):
  ``F(u)[s_u] = U_{s_v} F(v) (+) F(u, v)``, folded into ``u``'s node table;
- the last variable of a component: ``U_{s_v} F(v)``, a table with an empty scope.

:meth:`Reducer.pick` chooses, among the variables with at most two neighbours, the one
whose elimination generates the fewest candidate points (zero when the result is
memoised). When none is left, the general fallback (:meth:`Reducer.pick_general`) eliminates
the variable, of any number of neighbours, whose elimination generates the fewest candidates
(exact: variable elimination in any order is); its table over all the neighbours often leaves
others with two neighbours, and the reductions above resume.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import numpy as np

from frontier.combine import Combiner
from frontier.table import Table

#: Sweep from sources and sinks at once, meeting in the middle (else from sources only).
BOTH_ENDS = True
#: Most candidates a local (non-sweep) elimination may generate before the sweep goes first.
LOCAL_LIMIT = 1_000_000
#: Where the next sweep step would spread its frontier over a two-variable table (or with
#: ``Reducer.compose``), a local elimination up to this many candidates still goes before a sweep
#: step that would generate at least ``SWEEP_SHARE`` of it: a block interior is reduced once and reused
#: for every identical block (memo), while a sweep run through an unreduced block spreads its
#: accumulated frontier over a two-variable table (one group per pair of the block's inner and
#: outer configurations) at every block. Llama-3-8B's shape, 8 layers on 16 GPUs: 96 s -> 9 s.
LOCAL_MAX = 100_000_000
#: See ``LOCAL_MAX``.
SWEEP_SHARE = 0.01


class Reducer:
    """The tables of one component and the reductions applied to them.

    Example:
        >>> import numpy as np
        >>> from frontier.table import leaf_table
        >>> c = Combiner(sizes=[2, 2])
        >>> r = Reducer(c, [leaf_table((0,), np.eye(2)), leaf_table((1,), np.eye(2)),
        ...                 leaf_table((0, 1), np.zeros((2, 2, 2)))])
        >>> while r.variables:
        ...     r.eliminate(r.pick())
        >>> r.result().cost.tolist()
        [[0.0, 2.0], [1.0, 1.0], [2.0, 0.0]]
    """

    def __init__(
        self, combiner: Combiner, tables: list[Table], on_eliminate: Callable[[], None] | None = None,
        compose: bool = False,
    ):
        self.combiner = combiner
        self.compose = compose
        """Compose local tables by doubling (see :meth:`pick`); for solves whose tables are bounded
        (``step_epsilon``): exact tables grow with every composition."""
        self.tables: dict[frozenset, Table] = {}
        self.incident: dict[int, set[frozenset]] = {}
        self.variables: set[int] = set()
        self.swept: set[frozenset] = set()
        """Scopes of the tables that carry an accumulated frontier (see :meth:`pick`)."""
        self.applied: Counter = Counter()
        """How many times each reduction was applied."""
        self._estimate: dict[int, float] = {}
        self._general: dict[int, float] = {}
        """Candidate counts of eliminating any variable (:meth:`pick_general`), computed when asked."""
        self._on_eliminate = on_eliminate
        for t in tables:
            self.variables.update(t.scope)
        for t in tables:
            self.add(t)
        for v in self.variables:
            self._refresh(v)

    def add(self, table: Table, swept: bool = False) -> None:
        """Insert a table; a table over an existing scope is merged into it (edge elimination)."""
        key = frozenset(table.scope)
        old = self.tables.get(key)
        if old is not None:
            table = self.combiner.combine([old, table])
            self.applied["edge elimination"] += 1
            swept = swept or key in self.swept
        if swept:
            self.swept.add(key)
        else:
            self.swept.discard(key)
        self.tables[key] = table
        for v in table.scope:
            self.incident.setdefault(v, set()).add(key)

    def pop(self, key: frozenset) -> Table:
        """Remove and return the table over ``key``."""
        table = self.tables.pop(key)
        self.swept.discard(key)
        for v in key:
            self.incident[v].discard(key)
        return table

    def neighbours(self, v: int) -> set[int]:
        """Variables sharing a table with ``v``."""
        return set().union(*self.incident.get(v, ())) - {v}

    def kind(self, v: int) -> str:
        """Name of the reduction that eliminating ``v`` applies."""
        nbrs = self.neighbours(v)
        if not nbrs:
            return "final"
        if len(nbrs) == 1:
            return "merge/contract"
        if len(nbrs) == 2:
            return "triangle" if frozenset(nbrs) in self.tables else "node elimination"
        return "general elimination"

    def eliminate(self, v: int) -> None:
        """Eliminate variable ``v``: sum its tables and take the union over its configurations."""
        self.applied[self.kind(v)] += 1
        keys = list(self.incident[v])
        swept = any(key in self.swept for key in keys)
        tables = [self.pop(key) for key in keys]
        new = self.combiner.combine(tables, drop=v)
        self.variables.discard(v)
        self._estimate.pop(v, None)
        self._general.pop(v, None)
        self.add(new, swept=swept or (len(new.scope) == 1 and new.counts.max(initial=0) > 1))
        for u in new.scope:
            self._refresh(u)
        if self._on_eliminate is not None:
            self._on_eliminate()

    def pick(self) -> int | None:
        """The next variable to eliminate (at most two neighbours), or None when there is none.

        Order: memoised eliminations first (free), then *local* ones -- not touching a swept
        table and generating at most ``LOCAL_LIMIT`` candidates (block interiors, reused
        across identical blocks; up to ``LOCAL_MAX`` while the cheapest sweep step would generate
        at least ``SWEEP_SHARE`` of it) -- then sweep steps. A *swept* table carries an accumulated
        frontier (a one-variable table with several points per configuration, or anything
        computed from one). A degree-one sink with a swept table waits while anything else
        is reducible, so the graph is swept from its sources and two large frontiers never
        meet in the middle (a costly Minkowski sum). Ties go to the cheapest estimate.

        With ``compose`` (bounded tables), local eliminations up to ``LOCAL_MAX`` go first and the one
        whose tallest table is lowest is taken first (then the cheapest): a chain of identical
        transfer tables ``T(x_0, x_1), T(x_1, x_2), ...`` is composed level by level,
        ``T(x_0, x_2)`` computed once and answered from the memo for ``T(x_2, x_4)``, ..., then
        ``T(x_0, x_4)``: composition by doubling, about ``log2(L)`` boxing steps deep for ``L``
        identical layers instead of ``L / 2`` for a sweep.
        """
        if not self._estimate:
            return None
        est = self._estimate
        best = lambda vs: min(vs, key=lambda v: (est[v], v))
        hits = [v for v in est if est[v] == 0.0]
        if hits:
            return min(hits)
        sweep = [v for v in est if self._touches_swept(v) and (BOTH_ENDS or not self._waits(v))]
        # past LOCAL_LIMIT only where composing pays: bounded tables (compose), or a next sweep
        # step that would spread its frontier over a two-variable table
        spread = bool(sweep) and len(self.neighbours(best(sweep))) >= 2
        limit = LOCAL_MAX if self.compose or spread else LOCAL_LIMIT
        local = [v for v in est if est[v] <= limit and not self._touches_swept(v)]
        if sweep and limit > LOCAL_LIMIT:
            least = min(est[u] for u in sweep)
            local = [v for v in local if est[v] <= LOCAL_LIMIT or SWEEP_SHARE * est[v] <= least]
        if local and self.compose:
            return min(local, key=lambda v: (self._height(v), est[v], v))
        if local:
            return best(local)
        if sweep:
            return best(sweep)
        allowed = [v for v in est if not self._waits(v)]
        return best(allowed or list(est))

    def pick_general(self) -> tuple[int, float]:
        """The variable whose elimination generates the fewest candidate points, whatever its number
        of neighbours, and that number (the general fallback once :meth:`pick` finds none).

        Any elimination order is exact (variable elimination); the order only sets the work. The
        cheapest-first order keeps the joined scopes small: two weight-tied layers (ALBERT: each
        operator of layer 2 tied to its twin in layer 1) form a ladder, eliminated rung by rung
        over three or four variables, where a topological cut would carry all of layer 1's tied
        operators through layer 2 (3.5 M joint configurations, 12 minutes, against seconds).
        """
        for v in self.variables:
            if v not in self._general:
                tables = [self.tables[key] for key in self.incident[v]]
                self._general[v] = candidate_count(tables)
        v = min(self.variables, key=lambda v: (self._general[v], v))
        return v, self._general[v]

    def _height(self, v: int) -> int:
        """Height of the tallest table of ``v`` (see :attr:`frontier.table.Table.height`)."""
        return max(self.tables[key].height for key in self.incident[v])

    def _touches_swept(self, v: int) -> bool:
        """Whether any table of ``v`` is swept."""
        return any(key in self.swept for key in self.incident[v])

    def _waits(self, v: int) -> bool:
        """Whether ``v`` is a degree-one sink with a swept table."""
        nbrs = self.neighbours(v)
        if len(nbrs) != 1 or next(iter(nbrs)) > v:
            return False
        return self._touches_swept(v)

    def result(self) -> Table:
        """The table with an empty scope left once every variable is eliminated."""
        return self.tables[frozenset()]

    def _refresh(self, v: int) -> None:
        """Recompute the elimination estimate of ``v`` (only for reducible variables)."""
        self._general.pop(v, None)
        if len(self.neighbours(v)) > 2:
            self._estimate.pop(v, None)
            return
        tables = [self.tables[key] for key in self.incident[v]]
        if self.combiner.is_memoised(tables, v):
            self._estimate[v] = 0.0
        else:
            self._estimate[v] = candidate_count(tables)


#: Joint configurations past which :func:`candidate_count` gives an upper bound instead of the
#: exact count (such an elimination is never the cheapest one that can run).
EXACT_COUNT_MAX_GROUPS = 1e8


def candidate_count(tables: list[Table]) -> float:
    """Number of candidate points a combine of ``tables`` generates (before pruning), over any
    number of variables; past ``EXACT_COUNT_MAX_GROUPS`` joint configurations an upper bound (joint
    configurations times the largest group of each table).

    Example:
        >>> import numpy as np
        >>> from frontier.table import leaf_table
        >>> candidate_count([leaf_table((0,), np.zeros((3, 2))), leaf_table((0, 1), np.zeros((3, 4, 2)))])
        12.0
        >>> star = [leaf_table((0, v), np.zeros((3, 2, 2))) for v in range(1, 31)]  # 3 * 2^30 groups
        >>> candidate_count(star) == 3 * 2.0 ** 30
        True
    """
    sizes = {v: n for t in tables for v, n in zip(t.scope, t.shape)}
    groups = math.prod(float(n) for n in sizes.values())
    if groups > EXACT_COUNT_MAX_GROUPS or len(sizes) > 50:  # einsum names at most 52 indices
        return groups * math.prod(float(t.counts.max(initial=0)) for t in tables)
    index = {v: i for i, v in enumerate(sizes)}
    args: list = []
    for t in tables:
        args += [t.counts.reshape(t.shape).astype(np.float64), [index[v] for v in t.scope]]
    return float(np.einsum(*args, [], optimize="greedy" if len(tables) > 3 else False))
