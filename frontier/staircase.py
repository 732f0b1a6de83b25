"""Compiled sum-and-union for two objectives: merge shifted staircases, skipping what is beaten.

For K = 2 a Pareto set sorted by objective 0 is a *staircase* (objective 1 strictly falls).
The Minkowski sum of staircases ``A (+) B`` is the union of copies of ``A`` shifted by each
point of ``B``, and the union over a dropped variable is the union of more such copies. So
every :meth:`frontier.combine.Combiner.combine` with K = 2 is one problem: the staircase of a
union of shifted staircases. :func:`_merge` solves it exactly by a k-way merge (a heap of
copies keyed by objective 0) that keeps the running minimum ``y*`` of objective 1:

* a popped point with ``y < y*`` is on the staircase (nothing popped earlier beats it, and
  everything later has a larger objective 0);
* a popped point with ``y >= y*`` is dominated, and so is every following point of its copy
  with ``y >= y*``: a binary search jumps the copy to its first point below ``y*``.

Each copy is pushed back at most once per point it emits or per jump, so the work is close
to the size of the answer times log(copies), instead of the product of the input sizes that
the numpy kernels (:mod:`frontier.bounded`) enumerate and sort. The result is identical: the
same Pareto set, ordered by (output group, objective 0); ties of equal vectors keep one.

Example:
    >>> import numpy as np
    >>> from frontier.staircase import sum_union_2d
    >>> cost = np.array([[0.0, 2.0], [1.0, 0.0], [0.0, 1.0]])  # table 0: rows 0,1; table 1: row 2
    >>> out = sum_union_2d([cost[:2], cost[2:]], [np.array([0, 2]), np.array([0, 1])],
    ...                    [np.array([0]), np.array([0])], 1, 1)
    >>> out[0].tolist(), out[2].tolist()
    ([[0.0, 3.0], [1.0, 1.0]], [[0, 0], [1, 0]])
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

#: Combines with at least this many candidates run on all cores (threads; the kernel is nogil).
PARALLEL_MIN_CANDIDATES = 2_000_000

try:  # numba is a dependency; the numpy kernels remain for the rare install without it
    from numba import njit

    AVAILABLE = True
except ImportError:  # pragma: no cover - exercised only without numba
    AVAILABLE = False

    def njit(*args, **kwargs):
        def wrap(fn):
            return fn

        return wrap


#: Points of a copy whose corner is tested against the bound at once.
_CHUNK = 16
#: Slices of objective 0 per expected staircase point (the longest copy plus one per copy):
#: finer slices leave fewer survivors to sort but fall out of the cache.
_SLICES_PER_POINT = 8
#: Most slices.
_MAX_SLICES = 1 << 16


@njit(cache=True)
def _prefix_min(fen, k):
    """Least value of slices 0..k-1 in the Fenwick tree ``fen``."""
    out = np.inf
    i = k
    while i > 0:
        out = min(out, fen[i])
        i -= i & -i
    return out


@njit(cache=True)
def _lower(fen, k, value):
    """Lower slice k's value to ``value`` in the Fenwick tree ``fen``."""
    i = k + 1
    while i < len(fen):
        fen[i] = min(fen[i], value)
        i += i & -i


@njit(cache=True)
def _survives(x, y, cid, xmin, inv_w, sl):
    """Whether candidate ``cid`` at (x, y) passes both tests of :func:`_merge`."""
    k = int((x - xmin) * inv_w)
    if y >= sl[k, 3]:
        return False
    return not (sl[k, 1] <= x and sl[k, 0] <= y and sl[k, 2] != cid)


@njit(cache=True)
def _survivors(bx, by, cstart, clen, cdx, cdy, ncopies, sl, first, xmin, inv_w, out):
    """Count the candidates that pass :func:`_survives` and, if ``out`` is given, store them.

    A chunk of a copy whose lower-left corner is not below the bound at its first point is
    skipped whole. ``out`` = (x, y, copy, base index) arrays of the counted length.
    """
    r = 0
    for c in range(ncopies):
        b0 = cstart[c]
        e0 = b0 + clen[c]
        dx = cdx[c]
        dy = cdy[c]
        for j0 in range(b0, e0, _CHUNK):
            j1 = min(j0 + _CHUNK, e0)
            if by[j1 - 1] + dy >= sl[int((bx[j0] + dx - xmin) * inv_w), 3]:
                continue
            for j in range(j0, j1):
                x = bx[j] + dx
                y = by[j] + dy
                if _survives(x, y, first[c] + (j - b0), xmin, inv_w, sl):
                    if out is not None:
                        out[0][r] = x
                        out[1][r] = y
                        out[2][r] = c
                        out[3][r] = j
                    r += 1
    return r


@njit(cache=True)
def _merge(bx, by, cstart, clen, cdx, cdy, ncopies):
    """Staircase of the union of copies; copy c = base points cstart[c]:+clen[c] shifted by (cdx, cdy).

    Returns (x, y, copy, base index) of the kept points, by objective 0. Base runs must be
    staircases (x ascending, y strictly descending). Two passes over the candidates: the
    first takes the least objective 1 in each of ``nb`` slices of objective 0; a candidate
    with objective 1 at or above the least of the slices before its own is dominated (by a
    point of strictly smaller objective 0), and so is one that its slice's least point (the
    first found) weakly dominates or equals; the rest are sorted and scanned exactly.
    """
    total = 0
    xmin = np.inf
    xmax = -np.inf
    for c in range(ncopies):
        m = clen[c]
        if m > 0:
            total += m
            xmin = min(xmin, bx[cstart[c]] + cdx[c])
            xmax = max(xmax, bx[cstart[c] + m - 1] + cdx[c])
    if total == 0:
        return np.empty(0), np.empty(0), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    if ncopies == 1:  # one staircase, shifted: nothing to merge
        b0 = cstart[0]
        m = clen[0]
        return (bx[b0:b0 + m] + cdx[0], by[b0:b0 + m] + cdy[0], np.zeros(m, dtype=np.int64),
                np.arange(b0, b0 + m))
    nb = min(max(_SLICES_PER_POINT * (clen.max() + ncopies), 64), _MAX_SLICES)
    inv_w = (nb - 1) / (xmax - xmin) if xmax > xmin else 0.0
    # per slice, one row (one cache line): least y, its x, its candidate id (first found),
    # and the bound: the least y of the slices before
    sl = np.empty((nb, 4))
    sl[:, 0] = np.inf
    sl[:, 1] = np.inf
    sl[:, 2] = -1.0
    fen = np.full(nb + 1, np.inf)  # Fenwick tree: least y of the slices before a slice
    first = np.empty(ncopies, dtype=np.int64)  # candidate id of each copy's first point
    cid = 0
    for c in range(ncopies):  # in order: neighbouring copies touch neighbouring slices
        b0 = cstart[c]
        dx = cdx[c]
        dy = cdy[c]
        first[c] = cid
        e0 = b0 + clen[c]
        for j0 in range(b0, e0, _CHUNK):
            j1 = min(j0 + _CHUNK, e0)
            x0 = bx[j0] + dx
            k0 = int((x0 - xmin) * inv_w)
            y1 = by[j1 - 1] + dy
            if (sl[k0, 1] <= x0 and sl[k0, 0] <= y1) or _prefix_min(fen, k0) <= y1:
                continue  # a point found already weakly dominates the whole chunk
            for j in range(j0, j1):
                x = bx[j] + dx
                k = int((x - xmin) * inv_w)
                y = by[j] + dy
                if y < sl[k, 0] or (y == sl[k, 0] and x < sl[k, 1]):
                    if y < sl[k, 0]:
                        _lower(fen, k, y)
                    sl[k, 0] = y
                    sl[k, 1] = x
                    sl[k, 2] = cid + (j - b0)
        cid += clen[c]
    run = np.inf
    for k in range(nb):
        sl[k, 3] = run
        run = min(run, sl[k, 0])
    # survivors: not dominated by the slices before, nor by (or equal to) their slice's least point
    ns = _survivors(bx, by, cstart, clen, cdx, cdy, ncopies, sl, first, xmin, inv_w, None)
    sx = np.empty(ns)
    sy = np.empty(ns)
    sc = np.empty(ns, dtype=np.int64)
    si = np.empty(ns, dtype=np.int64)
    _survivors(bx, by, cstart, clen, cdx, cdy, ncopies, sl, first, xmin, inv_w, (sx, sy, sc, si))
    order = np.argsort(sx)
    keep = np.empty(ns, dtype=np.int64)
    nk = 0
    best = np.inf
    r = 0
    while r < ns:  # runs of equal objective 0: the least objective 1 of the run, if below best
        q = order[r]
        e = r + 1
        while e < ns and sx[order[e]] == sx[q]:
            if sy[order[e]] < sy[q] or (sy[order[e]] == sy[q] and order[e] < q):
                q = order[e]
            e += 1
        if sy[q] < best:
            keep[nk] = q
            nk += 1
            best = sy[q]
        r = e
    keep = keep[:nk]
    return sx[keep], sy[keep], sc[keep], si[keep]


@njit(cache=True)
def _grow_f(a, need):
    if need <= a.shape[0]:
        return a
    b = np.empty((max(need, 2 * a.shape[0]),) + a.shape[1:], dtype=a.dtype)
    b[: a.shape[0]] = a
    return b


@njit(cache=True)
def _write_back_pointers(out_rows, r, m, kind, shift, index, copy_start, allrow, group_row):
    """Row ``r``'s back-pointers of a merged point: one row index per input table.

    ``index`` is the point's place in the merge's base array; a kind-0 copy (a prefix point
    shifted by a row of the last table) takes the prefix's rows and ``shift`` as the last table's
    row; a kind-1 copy (the last table's rows shifted by prefix point ``shift``) takes that prefix
    point's rows and the last table's row ``group_row + (index - copy_start)``. Shared by the
    two- and three-objective merges.
    """
    if m == 1:
        out_rows[r, 0] = allrow[index, 0]
    elif kind == 0:
        for u in range(m - 1):
            out_rows[r, u] = allrow[index, u]
        out_rows[r, m - 1] = shift
    else:
        for u in range(m - 1):
            out_rows[r, u] = allrow[shift, u]
        out_rows[r, m - 1] = group_row + (index - copy_start)


@njit(cache=True)
def _sum_group(cost, row_off, start, start_off, groups, m, x, k_last, px, py, prow):
    """Staircase of T_0[x] (+) ... (+) T_{k_last-1}[x] into px, py, prow; returns (n, px, py, prow)."""
    g = groups[0, x]
    lo = start[start_off[0] + g]
    hi = start[start_off[0] + g + 1]
    n = hi - lo
    px = _grow_f(px, n)
    py = _grow_f(py, n)
    prow = _grow_f(prow, n)
    for j in range(n):
        px[j] = cost[row_off[0] + lo + j, 0]
        py[j] = cost[row_off[0] + lo + j, 1]
        prow[j, 0] = lo + j
    for t in range(1, k_last):
        if n == 0:
            return 0, px, py, prow
        g = groups[t, x]
        lo = start[start_off[t] + g]
        hi = start[start_off[t] + g + 1]
        nt = hi - lo
        if nt == 0:
            return 0, px, py, prow
        if nt == 1:  # one shift: the staircase moves, no merge (the same points, the same order)
            dx = cost[row_off[t] + lo, 0]
            dy = cost[row_off[t] + lo, 1]
            for j in range(n):
                px[j] = px[j] + dx
                py[j] = py[j] + dy
                prow[j, t] = lo
            continue
        if n == 1:  # T_t's staircase shifted by the one point
            dx = px[0]
            dy = py[0]
            px = _grow_f(px, nt)
            py = _grow_f(py, nt)
            prow = _grow_f(prow, nt)
            for j in range(nt - 1, -1, -1):
                px[j] = cost[row_off[t] + lo + j, 0] + dx
                py[j] = cost[row_off[t] + lo + j, 1] + dy
                for u in range(t):
                    prow[j, u] = prow[0, u]
                prow[j, t] = lo + j
            n = nt
            continue
        # copies of the longer staircase shifted by each point of the shorter one
        bx = np.empty(n + nt)
        by = np.empty(n + nt)
        bx[:n] = px[:n]
        by[:n] = py[:n]
        for j in range(nt):
            bx[n + j] = cost[row_off[t] + lo + j, 0]
            by[n + j] = cost[row_off[t] + lo + j, 1]
        if n >= nt:  # base = P, shifts = T_t points
            ncopies = nt
            cstart = np.full(ncopies, 0, dtype=np.int64)
            clen = np.full(ncopies, n, dtype=np.int64)
            cdx = bx[n : n + nt].copy()
            cdy = by[n : n + nt].copy()
        else:  # base = T_t, shifts = P points
            ncopies = n
            cstart = np.full(ncopies, n, dtype=np.int64)
            clen = np.full(ncopies, nt, dtype=np.int64)
            cdx = bx[:n].copy()
            cdy = by[:n].copy()
        ox, oy, oc, oi = _merge(bx, by, cstart, clen, cdx, cdy, ncopies)
        nout = len(ox)
        newrow = np.empty((nout, m), dtype=np.int64)
        for j in range(nout):
            if n >= nt:
                p, q = oi[j], oc[j]
            else:
                p, q = oc[j], oi[j] - n
            for u in range(t):
                newrow[j, u] = prow[p, u]
            newrow[j, t] = lo + q
        px = _grow_f(px, nout)
        py = _grow_f(py, nout)
        prow = _grow_f(prow, nout)
        px[:nout] = ox[:nout]
        py[:nout] = oy[:nout]
        prow[:nout] = newrow
        n = nout
    return n, px, py, prow


@njit(cache=True, nogil=True)
def _sum_union(cost, row_off, start, start_off, groups, m, live, o_lo, o_hi, width):
    out_cost = np.empty((1024, 2))
    out_group = np.empty(1024, dtype=np.int64)
    out_rows = np.empty((1024, m), dtype=np.int64)
    out_vals = np.empty(1024, dtype=np.int64)
    total = 0
    px = np.empty(16)
    py = np.empty(16)
    prow = np.empty((16, m), dtype=np.int64)
    k_last = m - 1 if m > 1 else 1
    pstart = np.zeros(width + 1, dtype=np.int64)
    allx = np.empty(16)
    ally = np.empty(16)
    allrow = np.empty((16, m), dtype=np.int64)
    for o in range(o_lo, o_hi):
        # the staircases P_s of the first tables, for every value s of the dropped variable
        for s in range(width):
            x = o * width + s
            if not live[x]:  # some table has no row here: no candidate
                pstart[s + 1] = pstart[s]
                continue
            n, px, py, prow = _sum_group(cost, row_off, start, start_off, groups, m, x, k_last, px, py, prow)
            base = pstart[s]
            allx = _grow_f(allx, base + n)
            ally = _grow_f(ally, base + n)
            allrow = _grow_f(allrow, base + n)
            allx[base : base + n] = px[:n]
            ally[base : base + n] = py[:n]
            allrow[base : base + n] = prow[:n]
            pstart[s + 1] = base + n
        if pstart[width] == 0:
            continue  # no plan in this output group
        # copies for the union: P_s alone (one table), or P_s (+) T_last as shifted copies
        if m == 1:
            ncopies = width
            bx = allx
            by = ally
            cstart = pstart[:width].copy()
            clen = np.diff(pstart)
            cdx = np.zeros(ncopies)
            cdy = np.zeros(ncopies)
            cs = np.arange(width)
            ckind = np.zeros(ncopies, dtype=np.int64)
            cshift = np.zeros(ncopies, dtype=np.int64)
        else:
            t = m - 1
            ncopies = 0
            nbase = pstart[width]
            for s in range(width):
                g = groups[t, o * width + s]
                nt = start[start_off[t] + g + 1] - start[start_off[t] + g]
                np_s = pstart[s + 1] - pstart[s]
                if nt > 0 and np_s > 0:
                    ncopies += min(nt, np_s)
                    if np_s < nt:
                        nbase += nt
            if ncopies == 0:
                continue
            bx = np.empty(nbase)
            by = np.empty(nbase)
            bx[: pstart[width]] = allx[: pstart[width]]
            by[: pstart[width]] = ally[: pstart[width]]
            cstart = np.empty(ncopies, dtype=np.int64)
            clen = np.empty(ncopies, dtype=np.int64)
            cdx = np.empty(ncopies)
            cdy = np.empty(ncopies)
            cs = np.empty(ncopies, dtype=np.int64)
            ckind = np.empty(ncopies, dtype=np.int64)  # 0: base P_s, shift T row; 1: base T, shift P point
            cshift = np.empty(ncopies, dtype=np.int64)
            c = 0
            tail = pstart[width]
            for s in range(width):
                g = groups[t, o * width + s]
                lo = start[start_off[t] + g]
                nt = start[start_off[t] + g + 1] - lo
                np_s = pstart[s + 1] - pstart[s]
                if nt == 0 or np_s == 0:
                    continue
                if np_s >= nt:
                    for j in range(nt):
                        cstart[c] = pstart[s]
                        clen[c] = np_s
                        cdx[c] = cost[row_off[t] + lo + j, 0]
                        cdy[c] = cost[row_off[t] + lo + j, 1]
                        cs[c] = s
                        ckind[c] = 0
                        cshift[c] = lo + j
                        c += 1
                else:
                    for j in range(nt):
                        bx[tail + j] = cost[row_off[t] + lo + j, 0]
                        by[tail + j] = cost[row_off[t] + lo + j, 1]
                    for q in range(np_s):
                        cstart[c] = tail
                        clen[c] = nt
                        cdx[c] = allx[pstart[s] + q]
                        cdy[c] = ally[pstart[s] + q]
                        cs[c] = s
                        ckind[c] = 1
                        cshift[c] = pstart[s] + q
                        c += 1
                    tail += nt
            # base index -> table-local row of T_last for kind-1 copies
        ox, oy, oc, oi = _merge(bx, by, cstart, clen, cdx, cdy, ncopies)
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
            out_group[r] = o
            out_vals[r] = cs[c]
            group_row = 0
            if m > 1 and ckind[c] == 1:
                group_row = start[start_off[m - 1] + groups[m - 1, o * width + cs[c]]]
            _write_back_pointers(out_rows, r, m, ckind[c], cshift[c], oi[j], cstart[c], allrow, group_row)
        total = need
    return out_cost[:total], out_group[:total], out_rows[:total], out_vals[:total]


def sum_union_2d(costs, starts, groups, n_out: int, width: int, work: float = 0.0, live=None):
    """Exact grouped sum-and-union of K = 2 tables (the combine kernel, compiled).

    Args:
        costs: per table, its ``(N_i, 2)`` row costs (each group a staircase sorted by objective 0).
        starts: per table, its ``(G_i + 1,)`` group row offsets.
        groups: per table, its group index for every joint configuration ``x = o * width + s``.
        n_out: number of output groups ``o``; width: values ``s`` of the dropped variable (1 if none).
        work: the number of candidates (sums) if known; at least ``PARALLEL_MIN_CANDIDATES``
            spreads the output groups over the cores.
        live: per joint configuration ``x``, whether every table has a row there (None: computed);
            the others are skipped without a call.

    Returns:
        (cost, group, rows, vals): kept points ordered by (group, objective 0); ``rows[:, i]`` is
        the row of table ``i`` behind each point and ``vals`` the value ``s`` chosen.

    Example:
        >>> import numpy as np
        >>> c = np.array([[0.0, 1.0], [1.0, 0.0]])
        >>> out = sum_union_2d([c], [np.array([0, 1, 2])], [np.array([0, 1])], 1, 2)
        >>> out[0].tolist(), out[3].tolist()
        ([[0.0, 1.0], [1.0, 0.0]], [0, 1])
    """
    m = len(costs)
    cost = np.ascontiguousarray(np.concatenate(costs), dtype=np.float64)
    row_off = np.r_[0, np.cumsum([len(c) for c in costs])[:-1]].astype(np.int64)
    start = np.concatenate([np.asarray(s, dtype=np.int64) for s in starts])
    start_off = np.r_[0, np.cumsum([len(s) for s in starts])[:-1]].astype(np.int64)
    group = np.ascontiguousarray(np.stack([np.asarray(g, dtype=np.int64) for g in groups]))
    if live is None:
        live = np.ones(group.shape[1], dtype=np.bool_)
        for t in range(m):
            live &= np.diff(np.asarray(starts[t]))[group[t]] > 0
    args = (cost, row_off, start, start_off, group, m, np.ascontiguousarray(live, dtype=np.bool_))
    threads = min(_threads(), n_out) if work >= PARALLEL_MIN_CANDIDATES else 1
    if threads <= 1:
        return _sum_union(*args, 0, int(n_out), int(width))
    # output groups are independent: ranges of them on threads (the kernel releases the GIL)
    bounds = np.linspace(0, n_out, min(n_out, 4 * threads) + 1).astype(int)
    with ThreadPoolExecutor(threads) as pool:
        parts = list(
            pool.map(
                lambda r: _sum_union(*args, int(r[0]), int(r[1]), int(width)), zip(bounds[:-1], bounds[1:])
            )
        )
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(4))


def _threads() -> int:
    """CPU cores this process may use (``TENSOROPT_THREADS`` overrides)."""
    env = os.environ.get("TENSOROPT_THREADS")
    if env:
        return max(1, int(env))
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1
