"""The plotly figure of the Pareto page: one series per device count, budget line, selection.

Trace order (the page script relies on it): one trace per device count (``meta.kind ==
"frontier"``), then the "selected plan" ring (``meta.kind == "selected"``), then the "clicked
plan" ring (``meta.kind == "clicked"``). Every frontier point carries ``customdata = [plan id,
devices, time_s, memory (in the page's unit), throughput or None, summary, fits, ...hover text,
micro-batches (10), tokens/s and MFU hover text (11)]`` so the page can switch the y axis between
step time and throughput, and filter by micro-batch count, without re-reading the file.
"""

from __future__ import annotations

import textwrap

import plotly.io as pio

from tensoropt.plot.data import GIB, PlotPoint

COLOURS = (
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9",
    "#8C564B", "#332288", "#999933", "#882255", "#666666", "#000000",
)
"""Okabe-Ito first (colour-blind safe), then Tol's muted colours for more device counts."""

SYMBOLS = (
    "circle", "square", "diamond", "triangle-up", "triangle-down", "pentagon",
    "hexagon", "star", "cross", "x", "triangle-left", "triangle-right",
)
"""One marker symbol per device count, in step with :data:`COLOURS`."""

DIMMED_OPACITY = 0.35
"""Opacity of points over the memory budget."""

BUDGET_OFF_AXIS = 1.6
"""A budget above this multiple of the largest plan's memory is not drawn on the axis."""

_HOVER = (
    "<b>%{customdata[0]}</b>  ·  %{customdata[1]} devices<br>"
    "step time  %{customdata[2]:.4g} s<br>"
    "throughput  %{customdata[9]} samples/s%{customdata[11]}<br>"
    "micro-batches  %{customdata[10]} per step<br>"
    "memory  %{customdata[3]:.3g} __UNIT__ / device%{customdata[7]}<br>"
    "<i>%{customdata[8]}</i><extra></extra>"
)


def pareto_figure(
    points: list[PlotPoint],
    budget_bytes: int | None,
    selected: str | None,
    unit: tuple[str, int] = ("GiB", GIB),
) -> dict:
    """Build the figure as a plotly.js figure dict (y = step time; the page toggles to throughput).

    Plain dicts, not ``plotly.graph_objects``: per-property validation of thousands of points
    costs seconds, and the page hands the dict straight to ``Plotly.newPlot``.

    Args:
        points: the plans, from :func:`tensoropt.plot.data.page_points`.
        budget_bytes: per-device memory budget, drawn as a vertical line; None draws none.
        selected: id of the selected plan (highlighted with a ring), or None.
        unit: memory unit of the x axis, ``(name, bytes)``, e.g. from :func:`memory_unit`.

    Returns:
        ``{"data": [...], "layout": {...}}`` with traces in the order of the module docstring.

    Example:
        >>> from tensoropt.plot.data import PlotPoint
        >>> p = PlotPoint("d1-p0", 1, 0.2, 2**30, 320.0, "all: replicate", True)
        >>> [t["name"] for t in pareto_figure([p], None, "d1-p0")["data"]]
        ['1 device', 'selected plan', 'clicked plan']
    """
    name, unit_bytes = unit
    mem = {p.plan_id: p.memory_bytes / unit_bytes for p in points}
    data = []
    device_counts = sorted({p.devices for p in points})
    for k, devices in enumerate(device_counts):
        series = sorted((p for p in points if p.devices == devices), key=lambda p: p.memory_bytes)
        colour = COLOURS[k % len(COLOURS)]
        data.append({
            "type": "scatter",
            "x": [mem[p.plan_id] for p in series],
            "y": [p.time_s for p in series],
            "customdata": [_customdata(p, mem[p.plan_id]) for p in series],
            "name": f"{devices} device{'s' if devices > 1 else ''}",
            "legendgroup": str(devices),
            "mode": "lines+markers",
            "line": {"shape": "hv", "width": 1.2, "dash": "dot", "color": colour},
            "marker": {
                "symbol": SYMBOLS[k % len(SYMBOLS)],
                "size": marker_size(len(series)),
                "color": colour,
                "opacity": [1.0 if p.fits else DIMMED_OPACITY for p in series],
                "line": {"width": 1 if len(series) <= 200 else 0, "color": "white"},
            },
            "hovertemplate": _HOVER.replace("__UNIT__", name),
            "meta": {"kind": "frontier", "devices": devices},
        })
    chosen = [p for p in points if p.plan_id == selected]
    data.append(_ring("selected plan", chosen, mem, "#111111", "selected"))
    data.append(_ring("clicked plan", [], mem, "#D55E00", "clicked"))
    layout = {
        "template": _template(),
        "font": {"family": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", "size": 13},
        "margin": {"l": 70, "r": 10, "t": 40, "b": 60},
        "hovermode": "closest",
        "hoverlabel": {"bgcolor": "white", "font": {"size": 12}, "align": "left"},
        "clickmode": "event",
        "dragmode": "zoom",
        "legend": {"title": {"text": "Device count"}, "orientation": "v", "x": 1.01, "xanchor": "left",
                   "y": 1.0, "yanchor": "top", "itemclick": "toggle"},
        "xaxis": {"title": {"text": f"Memory per device ({name})"}, "rangemode": "tozero", "zeroline": False},
        "yaxis": {"title": {"text": "Step time (s)"}, "rangemode": "tozero", "zeroline": False},
        "shapes": [],
        "annotations": [],
    }
    _add_budget(layout, budget_bytes, points, unit)
    return {"data": data, "layout": layout}


def marker_size(n_points: int) -> int:
    """Marker size for a series of ``n_points`` (smaller when hundreds overlap).

    Example:
        >>> marker_size(10), marker_size(900)
        (11, 6)
    """
    return 11 if n_points <= 40 else 8 if n_points <= 200 else 6


def _template() -> dict:
    """plotly's "plotly_white" template as plain JSON."""
    return pio.templates["plotly_white"].to_plotly_json()


def _customdata(p: PlotPoint, memory: float) -> list:
    """The per-point payload the hover label and the page script read."""
    throughput = "n/a" if p.throughput is None else f"{p.throughput:.4g}"
    over = "" if p.fits else "  <b>(over budget)</b>"
    summary = "<br>".join(textwrap.wrap(p.summary, 60)) or "(no summary)"
    units = ""
    if p.tokens_per_s_per_device is not None:
        units += f"<br>tokens  {p.tokens_per_s_per_device:,.0f}/s per device"
    if p.mfu is not None:
        units += f"<br>predicted MFU  {100 * p.mfu:.1f}%"
    if p.peak_memory_bytes is not None and p.peak_memory_bytes != p.memory_bytes:
        units += f"<br>peak  {p.peak_memory_bytes / 2**30:.4g} GiB (its tensors' peak in the step)"
    return [p.plan_id, p.devices, p.time_s, memory, p.throughput, p.summary, p.fits, over, summary,
            throughput, p.micro_batches, units]


def _ring(name: str, chosen: list[PlotPoint], mem: dict, colour: str, kind: str) -> dict:
    """An open circle drawn around one plan (legend entry, no hover of its own)."""
    return {
        "type": "scatter",
        "x": [mem[p.plan_id] for p in chosen],
        "y": [p.time_s for p in chosen],
        "customdata": [_customdata(p, mem[p.plan_id]) for p in chosen],
        "name": name,
        "mode": "markers",
        "marker": {"symbol": "circle-open", "size": 24, "color": colour, "line": {"width": 2.5}},
        "hoverinfo": "skip",
        "showlegend": kind == "selected" and bool(chosen),
        "meta": {"kind": kind},
    }


def _add_budget(layout: dict, budget_bytes: int | None, points: list[PlotPoint], unit: tuple[str, int]
                ) -> None:
    """Budget line with its label above the plot and a light over-budget band; or, when the
    budget lies far right of every plan, only a label saying so (the axis stays on the plans)."""
    if budget_bytes is None:
        return
    name, unit_bytes = unit
    budget_x = budget_bytes / unit_bytes
    data_max = max(p.memory_bytes for p in points) / unit_bytes
    colour = "#B03A00"
    if budget_x > BUDGET_OFF_AXIS * data_max:
        layout["annotations"].append({
            "x": 1.0, "y": 1.0, "xref": "paper", "yref": "paper", "xanchor": "right", "yanchor": "bottom",
            "showarrow": False, "font": {"color": colour, "size": 12},
            "text": f"memory budget {budget_x:.3g} {name} lies beyond the axis: every plan fits →",
        })
        return
    right = max(budget_x, data_max) * 1.04
    layout["shapes"] += [
        {"type": "rect", "xref": "x", "yref": "paper", "x0": budget_x, "x1": right, "y0": 0, "y1": 1,
         "fillcolor": colour, "opacity": 0.06, "line": {"width": 0}, "layer": "below"},
        {"type": "line", "xref": "x", "yref": "paper", "x0": budget_x, "x1": budget_x, "y0": 0, "y1": 1,
         "line": {"color": colour, "width": 2, "dash": "dash"}},
    ]
    layout["annotations"].append({
        "x": budget_x, "y": 1.0, "xref": "x", "yref": "paper", "yanchor": "bottom", "showarrow": False,
        "text": f"memory budget {budget_x:.3g} {name}", "font": {"color": colour, "size": 12},
    })
