"""Plain-text tables of frontiers and plans (what ``tensoropt plan``/``explain`` print).

Example:
    >>> print(format_table(["id", "time"], [["d1-p0", "1.0"]]))
    id     time
    -----  ----
    d1-p0  1.0
"""

from __future__ import annotations

from collections.abc import Sequence

from tensoropt.config import format_size
from tensoropt.plans import Frontier, Plan, PlanFile


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[int] = ()) -> str:
    """Align ``rows`` under ``headers`` (columns in ``right`` are right-aligned).

    Example:
        >>> format_table(["a", "bb"], [[1, 2]], right=[1]).splitlines()[2]
        '1   2'
    """
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        return "  ".join(parts).rstrip()

    return "\n".join([line(cells[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in cells[1:]])


def format_time(seconds: float) -> str:
    """Seconds with a readable unit.

    Example:
        >>> format_time(0.01234), format_time(2.5), format_time(3e-6), format_time(0)
        ('12.34 ms', '2.500 s', '3.0 us', '-')
    """
    if seconds == 0:
        return "-"
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def throughput(plan: Plan, global_batch_size: int | None) -> float | None:
    """Samples per second of a plan (None when the batch size is unknown)."""
    if plan.throughput_samples_per_s is not None:
        return plan.throughput_samples_per_s
    if global_batch_size and plan.time_s > 0:
        return global_batch_size / plan.time_s
    return None


def frontier_table(frontier: Frontier, global_batch_size: int | None = None, selected: str | None = None,
                   max_rows: int | None = None) -> str:
    """The table of one frontier: id, devices, micro-batches, step time, memory per device,
    throughput (samples/s; for token inputs tokens/s per device beside it), predicted MFU, split.

    Long frontiers show ``max_rows`` plans spread evenly (always the fastest and the smallest). The
    data-parallel plan (``d<P>-dp``) is listed last when it is the selected one (:mod:`tensoropt.selector`).

    Example:
        >>> from tensoropt.configspace.configuration import Mesh
        >>> f = Frontier(2, Mesh((2,), ("gpu",)), [Plan("d2-p0", 0.5, 2**30, {}, summary="fc: out=2",
        ...              micro_batches=4, tokens_per_s_per_device=65536.0, mfu=0.41)])
        >>> text = frontier_table(f, 64)
        >>> "fc: out=2" in text, "65,536/s" in text, "41.0%" in text, text.splitlines()[1].split()[:3]
        (True, True, True, ['id', 'devices', 'mb'])
    """
    plans = frontier.plans
    shown = list(range(len(plans)))
    if max_rows is not None and len(plans) > max_rows >= 2:
        shown = sorted({round(i * (len(plans) - 1) / (max_rows - 1)) for i in range(max_rows)})
    listed = [plans[i] for i in shown]
    dp = frontier.data_parallel
    if dp is not None and dp.id == selected:  # selected within the margin, off the frontier: shown too
        listed.append(dp)
    tokens = any(p.tokens_per_s_per_device is not None for p in listed)
    rows = []
    for p in listed:
        tput = throughput(p, global_batch_size)
        mark = "*" if p.id == selected else ""
        row = [mark + p.id, frontier.devices, p.micro_batches, format_time(p.time_s),
               format_size(p.memory_bytes), f"{tput:,.1f}/s" if tput is not None else "-"]
        if tokens:
            per_device = p.tokens_per_s_per_device
            row.append(f"{per_device:,.0f}/s" if per_device is not None else "-")
        row += [f"{100 * p.mfu:.1f}%" if p.mfu is not None else "-", p.summary]
        rows.append(row)
    headers = ["id", "devices", "mb", "step time", "memory/device", "throughput"]
    headers += ["tokens/s/device"] if tokens else []
    headers += ["MFU", "split"]
    text = format_table(headers, rows, right=list(range(1, len(headers) - 1)))
    mesh = "x".join(map(str, frontier.mesh.shape)) or "1"
    plural = "s" if frontier.devices != 1 else ""
    head = f"{frontier.devices} device{plural} (mesh {mesh}): {len(plans)} plans"
    if len(shown) < len(plans):
        head += f", {len(shown)} shown"
    return head + "\n" + text


def layers_table(plan_file: PlanFile) -> str:
    """Per-operator table of a plan: op, module, configuration, compute, communication, memory.

    Example:
        >>> from tensoropt.plans import Layer
        >>> from tensoropt.configspace.configuration import Mesh
        >>> p = Plan("d1-p0", 1.0, 8, {"fc": "replicate"}, layers=[Layer("fc", "aten.linear.default",
        ...          "fc", "replicate", 0.5, 0.0, 8)])
        >>> "linear.default" in layers_table(PlanFile(p, 1, Mesh((), ()), {}, {}))
        True
    """
    rows = [[x.node, x.op.removeprefix("aten."), x.module or "-", x.config, format_time(x.compute_s),
             format_time(x.comm_s), format_size(x.memory_bytes)] for x in plan_file.plan.layers]
    headers = ["node", "op", "module", "config", "compute", "comm", "memory"]
    return format_table(headers, rows, right=[4, 5, 6])


def redistributions_table(plan_file: PlanFile) -> str:
    """Table of the redistributions between operators that cost time or memory.

    Example:
        >>> from tensoropt.plans import Redistribution
        >>> from tensoropt.configspace.configuration import Mesh
        >>> p = Plan("d2-p0", 1.0, 8, {}, redistributions=[Redistribution("a", "b", ["S(0)"], ["R"], 1e-3)])
        >>> "S(0) -> R" in redistributions_table(PlanFile(p, 2, Mesh((2,), ("gpu",)), {}, {}))
        True
    """
    rows = [[r.src, r.dst, f"{','.join(r.from_layout) or '-'} -> {','.join(r.to_layout) or '-'}"
             + (f" (tied {r.tied_param})" if r.tied_param else ""),
             format_time(r.time_s)] for r in plan_file.plan.redistributions]
    return format_table(["from node", "to node", "placements", "time"], rows, right=[3])
