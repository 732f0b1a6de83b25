"""Compiled sum-and-union for three objectives: a merge of shifted copies with a 2-D staircase.

The three-objective analogue of :mod:`frontier.staircase`. Every
:meth:`frontier.combine.Combiner.combine` with K = 3 asks, per output group, for the Pareto set of
a union of *copies*: a base Pareto set (a group of one table, or a partial sum) shifted by one
point of another. :func:`_merge3` solves it exactly by a k-way merge of the copies (a heap keyed by
the head points in lexicographic order of (objective 0, 1, 2)) that keeps the *staircase* of the
points kept so far projected on (objective 1, objective 2): a sorted array, objective 1 ascending
and objective 2 strictly falling.

* Everything popped earlier is lexicographically smaller, so a popped point is weakly dominated by
  some earlier candidate iff some kept point has objective 1 and objective 2 at most its own: the
  staircase's last step at or left of its objective 1 (a binary search) is at or below its
  objective 2. A point that passes is kept (the same Pareto set, one point per distinct vector)
  and goes onto the staircase, which drops the steps it covers.
* Whole runs of a copy are skipped: each base carries the least objective 1 and objective 2 of
  its aligned blocks of 4, 16, ..., 4096 points (in the base's order, objective 0 ascending); when
  a copy's head starts a block and a kept point weakly dominates the block's shifted corner, every
  point of the block is weakly dominated (their objective 0 is at least the head's), so the copy
  jumps past it. The work then follows the answer and the runs it can skip, not the product of
  the inputs that the numpy path (:meth:`frontier.combine.Combiner._compute_range`) enumerates,
  materialises and sorts.

Large merges (``GRID_MIN_CANDIDATES`` candidates or more) first thin the candidates in O(1) work
each (:func:`_merge3_grid`): a grid over (objective 0, objective 1) records each cell's least
objective 2, and a candidate goes when a cell strictly before its own in both axes holds a point
at or below its objective 2 (that point is strictly less in objectives 0 and 1) or its own cell's
point weakly dominates or equals it; the survivors are sorted and scanned with the staircase.

Rows with an infinite cost are never kept (as :func:`frontier.pareto.pareto_select`): a candidate
with one is skipped, and it can only dominate candidates that have one too.

Example:
    >>> import numpy as np
    >>> from frontier.staircase3 import sum_union_3d
    >>> a = np.array([[0.0, 2.0, 1.0], [1.0, 0.0, 0.0]])  # table 0: one group of 2 points
    >>> b = np.array([[0.0, 1.0, 1.0]])                   # table 1: one group of 1 point
    >>> out = sum_union_3d([a, b], [np.array([0, 2]), np.array([0, 1])],
    ...                    [np.array([0]), np.array([0])], 1, 1)
    >>> out[0].tolist(), out[2].tolist()
    ([[0.0, 3.0, 2.0], [1.0, 1.0, 1.0]], [[0, 0], [1, 0]])
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from frontier.staircase import (
    AVAILABLE,
    PARALLEL_MIN_CANDIDATES,
    _grow_f,
    _threads,
    _write_back_pointers,
    njit,
)

__all__ = ["AVAILABLE", "sum_union_3d"]

#: Block sizes of the skip test, smallest first (powers of ``_FACTOR``).
_FACTOR = 4
_LEVELS = 6
#: Candidates per grid cell of :func:`_merge3_grid` (its side: sqrt(candidates / this), at most
#: ``_MAX_SIDE``); merges of at least ``GRID_MIN_CANDIDATES`` candidates use the grid.
_CELL_POINTS = 16
_MAX_SIDE = 512
GRID_MIN_CANDIDATES = 4096


@njit(cache=True)
def _less(a0, a1, a2, b0, b1, b2):
    """Lexicographic (a0, a1, a2) < (b0, b1, b2)."""
    if a0 != b0:
        return a0 < b0
    if a1 != b1:
        return a1 < b1
    return a2 < b2


@njit(cache=True)
def _sift_down(k0, k1, k2, hc, h, i):
    while True:
        left = 2 * i + 1
        if left >= h:
            return
        best = left
        right = left + 1
        if right < h and _less(k0[right], k1[right], k2[right], k0[left], k1[left], k2[left]):
            best = right
        if not _less(k0[best], k1[best], k2[best], k0[i], k1[i], k2[i]):
            return
        k0[i], k0[best] = k0[best], k0[i]
        k1[i], k1[best] = k1[best], k1[i]
        k2[i], k2[best] = k2[best], k2[i]
        hc[i], hc[best] = hc[best], hc[i]
        i = best


@njit(cache=True)
def _step_at(sy, n, v):
    """Index of the last staircase step with objective 1 at most ``v`` (-1 if none)."""
    lo = 0
    hi = n
    while lo < hi:
        mid = (lo + hi) >> 1
        if sy[mid] <= v:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@njit(cache=True)
def _covered(sy, sz, n, v1, v2):
    """Whether a kept point has objective 1 <= ``v1`` and objective 2 <= ``v2``."""
    i = _step_at(sy, n, v1)
    return i >= 0 and sz[i] <= v2


@njit(cache=True)
def _insert(sy, sz, n, v1, v2):
    """Put the step (v1, v2) (not covered) onto the staircase; drop the steps it covers. Returns n."""
    lo = 0
    hi = n
    while lo < hi:  # first step with objective 1 >= v1
        mid = (lo + hi) >> 1
        if sy[mid] < v1:
            lo = mid + 1
        else:
            hi = mid
    pos = lo
    e = pos
    while e < n and sz[e] >= v2:  # objective 1 >= v1 and objective 2 >= v2: covered by the new step
        e += 1
    removed = e - pos
    if removed == 0:
        for i in range(n, pos, -1):
            sy[i] = sy[i - 1]
            sz[i] = sz[i - 1]
    elif removed > 1:
        for i in range(e, n):
            sy[i - removed + 1] = sy[i]
            sz[i - removed + 1] = sz[i]
    sy[pos] = v1
    sz[pos] = v2
    return n - removed + 1


@njit(cache=True)
def _block_minima(by, bz, cstart, clen, ncopies):
    """Per level and aligned block start of each base, the least objective 1 and 2 of the block."""
    nb = len(by)
    m1 = np.empty((_LEVELS, nb))
    m2 = np.empty((_LEVELS, nb))
    for c in range(ncopies):
        if clen[c] == 0 or (c > 0 and cstart[c] == cstart[c - 1] and clen[c] == clen[c - 1]):
            continue
        b0 = cstart[c]
        e0 = b0 + clen[c]
        size = _FACTOR
        for lev in range(_LEVELS):
            sub = size // _FACTOR
            for p in range(b0, e0, size):
                a1 = np.inf
                a2 = np.inf
                if lev == 0:
                    for q in range(p, min(p + size, e0)):
                        a1 = min(a1, by[q])
                        a2 = min(a2, bz[q])
                else:
                    for q in range(p, min(p + size, e0), sub):
                        a1 = min(a1, m1[lev - 1, q])
                        a2 = min(a2, m2[lev - 1, q])
                m1[lev, p] = a1
                m2[lev, p] = a2
            if size >= clen[c]:
                break
            size *= _FACTOR
    return m1, m2


@njit(cache=True)
def _merge3(bx, by, bz, cstart, clen, cdx, cdy, cdz, ncopies):
    """Pareto set of the union of copies; copy c = base points cstart[c]:+clen[c] shifted by its
    (cdx, cdy, cdz). Bases sorted lexicographically. Returns (x, y, z, copy, base index) of the
    kept points, in lexicographic order, one per distinct vector."""
    m1, m2 = _block_minima(by, bz, cstart, clen, ncopies)
    k0 = np.empty(ncopies)
    k1 = np.empty(ncopies)
    k2 = np.empty(ncopies)
    hc = np.empty(ncopies, dtype=np.int64)
    pos = cstart.copy()
    h = 0
    for c in range(ncopies):
        if clen[c] > 0 and np.isfinite(cdx[c]) and np.isfinite(cdy[c]) and np.isfinite(cdz[c]):
            j = cstart[c]
            k0[h] = bx[j] + cdx[c]
            k1[h] = by[j] + cdy[c]
            k2[h] = bz[j] + cdz[c]
            hc[h] = c
            h += 1
    for i in range(h // 2 - 1, -1, -1):
        _sift_down(k0, k1, k2, hc, h, i)
    cap = 64
    ox = np.empty(cap)
    oy = np.empty(cap)
    oz = np.empty(cap)
    oc = np.empty(cap, dtype=np.int64)
    oj = np.empty(cap, dtype=np.int64)
    sy = np.empty(cap + 1)
    sz = np.empty(cap + 1)
    n = 0  # kept points (and at least the staircase's steps)
    ns = 0
    while h > 0:
        c = hc[0]
        j = pos[c]
        x = k0[0]
        y = k1[0]
        z = k2[0]
        e0 = cstart[c] + clen[c]
        rel = j - cstart[c]
        advance = 1
        skipped = False
        if ns > 0:
            size = _FACTOR ** (_LEVELS + 1)
            for lev in range(_LEVELS - 1, -1, -1):
                size //= _FACTOR
                if lev > 0 and size // _FACTOR >= clen[c]:
                    continue  # the level below covers the whole base (this one was not computed)
                if rel % size == 0 and j + 1 < e0:
                    if _covered(sy, sz, ns, m1[lev, j] + cdy[c], m2[lev, j] + cdz[c]):
                        advance = min(size, e0 - j)
                        skipped = True
                        break
        if not skipped and np.isfinite(x) and np.isfinite(y) and np.isfinite(z):
            if not _covered(sy, sz, ns, y, z):
                if n == len(ox):
                    ox = _grow_f(ox, n + 1)
                    oy = _grow_f(oy, n + 1)
                    oz = _grow_f(oz, n + 1)
                    oc = _grow_f(oc, n + 1)
                    oj = _grow_f(oj, n + 1)
                if ns + 1 >= len(sy):
                    sy = _grow_f(sy, ns + 2)
                    sz = _grow_f(sz, ns + 2)
                ox[n] = x
                oy[n] = y
                oz[n] = z
                oc[n] = c
                oj[n] = j
                n += 1
                ns = _insert(sy, sz, ns, y, z)
        j += advance
        if j < e0:
            pos[c] = j
            k0[0] = bx[j] + cdx[c]
            k1[0] = by[j] + cdy[c]
            k2[0] = bz[j] + cdz[c]
        else:
            h -= 1
            k0[0] = k0[h]
            k1[0] = k1[h]
            k2[0] = k2[h]
            hc[0] = hc[h]
        _sift_down(k0, k1, k2, hc, h, 0)
    return ox[:n], oy[:n], oz[:n], oc[:n], oj[:n]


@njit(cache=True)
def _cell(v, lo, inv, side):
    """Grid index of ``v`` on an axis from ``lo`` (clamped: a chunk's corner may lie outside)."""
    return min(max(int((v - lo) * inv), 0), side - 1)


@njit(cache=True)
def _merge(bx, by, bz, cstart, clen, cdx, cdy, cdz, ncopies, grid_min):
    """The Pareto set of the copies by :func:`_merge3_grid` from ``grid_min`` candidates, else by
    :func:`_merge3` (the same result)."""
    total = 0
    for c in range(ncopies):
        total += clen[c]
    if total >= grid_min:
        return _merge3_grid(bx, by, bz, cstart, clen, cdx, cdy, cdz, ncopies, total)
    return _merge3(bx, by, bz, cstart, clen, cdx, cdy, cdz, ncopies)


@njit(cache=True)
def _merge3_grid(bx, by, bz, cstart, clen, cdx, cdy, cdz, ncopies, total):
    """:func:`_merge3` by two passes over a grid of (objective 0, objective 1) cells, then a sort of
    the survivors and the staircase scan: O(1) work per candidate instead of a heap and a search.

    Pass 1 records in each cell its least objective 2 (the point, first found); a chunk of a copy is
    passed over when its cell's recorded point already weakly dominates the chunk's corner (a
    weaker grid, still of real points). Pass 2 drops a candidate when a point of a cell strictly
    before its own in both grid axes has objective 2 at most its own (that point is strictly less
    in objectives 0 and 1: dominated), or when its own cell's point weakly dominates or equals it
    (unless it is that point); a chunk whose corner the first test drops goes whole. Every Pareto
    vector keeps at least one candidate; the survivors are sorted lexicographically and scanned
    with the staircase as in :func:`_merge3`.
    """
    xmin = np.inf
    xmax = -np.inf
    ymin = np.inf
    ymax = -np.inf
    for c in range(ncopies):
        if clen[c] == 0 or not (np.isfinite(cdx[c]) and np.isfinite(cdy[c]) and np.isfinite(cdz[c])):
            continue
        b0 = cstart[c]
        e0 = b0 + clen[c]
        for j in range(b0, e0):  # the corners: objective 0 is sorted, objective 1 is not
            if np.isfinite(bx[j]) and np.isfinite(by[j]):
                xmin = min(xmin, bx[j] + cdx[c])
                xmax = max(xmax, bx[j] + cdx[c])
                ymin = min(ymin, by[j] + cdy[c])
                ymax = max(ymax, by[j] + cdy[c])
    if not xmin <= xmax:
        return np.empty(0), np.empty(0), np.empty(0), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    side = int(np.sqrt(total / _CELL_POINTS))
    side = min(max(side, 4), _MAX_SIDE)
    inv_x = (side - 1) / (xmax - xmin) if xmax > xmin else 0.0
    inv_y = (side - 1) / (ymax - ymin) if ymax > ymin else 0.0
    cz = np.full(side * side, np.inf)
    cx = np.full(side * side, np.inf)
    cy = np.full(side * side, np.inf)
    cid = np.full(side * side, -1, dtype=np.int64)
    m1, m2 = _block_minima(by, bz, cstart, clen, ncopies)  # level 0: chunks of _FACTOR points
    first = np.empty(ncopies, dtype=np.int64)
    ident = 0
    for c in range(ncopies):
        first[c] = ident
        ident += clen[c]
        if clen[c] == 0 or not (np.isfinite(cdx[c]) and np.isfinite(cdy[c]) and np.isfinite(cdz[c])):
            continue
        b0 = cstart[c]
        e0 = b0 + clen[c]
        for j0 in range(b0, e0, _FACTOR):
            x0 = bx[j0] + cdx[c]
            y0 = m1[0, j0] + cdy[c]
            z0 = m2[0, j0] + cdz[c]
            if np.isfinite(x0) and np.isfinite(y0):
                k = _cell(x0, xmin, inv_x, side) * side + _cell(y0, ymin, inv_y, side)
                if cx[k] <= x0 and cy[k] <= y0 and cz[k] <= z0:
                    continue
            for j in range(j0, min(j0 + _FACTOR, e0)):
                x = bx[j] + cdx[c]
                y = by[j] + cdy[c]
                z = bz[j] + cdz[c]
                if not (np.isfinite(x) and np.isfinite(y) and np.isfinite(z)):
                    continue
                k = int((x - xmin) * inv_x) * side + int((y - ymin) * inv_y)
                if z < cz[k] or (z == cz[k] and (x < cx[k] or (x == cx[k] and y < cy[k]))):
                    cz[k] = z
                    cx[k] = x
                    cy[k] = y
                    cid[k] = first[c] + (j - b0)
    # bound[a, b]: least objective 2 of the cells (a' < a, b' < b)
    bound = np.full((side + 1) * (side + 1), np.inf)
    for a in range(1, side + 1):
        for b in range(1, side + 1):
            v = cz[(a - 1) * side + (b - 1)]
            v = min(v, bound[(a - 1) * (side + 1) + b])
            v = min(v, bound[a * (side + 1) + b - 1])
            bound[a * (side + 1) + b] = v
    cap = 256
    sx = np.empty(cap)
    sy_ = np.empty(cap)
    sz_ = np.empty(cap)
    sc = np.empty(cap, dtype=np.int64)
    si = np.empty(cap, dtype=np.int64)
    ns = 0
    for c in range(ncopies):
        if clen[c] == 0 or not (np.isfinite(cdx[c]) and np.isfinite(cdy[c]) and np.isfinite(cdz[c])):
            continue
        b0 = cstart[c]
        e0 = b0 + clen[c]
        for j0 in range(b0, e0, _FACTOR):
            x0 = bx[j0] + cdx[c]
            y0 = m1[0, j0] + cdy[c]
            z0 = m2[0, j0] + cdz[c]
            if np.isfinite(x0) and np.isfinite(y0):
                a = _cell(x0, xmin, inv_x, side)
                b = _cell(y0, ymin, inv_y, side)
                if bound[a * (side + 1) + b] <= z0:
                    continue
            for j in range(j0, min(j0 + _FACTOR, e0)):
                x = bx[j] + cdx[c]
                y = by[j] + cdy[c]
                z = bz[j] + cdz[c]
                if not (np.isfinite(x) and np.isfinite(y) and np.isfinite(z)):
                    continue
                a = int((x - xmin) * inv_x)
                b = int((y - ymin) * inv_y)
                if bound[a * (side + 1) + b] <= z:
                    continue
                k = a * side + b
                if cx[k] <= x and cy[k] <= y and cz[k] <= z and cid[k] != first[c] + (j - b0):
                    continue
                if ns == len(sx):
                    sx = _grow_f(sx, ns + 1)
                    sy_ = _grow_f(sy_, ns + 1)
                    sz_ = _grow_f(sz_, ns + 1)
                    sc = _grow_f(sc, ns + 1)
                    si = _grow_f(si, ns + 1)
                sx[ns] = x
                sy_[ns] = y
                sz_[ns] = z
                sc[ns] = c
                si[ns] = j
                ns += 1
    # lexicographic order of the survivors: stable sorts by objective 2, then 1, then 0
    order = np.argsort(sz_[:ns], kind="mergesort")
    order = order[np.argsort(sy_[:ns][order], kind="mergesort")]
    order = order[np.argsort(sx[:ns][order], kind="mergesort")]
    stair_y = np.empty(ns + 1)
    stair_z = np.empty(ns + 1)
    nst = 0
    keep = np.empty(ns, dtype=np.int64)
    n = 0
    for q in order:
        if not _covered(stair_y, stair_z, nst, sy_[q], sz_[q]):
            keep[n] = q
            n += 1
            nst = _insert(stair_y, stair_z, nst, sy_[q], sz_[q])
    keep = keep[:n]
    return sx[keep], sy_[keep], sz_[keep], sc[keep], si[keep]


@njit(cache=True)
def _sum_group3(cost, row_off, start, start_off, groups, m, x, k_last, pc, prow, grid_min):
    """Pareto set of T_0[x] (+) ... (+) T_{k_last-1}[x] into pc, prow; returns (n, pc, prow)."""
    g = groups[0, x]
    lo = start[start_off[0] + g]
    n = start[start_off[0] + g + 1] - lo
    pc = _grow_f(pc, n)
    prow = _grow_f(prow, n)
    for j in range(n):
        for d in range(3):
            pc[j, d] = cost[row_off[0] + lo + j, d]
        prow[j, 0] = lo + j
    for t in range(1, k_last):
        if n == 0:
            return 0, pc, prow
        g = groups[t, x]
        lo = start[start_off[t] + g]
        nt = start[start_off[t] + g + 1] - lo
        if nt == 0:
            return 0, pc, prow
        if nt == 1:  # one shift: the same points, the same order
            for j in range(n):
                for d in range(3):
                    pc[j, d] = pc[j, d] + cost[row_off[t] + lo, d]
                prow[j, t] = lo
            continue
        # copies of the longer set shifted by each point of the shorter one
        bx = np.empty(n + nt)
        by = np.empty(n + nt)
        bz = np.empty(n + nt)
        for j in range(n):
            bx[j] = pc[j, 0]
            by[j] = pc[j, 1]
            bz[j] = pc[j, 2]
        for j in range(nt):
            bx[n + j] = cost[row_off[t] + lo + j, 0]
            by[n + j] = cost[row_off[t] + lo + j, 1]
            bz[n + j] = cost[row_off[t] + lo + j, 2]
        p_is_base = n >= nt
        ncopies = nt if p_is_base else n
        cstart = np.full(ncopies, 0 if p_is_base else n, dtype=np.int64)
        clen = np.full(ncopies, n if p_is_base else nt, dtype=np.int64)
        off = n if p_is_base else 0
        cdx = bx[off:off + ncopies].copy()
        cdy = by[off:off + ncopies].copy()
        cdz = bz[off:off + ncopies].copy()
        ox, oy, oz, oc, oi = _merge(bx, by, bz, cstart, clen, cdx, cdy, cdz, ncopies, grid_min)
        nout = len(ox)
        newrow = np.empty((nout, prow.shape[1]), dtype=np.int64)
        for j in range(nout):
            if p_is_base:
                p, q = oi[j], oc[j]
            else:
                p, q = oc[j], oi[j] - n
            for u in range(t):
                newrow[j, u] = prow[p, u]
            newrow[j, t] = lo + q
        pc = _grow_f(pc, nout)
        prow = _grow_f(prow, nout)
        for j in range(nout):
            pc[j, 0] = ox[j]
            pc[j, 1] = oy[j]
            pc[j, 2] = oz[j]
        prow[:nout] = newrow
        n = nout
    return n, pc, prow


@njit(cache=True, nogil=True)
def _sum_union3(cost, row_off, start, start_off, groups, m, live, grid_min, o_lo, o_hi, width):
    out_cost = np.empty((1024, 3))
    out_group = np.empty(1024, dtype=np.int64)
    out_rows = np.empty((1024, m), dtype=np.int64)
    out_vals = np.empty(1024, dtype=np.int64)
    total = 0
    pc = np.empty((16, 3))
    prow = np.empty((16, m), dtype=np.int64)
    k_last = m - 1 if m > 1 else 1
    pstart = np.zeros(width + 1, dtype=np.int64)
    allc = np.empty((16, 3))
    allrow = np.empty((16, m), dtype=np.int64)
    for o in range(o_lo, o_hi):
        # the Pareto sets P_s of the first tables, for every value s of the dropped variable
        for s in range(width):
            x = o * width + s
            if not live[x]:
                pstart[s + 1] = pstart[s]
                continue
            n, pc, prow = _sum_group3(cost, row_off, start, start_off, groups, m, x, k_last, pc, prow,
                                      grid_min)
            base = pstart[s]
            allc = _grow_f(allc, base + n)
            allrow = _grow_f(allrow, base + n)
            allc[base:base + n] = pc[:n]
            allrow[base:base + n] = prow[:n]
            pstart[s + 1] = base + n
        nall = pstart[width]
        if nall == 0:
            continue
        # copies for the union: P_s alone (one table), or P_s (+) T_last as shifted copies
        t = m - 1
        ncopies = 0
        nbase = nall
        for s in range(width):
            np_s = pstart[s + 1] - pstart[s]
            if np_s == 0:
                continue
            if m == 1:
                ncopies += 1
                continue
            g = groups[t, o * width + s]
            nt = start[start_off[t] + g + 1] - start[start_off[t] + g]
            if nt > 0:
                ncopies += min(nt, np_s)
                if np_s < nt:
                    nbase += nt
        if ncopies == 0:
            continue
        bx = np.empty(nbase)
        by = np.empty(nbase)
        bz = np.empty(nbase)
        for j in range(nall):
            bx[j] = allc[j, 0]
            by[j] = allc[j, 1]
            bz[j] = allc[j, 2]
        cstart = np.empty(ncopies, dtype=np.int64)
        clen = np.empty(ncopies, dtype=np.int64)
        cdx = np.zeros(ncopies)
        cdy = np.zeros(ncopies)
        cdz = np.zeros(ncopies)
        cs = np.empty(ncopies, dtype=np.int64)
        ckind = np.zeros(ncopies, dtype=np.int64)  # 0: base P_s (shift: a T_last row); 1: base T_last
        cshift = np.zeros(ncopies, dtype=np.int64)
        c = 0
        tail = nall
        for s in range(width):
            np_s = pstart[s + 1] - pstart[s]
            if np_s == 0:
                continue
            if m == 1:
                cstart[c] = pstart[s]
                clen[c] = np_s
                cs[c] = s
                c += 1
                continue
            g = groups[t, o * width + s]
            lo = start[start_off[t] + g]
            nt = start[start_off[t] + g + 1] - lo
            if nt == 0:
                continue
            if np_s >= nt:
                for j in range(nt):
                    cstart[c] = pstart[s]
                    clen[c] = np_s
                    cdx[c] = cost[row_off[t] + lo + j, 0]
                    cdy[c] = cost[row_off[t] + lo + j, 1]
                    cdz[c] = cost[row_off[t] + lo + j, 2]
                    cs[c] = s
                    cshift[c] = lo + j
                    c += 1
            else:
                for j in range(nt):
                    bx[tail + j] = cost[row_off[t] + lo + j, 0]
                    by[tail + j] = cost[row_off[t] + lo + j, 1]
                    bz[tail + j] = cost[row_off[t] + lo + j, 2]
                for q in range(np_s):
                    cstart[c] = tail
                    clen[c] = nt
                    cdx[c] = allc[pstart[s] + q, 0]
                    cdy[c] = allc[pstart[s] + q, 1]
                    cdz[c] = allc[pstart[s] + q, 2]
                    cs[c] = s
                    ckind[c] = 1
                    cshift[c] = pstart[s] + q
                    c += 1
                tail += nt
        ox, oy, oz, oc, oi = _merge(bx, by, bz, cstart, clen, cdx, cdy, cdz, ncopies, grid_min)
        nout = len(ox)
        need = total + nout
        out_cost = _grow_f(out_cost, need)
        out_group = _grow_f(out_group, need)
        out_rows = _grow_f(out_rows, need)
        out_vals = _grow_f(out_vals, need)
        for j in range(nout):
            c = oc[j]
            r = total + j
            out_cost[r, 0] = ox[j]
            out_cost[r, 1] = oy[j]
            out_cost[r, 2] = oz[j]
            out_group[r] = o
            out_vals[r] = cs[c]
            group_row = 0
            if m > 1 and ckind[c] == 1:
                group_row = start[start_off[m - 1] + groups[m - 1, o * width + cs[c]]]
            _write_back_pointers(out_rows, r, m, ckind[c], cshift[c], oi[j], cstart[c], allrow, group_row)
        total = need
    return out_cost[:total], out_group[:total], out_rows[:total], out_vals[:total]


def _lexicographic(cost: np.ndarray, start: np.ndarray) -> np.ndarray:
    """A permutation of a table's rows putting each group in lexicographic order (the identity
    where it already is: every table the combine makes is)."""
    n = len(cost)
    if n < 2:
        return np.arange(n)
    a, b = cost[:-1], cost[1:]
    later = (b[:, 0] > a[:, 0]) | ((b[:, 0] == a[:, 0]) & (
        (b[:, 1] > a[:, 1]) | ((b[:, 1] == a[:, 1]) & (b[:, 2] >= a[:, 2]))))
    boundary = np.zeros(n - 1, dtype=bool)
    inner = np.asarray(start[1:-1], dtype=np.int64)
    boundary[inner[(inner > 0) & (inner < n)] - 1] = True
    if (later | boundary).all():
        return np.arange(n)
    group = np.repeat(np.arange(len(start) - 1), np.diff(start))
    return np.lexsort((cost[:, 2], cost[:, 1], cost[:, 0], group))


def sum_union_3d(costs, starts, groups, n_out: int, width: int, work: float = 0.0, live=None,
                 grid_min: int | None = None):
    """Exact grouped sum-and-union of K = 3 tables (the combine kernel, compiled).

    The same arguments and results as :func:`frontier.staircase.sum_union_2d`, in three objectives.

    Args:
        costs: per table, its ``(N_i, 3)`` row costs.
        starts: per table, its ``(G_i + 1,)`` group row offsets.
        groups: per table, its group index for every joint configuration ``x = o * width + s``.
        n_out: number of output groups ``o``; width: values ``s`` of the dropped variable (1 if none).
        work: the number of candidates if known; at least ``PARALLEL_MIN_CANDIDATES`` spreads the
            output groups over the cores.
        live: per joint configuration ``x``, whether every table has a row there (None: computed).
        grid_min: merges of at least this many candidates use the grid (:func:`_merge3_grid`), the
            others the heap (:func:`_merge3`); None: ``GRID_MIN_CANDIDATES``. The same result.

    Returns:
        (cost, group, rows, vals): the Pareto set of every output group, one row per distinct
        vector, ordered by (group, objective 0, 1, 2); ``rows[:, i]`` is the row of table ``i``
        behind each point and ``vals`` the value ``s`` chosen.

    Example:
        >>> import numpy as np
        >>> c = np.array([[0.0, 1.0, 1.0], [1.0, 0.0, 2.0], [1.0, 1.0, 1.0]])
        >>> out = sum_union_3d([c], [np.array([0, 2, 3])], [np.array([0, 1])], 1, 2)
        >>> out[0].tolist(), out[3].tolist()
        ([[0.0, 1.0, 1.0], [1.0, 0.0, 2.0]], [0, 0])
    """
    m = len(costs)
    costs = [np.asarray(c, dtype=np.float64) for c in costs]
    perms = [_lexicographic(c, np.asarray(s)) for c, s in zip(costs, starts)]
    sorted_costs = [c if (p == np.arange(len(c))).all() else c[p] for c, p in zip(costs, perms)]
    cost = np.ascontiguousarray(np.concatenate(sorted_costs).reshape(-1, 3))
    row_off = np.r_[0, np.cumsum([len(c) for c in costs])[:-1]].astype(np.int64)
    start = np.concatenate([np.asarray(s, dtype=np.int64) for s in starts])
    start_off = np.r_[0, np.cumsum([len(s) for s in starts])[:-1]].astype(np.int64)
    group = np.ascontiguousarray(np.stack([np.asarray(g, dtype=np.int64) for g in groups]))
    if live is None:
        live = np.ones(group.shape[1], dtype=np.bool_)
        for t in range(m):
            live &= np.diff(np.asarray(starts[t]))[group[t]] > 0
    grid_min = GRID_MIN_CANDIDATES if grid_min is None else int(grid_min)
    args = (cost, row_off, start, start_off, group, m, np.ascontiguousarray(live, dtype=np.bool_), grid_min)
    threads = min(_threads(), n_out) if work >= PARALLEL_MIN_CANDIDATES else 1
    if threads <= 1:
        out = _sum_union3(*args, 0, int(n_out), int(width))
    else:  # output groups are independent: ranges of them on threads (the kernel releases the GIL)
        bounds = np.linspace(0, n_out, min(n_out, 4 * threads) + 1).astype(int)
        with ThreadPoolExecutor(threads) as pool:
            parts = list(pool.map(lambda r: _sum_union3(*args, int(r[0]), int(r[1]), int(width)),
                                  zip(bounds[:-1], bounds[1:])))
        out = tuple(np.concatenate([p[i] for p in parts]) for i in range(4))
    cost_out, group_out, rows, vals = out
    for i, p in enumerate(perms):  # rows of the lexicographically sorted tables -> the tables' own
        rows[:, i] = p[rows[:, i]]
    return cost_out, group_out, rows, vals
