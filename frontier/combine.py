"""The one kernel behind every reduction: sum tables, then take the union over one variable.

``combine(tables, drop=v)`` computes, for every joint configuration ``x`` of the union
of the scopes without ``v``::

    out[x] = prune( U_{s_v}  T_1[x, s_v] (+) T_2[x, s_v] (+) ... )

where ``(+)`` is the Minkowski sum of Pareto sets (all sums of one point of each) and
``U`` the union; ``drop=None`` only sums (merging tables with the same scope). It is
vectorised over all joint configurations at once: rows are expanded with ``np.repeat``
group by group, summed, and pruned by one grouped :func:`frontier.pareto.pareto_select`.

Identical inputs give identical outputs, so results are memoised by the digests of the
input tables and their arrangement: the blocks of a transformer, whose tables are equal
byte for byte, are reduced once and reused (the reused table gets its own children, so
plan reconstruction still follows the right nodes).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from frontier import staircase, staircase3
from frontier.bounded import bounded_sum_union
from frontier.cover import grouped_cover
from frontier.equal_slices import copy_groups, representative_groups, value_classes
from frontier.memory_limit import SolverMemoryError, limit_message
from frontier.pareto import pareto_select, ragged_arange
from frontier.table import Table

#: Most candidate points expanded at once; larger combines are split by output group.
CHUNK_POINTS = 4_000_000
#: Combines with at least this many candidates look for output groups that copy another
#: (:mod:`frontier.equal_slices`); below, finding them costs more than it saves.
COPIES_MIN_CANDIDATES = 20_000
#: Combines with more candidates than this use the bounded kernel (two objectives, numpy).
BOUNDED_MIN = 50_000
#: Two-objective combines use the compiled staircase merge (:mod:`frontier.staircase`), and
#: three-objective ones its three-objective form (:mod:`frontier.staircase3`), when numba is
#: installed; False selects the numpy kernels (comparisons, tests).
COMPILED_KERNEL = True


@dataclass
class CombineStats:
    """Counters of the work done by a :class:`Combiner`."""

    calls: int = 0
    """Combines requested."""
    reused: int = 0
    """Combines answered from the memo (identical repeated subgraphs)."""
    candidates: int = 0
    """Candidate points generated before pruning."""
    kept: int = 0
    """Points kept after pruning."""
    kept_bytes: int = 0
    """Bytes of the tables computed and kept (costs, group offsets, back-pointers)."""
    copied: int = 0
    """Output groups copied from an equal one instead of computed (:mod:`frontier.equal_slices`)."""


@dataclass
class Combiner:
    """Computes (and memoises) :func:`combine` over variables with ``sizes[v]`` configurations.

    Example:
        >>> import numpy as np
        >>> from frontier.table import leaf_table
        >>> c = Combiner(sizes=[2, 2])
        >>> node = leaf_table((0,), np.array([[1.0, 0.0], [0.0, 1.0]]))
        >>> edge = leaf_table((0, 1), np.zeros((2, 2, 2)))
        >>> t = c.combine([node, edge], drop=0)
        >>> t.scope, t.counts.tolist()
        ((1,), [2, 2])
    """

    sizes: list[int]
    """Configurations per variable."""
    box_eps: float = 0.0
    """Epsilon-box factor applied when a variable is dropped (0 = exact)."""
    box_min_candidates: float = 0.0
    """Only combines generating more candidates than this are boxed (the sweep steps of a deep
    model); the others stay exact and add no boxing step to the tracked depth."""
    reuse: bool = True
    """Memoise results of identical combines."""
    bounded: bool = True
    """Skip blocks of candidates that a partial frontier already dominates (K = 2, numpy kernel)."""
    compiled: bool = True
    """Use the compiled staircase merge for K = 2 (:mod:`frontier.staircase`) and K = 3
    (:mod:`frontier.staircase3`) when numba is installed."""
    memory_limit_bytes: float | None = None
    """Most bytes of kept tables before :class:`frontier.memory_limit.SolverMemoryError` (None: no limit)."""
    copies: bool = True
    """Compute an output group once when others equal it (a kept variable's values with equal slices in
    every table, :mod:`frontier.equal_slices`) and copy it (compiled kernels; off only for comparisons)."""
    stats: CombineStats = field(default_factory=CombineStats)
    _memo: dict = field(default_factory=dict, repr=False)
    _slice_classes: dict = field(default_factory=dict, repr=False)

    def key(self, tables: list[Table], drop: int | None) -> tuple[bytes, list[Table], tuple[int, ...]]:
        """Digest of a combine, the tables in canonical order, and the output scope."""
        out_scope = tuple(sorted(set().union(*(t.scope for t in tables)) - {drop}))
        full = out_scope + (() if drop is None else (drop,))
        pos = {v: i for i, v in enumerate(full)}
        arranged = sorted(tables, key=lambda t: (tuple(pos[v] for v in t.scope), t.digest))
        h = hashlib.blake2b(digest_size=16)
        h.update(repr((tuple(self.sizes[v] for v in full), drop is None, self.box_eps,
                       self.box_min_candidates)).encode())
        for t in arranged:
            h.update(t.digest)
            h.update(repr(tuple(pos[v] for v in t.scope)).encode())
        return h.digest(), arranged, out_scope

    def is_memoised(self, tables: list[Table], drop: int | None) -> bool:
        """Whether this combine would be answered from the memo."""
        return self.reuse and self.key(tables, drop)[0] in self._memo

    def combine(self, tables: list[Table], drop: int | None = None) -> Table:
        """Sum ``tables`` and take the union over ``drop`` (see module docstring)."""
        digest, arranged, out_scope = self.key(tables, drop)
        self.stats.calls += 1
        hit = self._memo.get(digest) if self.reuse else None
        if hit is None:
            hit = self._compute(arranged, out_scope, drop)
            self._count_kept(hit[:4])
            if self.reuse:
                self._memo[digest] = hit
        else:
            self.stats.reused += 1
        cost, start, rows, vals, boxed = hit
        return Table(
            scope=out_scope,
            shape=tuple(self.sizes[v] for v in out_scope),
            cost=cost,
            start=start,
            digest=digest,
            children=tuple(arranged),
            rows=rows,
            var=drop,
            vals=vals,
            depth=max((t.depth for t in arranged), default=0) + boxed,
            height=max((t.height for t in arranged), default=0) + 1,
        )

    def _count_kept(self, hit: tuple) -> None:
        """Add a computed table's bytes to the kept total; raise past the memory limit."""
        self.stats.kept_bytes += sum(a.nbytes for a in hit if a is not None)
        if self.memory_limit_bytes is not None and self.stats.kept_bytes > self.memory_limit_bytes:
            raise SolverMemoryError(limit_message(self.stats.kept_bytes, self.memory_limit_bytes))

    def _compute(self, tables: list[Table], out_scope: tuple[int, ...], drop: int | None):
        """The vectorised sum-and-union; returns (cost, start, rows, vals, boxed: 0 or 1)."""
        full = out_scope + (() if drop is None else (drop,))
        shape = tuple(self.sizes[v] for v in full)
        n_full = int(np.prod(shape, dtype=np.int64))
        width = 1 if drop is None else self.sizes[drop]
        groups = [_projection(t, full, shape) for t in tables]
        counts = [t.counts[g] for t, g in zip(tables, groups)]
        per_x = counts[0].astype(np.float64)
        for c in counts[1:]:
            per_x *= c
        per_out = per_x.reshape(-1, width).sum(axis=1)
        self.stats.candidates += int(per_out.sum())
        boxed = int(drop is not None and self.box_eps > 0 and per_out.sum() > self.box_min_candidates)
        compiled = self.compiled and COMPILED_KERNEL and tables[0].cost.shape[1] in (2, 3) and \
            (staircase.AVAILABLE if tables[0].cost.shape[1] == 2 else staircase3.AVAILABLE)
        live = per_x > 0
        src = None  # output groups that copy another (equal slices), computed once: frontier.equal_slices
        if compiled and self.copies and out_scope and per_out.sum() >= COPIES_MIN_CANDIDATES:
            reps = [value_classes(tables, v, self._slice_classes) for v in out_scope]
            if any((r != np.arange(len(r))).any() for r in reps):
                src = representative_groups(reps)
                live &= np.repeat(src == np.arange(len(src)), width)
                self.stats.copied += int((src != np.arange(len(src))).sum())
        if compiled and tables[0].cost.shape[1] == 2:
            cost, out_group, rows, vals = staircase.sum_union_2d(
                [t.cost for t in tables],
                [t.start for t in tables],
                groups,
                n_full // width,
                width,
                work=float(per_out.sum()),
                live=live,
            )
            if boxed:  # a least (1+e)-cover of each group: the box guarantee with fewer points
                offsets = np.r_[0, np.cumsum(np.bincount(out_group, minlength=n_full // width))]
                keep = grouped_cover(cost, offsets, self.box_eps)
                cost, out_group, rows, vals = cost[keep], out_group[keep], rows[keep], vals[keep]
            if src is not None:
                cost, out_group, rows, vals = copy_groups(cost, out_group, rows, vals, src, width, tables,
                                                          groups)
            start = np.r_[0, np.cumsum(np.bincount(out_group, minlength=n_full // width))].astype(np.int64)
            self.stats.kept += len(cost)
            return cost, start, rows, (vals if drop is not None else None), boxed
        if compiled:
            return self._compute3(tables, groups, n_full // width, width, live, per_out, drop, boxed, src)
        parts = []
        for lo, hi in _chunks(per_out):
            parts.append(
                self._compute_range(
                    tables, groups, counts, lo * width, hi * width, width, lo, bool(boxed)
                )
            )
        cost = np.concatenate([p[0] for p in parts])
        out_group = np.concatenate([p[1] for p in parts])
        rows = np.concatenate([p[2] for p in parts])
        vals = np.concatenate([p[3] for p in parts]) if drop is not None else None
        start = np.r_[0, np.cumsum(np.bincount(out_group, minlength=n_full // width))].astype(np.int64)
        self.stats.kept += len(cost)
        return cost, start, rows, vals, boxed

    def _compute3(self, tables, groups, n_out, width, live, per_out, drop, boxed, src=None):
        """The compiled three-objective sum-and-union (:func:`frontier.staircase3.sum_union_3d`);
        boxed: one point per (1 + e)-box of the exact set (:func:`frontier.pareto.pareto_select`);
        ``src``: the groups copied (:mod:`frontier.equal_slices`)."""
        cost, out_group, rows, vals = staircase3.sum_union_3d(
            [t.cost for t in tables], [t.start for t in tables], groups, n_out, width,
            work=float(per_out.sum()), live=live)
        if boxed:  # every candidate is within 1 + e of a kept point: its exact dominator's box
            keep = pareto_select(cost, out_group, self.box_eps)
            cost, out_group, rows, vals = cost[keep], out_group[keep], rows[keep], vals[keep]
        if src is not None:
            cost, out_group, rows, vals = copy_groups(cost, out_group, rows, vals, src, width, tables, groups)
        start = np.r_[0, np.cumsum(np.bincount(out_group, minlength=n_out))].astype(np.int64)
        self.stats.kept += len(cost)
        return cost, start, rows, (vals if drop is not None else None), boxed

    def _compute_range(self, tables, groups, counts, x_lo, x_hi, width, out_lo, boxed):
        """Sum and prune the candidates of the joint configurations x_lo <= x < x_hi."""
        box_eps = self.box_eps if boxed else 0.0
        if self.bounded and tables[0].cost.shape[1] == 2 and len(tables) >= 2:
            total = float(np.prod(np.stack([c[x_lo:x_hi] for c in counts]).astype(np.float64), axis=0).sum())
            if total > BOUNDED_MIN:
                cost, x, rows = bounded_sum_union(tables, groups, x_lo, x_hi, width, box_eps)
                return cost, x // width, np.stack(rows, axis=1), x % width
        x = np.arange(x_lo, x_hi, dtype=np.int64)
        n = counts[0][x]
        x = np.repeat(x, n)
        row = tables[0].start[groups[0][x]] + ragged_arange(n)
        cost = tables[0].cost[row]
        rows = [row]
        for i in range(1, len(tables)):
            n = counts[i][x]
            parent = np.repeat(np.arange(len(x)), n)
            x = x[parent]
            row = tables[i].start[groups[i][x]] + ragged_arange(n)
            cost = cost[parent] + tables[i].cost[row]
            rows = [r[parent] for r in rows] + [row]
            if i < len(tables) - 1 and len(x) > 4 * (x_hi - x_lo):
                keep = pareto_select(cost, x - x_lo)
                x, cost, rows = x[keep], cost[keep], [r[keep] for r in rows]
        out = x // width - out_lo
        keep = pareto_select(cost, out, box_eps)
        return (
            cost[keep],
            out[keep] + out_lo,
            np.stack([r[keep] for r in rows], axis=1),
            (x[keep] % width),
        )


def _projection(table: Table, full: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    """Group index of ``table`` for every joint configuration of ``full`` (row-major)."""
    index = np.zeros(shape, dtype=np.int64)
    stride = 1
    for v, size in zip(reversed(table.scope), reversed(table.shape)):
        axis = full.index(v)
        view = [1] * len(full)
        view[axis] = size
        index = index + (np.arange(size, dtype=np.int64) * stride).reshape(view)
        stride *= size
    return index.reshape(-1)


def _chunks(per_out: np.ndarray) -> list[tuple[int, int]]:
    """Split output groups into contiguous ranges of at most ~CHUNK_POINTS candidates."""
    n = len(per_out)
    if per_out.sum() <= CHUNK_POINTS:
        return [(0, n)]
    cum = np.cumsum(per_out)
    out, lo = [], 0
    while lo < n:
        base = cum[lo - 1] if lo else 0.0
        hi = max(int(np.searchsorted(cum, base + CHUNK_POINTS, side="right")), lo + 1)
        out.append((lo, min(hi, n)))
        lo = hi
    return out
