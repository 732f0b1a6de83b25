"""Each collective of a replayed step, timed from its issue to the end of its wait (issue 29 item 4).

:func:`comm_clocked_steps` runs a trainer's replayed program (:mod:`tensoropt.executor.program.replay`)
through an ``fx.Interpreter`` that stamps every node with the wall clock and the main thread's CPU
clock. Per collective (``_c10d_functional.*`` or the CPU all-gather of
:mod:`tensoropt.executor.ops.gloo_gathers`) it records what the estimator's ``n`` is (all-reduce,
reduce-scatter: the input's bytes; all-gather: the output's; all-to-all: each device's), the time
the issuing call took, the time from its return to the start of its wait (``overlap``: the program's
other nodes ran meanwhile; ``overlap_cpu`` of it the main thread's CPU) and the wait itself. What a
collective adds to the step is its issue plus its wait (``exposed``); the overlapped part is hidden
behind compute as long as the host has a core for gloo's threads.

:func:`price_collectives` prices the same list with the estimator (:class:`estimators.collectives.CommModel`):
a gradient bucket (an ``all_reduce_`` the lowering wrote in place into its ``cat``) at its fit
(:meth:`CommModel.time_s`), every other collective as the cost graph prices a redistribution's, a
synchronised batch norm's or a split loss's (:meth:`CommModel.blocking_time_s`);
:func:`collective_table` groups both by kind and size class.

Example:
    >>> rows = [{"kind": "all_reduce", "bytes": 4096, "bucket": False, "issue_s": 1e-4, "overlap_s": 0.0,
    ...          "overlap_cpu_s": 0.0, "wait_s": 1e-3, "inflight": 0}]
    >>> size_class(4096), exposed_s(rows[0])
    ('< 64 KiB', 0.0011)
"""

from __future__ import annotations

import statistics
import time

SIZE_CLASSES = ((64 * 2**10, "< 64 KiB"), (2**20, "64 KiB-1 MiB"), (4 * 2**20, "1-4 MiB"),
                (float("inf"), ">= 4 MiB"))
"""Upper bounds (exclusive) and names of the size classes (the calibrated sizes fall one per class)."""


def size_class(nbytes: float) -> str:
    """The name of the size class of a collective of ``nbytes`` (:data:`SIZE_CLASSES`).

    Example:
        >>> size_class(65536), size_class(16 * 2**20)
        ('64 KiB-1 MiB', '>= 4 MiB')
    """
    for bound, name in SIZE_CLASSES:
        if nbytes < bound:
            return name
    return SIZE_CLASSES[-1][1]


def exposed_s(row: dict) -> float:
    """What one collective adds to the step on the main thread: its issuing call and its wait.

    Example:
        >>> exposed_s({"issue_s": 0.001, "wait_s": 0.002})
        0.003
    """
    return row["issue_s"] + row["wait_s"]


def collective_kind(target) -> str | None:
    """The estimator's collective name of a program node's target, or None for any other node (a wait
    included).

    Example:
        >>> import torch
        >>> collective_kind(torch.ops._c10d_functional.all_reduce_.default)
        'all_reduce'
        >>> collective_kind(torch.ops._c10d_functional.wait_tensor.default) is None
        True
    """
    name = getattr(target, "__name__", "") if not hasattr(target, "_schema") else str(target)
    if name == "start_all_gather":
        return "all_gather"
    if not name.startswith("_c10d_functional.") or "wait_tensor" in name:
        return None
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"):
        if kind in name:
            return kind
    return None


def is_wait(target) -> bool:
    """Whether a program node's target waits for a collective (functional or gloo_gathers').

    Example:
        >>> import torch
        >>> is_wait(torch.ops._c10d_functional.wait_tensor.default), is_wait(torch.ops.aten.mm.default)
        (True, False)
    """
    name = str(target) if hasattr(target, "_schema") else getattr(target, "__name__", "")
    return "wait_tensor" in name or name == "finish_all_gather"


def _nbytes(kind: str, args: tuple, out) -> float:
    """The estimator's ``n`` of a collective call (see the module docstring)."""
    import torch

    first = args[0] if args else None
    if isinstance(first, (list, tuple)):  # a coalesced call: its tensors together
        inputs = sum(t.nbytes for t in first if isinstance(t, torch.Tensor))
    else:
        inputs = first.nbytes if isinstance(first, torch.Tensor) else 0
    if kind == "all_gather":
        group = next((a for a in args[1:] if isinstance(a, int)), 1)
        return float(inputs * group)
    return float(inputs)


def comm_clocked_steps(trainer, steps: int, start: int) -> dict:
    """Run ``steps`` steps of ``trainer`` with every collective of its replayed program timed.

    Returns ``{"collectives": [row per collective, in program order], "step_s", "step_cpu_s",
    "exposed_s"}``: each row has ``kind``, ``bytes``, ``bucket`` (an in-place gradient bucket),
    ``node`` and the medians over the steps of ``issue_s``, ``overlap_s``, ``overlap_cpu_s``,
    ``wait_s`` and ``inflight`` (collectives already in flight at its issue); ``step_s`` and
    ``step_cpu_s`` the steps' median wall and main-thread CPU, ``exposed_s`` the median of the
    steps' summed issue and wait. Empty when the trainer has no replayed program. Both ranks must
    call it (the collectives).

    Example:
        >>> comm_clocked_steps(trainer, 3, 3000)["collectives"][0]["kind"]  # doctest: +SKIP
        'all_gather'
    """
    import torch.fx as fx
    from micro_batch_time import run_delay_s

    program = getattr(trainer.graph, "program", None)
    if program is None or not program.programs:
        return {}
    per_step: list[dict[str, dict]] = []

    class Stamped(fx.Interpreter):
        def run(self, *args, **kwargs):
            self.rows: dict[str, dict] = {}
            self.inflight: dict[str, dict] = {}
            self.cpu_s = 0.0  # the main thread's CPU in the program's nodes so far
            self.last_end = (time.perf_counter(), run_delay_s())  # the previous wait's end
            out = super().run(*args, **kwargs)
            per_step.append(self.rows)
            return out

        def run_node(self, n):
            if n.op != "call_function":
                return super().run_node(n)
            args = self.fetch_args_kwargs_from_env(n)[0]
            kind = collective_kind(n.target)
            d0 = run_delay_s() if kind is not None else 0.0
            t0, c0 = time.perf_counter(), time.thread_time()
            out = super().run_node(n)
            t1, c1 = time.perf_counter(), time.thread_time()
            if kind is not None:
                row = {"node": n.name, "kind": kind, "bytes": _nbytes(kind, args, out),
                       "bucket": gradient_bucket(n), "issue_s": t1 - t0, "issued_at": t1,
                       "cpu_at": self.cpu_s + (c1 - c0), "inflight": len(self.inflight),
                       "t_issue": t0, "delay_before_s": d0 - self.last_end[1]}
                self.rows[n.name] = self.inflight[n.name] = row
            elif is_wait(n.target):
                source = n.args[0]
                row = self.inflight.pop(source.name, None) if hasattr(source, "name") else None
                if row is not None:
                    row.update(overlap_s=t0 - row.pop("issued_at"),
                               overlap_cpu_s=self.cpu_s - row.pop("cpu_at"), wait_s=t1 - t0, t_end=t1)
                    self.last_end = (t1, run_delay_s())
            self.cpu_s += c1 - c0
            return out

    saved = dict(program.programs)
    for key, (lowered, call) in saved.items():
        program.programs[key] = (lowered, lambda *a, call=call: Stamped(call).run(*a))
    walls, cpus = [], []
    try:
        for i in range(steps):
            t0, c0 = time.perf_counter(), time.thread_time()
            trainer.step(start + i, measure_memory=False)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.thread_time() - c0)
    finally:
        program.programs.update(saved)
    others = _other_ranks(per_step)
    rows = []
    for name, first in per_step[0].items():
        got = [(s[name], [o[i].get(name) for o in others]) for i, s in enumerate(per_step)
               if name in s and "wait_s" in s[name]]
        if not got:
            continue
        row = {k: first[k] for k in ("node", "kind", "bytes", "bucket")}
        for field in ("issue_s", "overlap_s", "overlap_cpu_s", "wait_s", "inflight"):
            row[field] = statistics.median(g[field] for g, _ in got)
        row.update(arrival_split(got))
        rows.append(row)
    exposed = [sum(exposed_s(r) for r in s.values() if "wait_s" in r) for s in per_step]
    return {"collectives": rows, "step_s": statistics.median(walls), "step_cpu_s": statistics.median(cpus),
            "exposed_s": statistics.median(exposed)}


def _other_ranks(per_step: list[dict]) -> list[list[dict]]:
    """The other ranks' per-step rows (``all_gather_object``; none without a process group)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return []
    got: list = [None] * dist.get_world_size()
    dist.all_gather_object(got, per_step)
    return [g for r, g in enumerate(got) if r != dist.get_rank()]


def arrival_split(got: list[tuple[dict, list]]) -> dict:
    """Split one collective's wait on this rank, per step, into ``skew_s`` (until the last rank issued it:
    the sync point's wait) and ``after_s`` (from then to this rank's wait end: the collective itself),
    and ``skew_delay_s``: how much more the last rank to arrive waited runnable for a core since its
    previous collective than this rank did (the host's load, not the plan); medians over the steps.
    Without the other ranks' rows every field is None.

    Example:
        >>> me = {"t_issue": 1.0, "t_end": 1.004, "delay_before_s": 0.0}
        >>> other = {"t_issue": 1.003, "t_end": 1.004, "delay_before_s": 0.002}
        >>> {k: round(v, 6) for k, v in arrival_split([(me, [other])]).items()}
        {'skew_s': 0.003, 'after_s': 0.001, 'skew_delay_s': 0.002}
    """
    skews, afters, delays = [], [], []
    for mine, theirs in got:
        theirs = [t for t in theirs if t and "t_end" in t]
        if not theirs:
            continue
        last = max([mine, *theirs], key=lambda r: r["t_issue"])
        skews.append(last["t_issue"] - mine["t_issue"])
        afters.append(mine["t_end"] - last["t_issue"])
        delays.append(max(0.0, last["delay_before_s"] - mine["delay_before_s"]))
    if not skews:
        return {"skew_s": None, "after_s": None, "skew_delay_s": None}
    return {"skew_s": statistics.median(skews), "after_s": statistics.median(afters),
            "skew_delay_s": statistics.median(delays)}


_PASS_THROUGH = ("split", "view", "unsafe_view", "reshape", "slice", "alias", "getitem", "squeeze",
                 "unsqueeze", "detach", "as_strided")
"""Operators a gradient bucket's result passes through on its way out of the program (views)."""


def gradient_bucket(node) -> bool:
    """Whether a collective node is a gradient bucket's all-reduce: an in-place all-reduce whose waited
    result only leaves the program (through views), read by no operator of the step.

    Example:
        >>> import torch
        >>> g = torch.fx.Graph(); x = g.placeholder("x")
        >>> c = g.call_function(torch.ops.aten.cat.default, ([x, x],))
        >>> r = g.call_function(torch.ops._c10d_functional.all_reduce_.default, (c, "sum", "0"))
        >>> w = g.call_function(torch.ops._c10d_functional.wait_tensor.default, (r,))
        >>> _ = g.output(w)
        >>> gradient_bucket(r)
        True
    """
    return str(node.target).endswith("all_reduce_.default") and _only_leaves(node, set())


def _only_leaves(node, seen: set) -> bool:
    """Whether every reader of ``node`` is the output, a wait or a view that itself only leaves."""
    for user in node.users:
        if user in seen or user.op == "output":
            continue
        seen.add(user)
        name = str(user.target) if hasattr(user.target, "_schema") else getattr(user.target, "__name__", "")
        passes = is_wait(user.target) or any(k in name for k in _PASS_THROUGH)
        if not passes or not _only_leaves(user, seen):
            return False
    return True


def price_collectives(rows: list[dict], cluster, nproc: int = 2) -> list[dict]:
    """Each row of :func:`comm_clocked_steps` with ``fit_s`` (the cluster's fit) and ``priced_s`` as the
    cost graph prices it: a gradient bucket at its fit, a collective hidden behind the program's compute
    (the main thread's CPU between its issue and its wait at least its fit: the label count the
    lowering hoists, the loss value it sinks) 0, any other blocking (fit plus the device's
    ``sync_point_s``); on a 1-D mesh of ``nproc`` devices of ``cluster`` (a name, path or
    :class:`~estimators.profiles.Cluster`).

    Example:
        >>> row = {"kind": "all_reduce", "bytes": 4096, "bucket": False, "overlap_cpu_s": 0.0}
        >>> got = price_collectives([row, {**row, "overlap_cpu_s": 0.05}], "cpu-local")
        >>> got[0]["priced_s"] > got[0]["fit_s"] > 0, got[1]["priced_s"]
        (True, 0.0)
    """
    from estimators.collectives import CommModel
    from estimators.configuration import Mesh
    from estimators.profiles import Cluster, load_cluster

    cl = cluster if isinstance(cluster, Cluster) else load_cluster(cluster)
    comm = CommModel(cl, Mesh((nproc,), ("gpu",)))
    out = []
    for r in rows:
        fit = comm.time_s(r["kind"], r["bytes"], (0,))
        if r["bucket"]:
            priced = fit
        elif r["overlap_cpu_s"] >= fit:
            priced = 0.0
        else:
            priced = comm.blocking_time_s(r["kind"], r["bytes"], (0,))
        out.append({**r, "fit_s": fit, "priced_s": priced})
    return out


_SUMMED = ("bytes", "fit_s", "priced_s", "issue_s", "overlap_s", "overlap_cpu_s", "wait_s", "exposed_s",
           "skew_s", "after_s", "skew_delay_s")


def group_name(row: dict) -> str:
    """A priced row's group: its kind, ``bucket`` / ``hidden`` (priced 0) apart, and its size class.

    Example:
        >>> group_name({"kind": "all_gather", "bytes": 2**20, "bucket": False, "priced_s": 1e-3})
        'all_gather 1-4 MiB'
    """
    what = " bucket" if row["bucket"] else " hidden" if row["priced_s"] == 0 else ""
    return f"{row['kind']}{what} {size_class(row['bytes'])}"


def collective_table(rows: list[dict]) -> list[dict]:
    """Priced rows (:func:`price_collectives`) grouped by :func:`group_name`: ``count`` and the sums per
    step of ``bytes``, ``fit_s``, ``priced_s``, ``issue_s``, ``overlap_s``, ``overlap_cpu_s``,
    ``wait_s``, ``exposed_s`` and (where the other ranks' clocks came) ``skew_s``, ``after_s``,
    ``skew_delay_s`` (:func:`arrival_split`).

    Example:
        >>> t = collective_table([{"kind": "all_reduce", "bytes": 10, "bucket": False, "fit_s": 1e-3,
        ...     "priced_s": 3e-3, "issue_s": 0.0, "overlap_s": 0.0, "overlap_cpu_s": 0.0, "wait_s": 2e-3,
        ...     "inflight": 0}])
        >>> t[0]["group"], t[0]["count"], t[0]["exposed_s"]
        ('all_reduce < 64 KiB', 1, 0.002)
    """
    groups: dict[str, dict] = {}
    for r in rows:
        name = group_name(r)
        g = groups.setdefault(name, {"group": name, "count": 0, **dict.fromkeys(_SUMMED, 0.0)})
        g["count"] += 1
        for field in _SUMMED:
            value = exposed_s(r) if field == "exposed_s" else r.get(field)
            g[field] += value or 0.0
    return sorted(groups.values(), key=lambda g: -g["priced_s"])


def print_collective_table(key: str, clocked: dict, cluster) -> list[dict]:
    """Print one plan's :func:`collective_table` (ms per step) and return it."""
    rows = price_collectives(clocked["collectives"], cluster)
    table = collective_table(rows)
    print(f"\n{key}: collectives per step, rank 0, ms (exposed = issue + wait = skew (until the last rank "
          "issued it) + after (from then to the wait's end); skew delay: of the skew, the later rank's "
          "extra run delay)")
    print(f"  {'kind, size':34} {'count':>5} {'MiB':>7} {'fit':>7} {'priced':>7} {'exposed':>7} {'skew':>7} "
          f"{'skew dl':>7} {'after':>7} {'overlap':>7} {'ovl CPU':>7}")
    total = {"group": "total", "count": sum(g["count"] for g in table),
             **{f: sum(g[f] for g in table) for f in _SUMMED}}
    for g in [*table, total]:
        print(f"  {g['group']:34} {g['count']:5d} {g['bytes'] / 2**20:7.2f} "
              + " ".join(f"{g[f] * 1e3:7.2f}" for f in ("fit_s", "priced_s", "exposed_s", "skew_s",
                                                          "skew_delay_s", "after_s", "overlap_s",
                                                          "overlap_cpu_s")))
    print(f"  step wall {clocked['step_s'] * 1e3:.1f} ms, main-thread CPU {clocked['step_cpu_s'] * 1e3:.1f} "
          f"ms, exposed collectives (median of the steps' sums) {clocked['exposed_s'] * 1e3:.1f} ms")
    return table
