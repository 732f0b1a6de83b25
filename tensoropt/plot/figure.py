"""The plotly figure of the Pareto page: one series per device count, budget line, selection.

Trace order (the page script relies on it): one trace per device count (``meta.kind ==
"frontier"``), then the "selected plan" ring (``meta.kind == "selected"``), then the "clicked
plan" ring (``meta.kind == "clicked"``). Every frontier point carries ``customdata = [plan id,
devices, time_s, memory GiB, throughput or None, summary, fits, ...hover text]`` so the page
can switch the y axis between step time and throughput without re-reading the file.
"""

from __future__ import annotations

import textwrap

import plotly.graph_objects as go

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

_HOVER = (
    "<b>%{customdata[0]}</b>  ·  %{customdata[1]} devices<br>"
    "step time  %{customdata[2]:.4g} s<br>"
    "throughput  %{customdata[9]} samples/s<br>"
    "memory  %{customdata[3]:.3g} GiB / device%{customdata[7]}<br>"
    "<i>%{customdata[8]}</i><extra></extra>"
)


def pareto_figure(points: list[PlotPoint], budget_bytes: int | None, selected: str | None) -> go.Figure:
    """Build the figure (y = step time; the page toggles to throughput).

    Args:
        points: the plans, from :func:`tensoropt.plot.data.page_points`.
        budget_bytes: per-device memory budget, drawn as a vertical line; None draws none.
        selected: id of the selected plan (highlighted with a ring), or None.

    Returns:
        A plotly Figure whose traces follow the order in the module docstring.

    Example:
        >>> from tensoropt.plot.data import PlotPoint
        >>> p = PlotPoint("d1-p0", 1, 0.2, 2**30, 320.0, "all: replicate", True)
        >>> [t.name for t in pareto_figure([p], None, "d1-p0").data]
        ['1 device', 'selected plan', 'clicked plan']
    """
    fig = go.Figure()
    device_counts = sorted({p.devices for p in points})
    for k, devices in enumerate(device_counts):
        series = sorted((p for p in points if p.devices == devices), key=lambda p: p.memory_bytes)
        colour = COLOURS[k % len(COLOURS)]
        fig.add_trace(
            go.Scatter(
                x=[p.memory_gib for p in series],
                y=[p.time_s for p in series],
                customdata=[_customdata(p) for p in series],
                name=f"{devices} device{'s' if devices > 1 else ''}",
                legendgroup=str(devices),
                mode="lines+markers",
                line={"shape": "hv", "width": 1.2, "dash": "dot", "color": colour},
                marker={
                    "symbol": SYMBOLS[k % len(SYMBOLS)],
                    "size": 11,
                    "color": colour,
                    "opacity": [1.0 if p.fits else DIMMED_OPACITY for p in series],
                    "line": {"width": 1, "color": "white"},
                },
                hovertemplate=_HOVER,
                meta={"kind": "frontier", "devices": devices},
            )
        )
    chosen = [p for p in points if p.plan_id == selected]
    fig.add_trace(_ring("selected plan", chosen, "#111111", "solid", "selected"))
    fig.add_trace(_ring("clicked plan", [], "#D55E00", "dot", "clicked"))
    _add_budget(fig, budget_bytes, points)
    fig.update_layout(
        template="plotly_white",
        font={"family": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", "size": 13},
        margin={"l": 70, "r": 10, "t": 40, "b": 60},
        hovermode="closest",
        hoverlabel={"bgcolor": "white", "font": {"size": 12}, "align": "left"},
        clickmode="event",
        dragmode="zoom",
        legend={
            "title": {"text": "Device count"},
            "orientation": "v",
            "x": 1.01,
            "xanchor": "left",
            "y": 1.0,
            "yanchor": "top",
            "itemclick": "toggle",
        },
        xaxis={"title": {"text": "Memory per device (GiB)"}, "rangemode": "tozero", "zeroline": False},
        yaxis={"title": {"text": "Step time (s)"}, "rangemode": "tozero", "zeroline": False},
    )
    return fig


def _customdata(p: PlotPoint) -> list:
    """The per-point payload the hover label and the page script read."""
    throughput = "n/a" if p.throughput is None else f"{p.throughput:.4g}"
    over = "" if p.fits else "  <b>(over budget)</b>"
    summary = "<br>".join(textwrap.wrap(p.summary, 60)) or "(no summary)"
    return [p.plan_id, p.devices, p.time_s, p.memory_gib, p.throughput, p.summary, p.fits, over, summary,
            throughput]


def _ring(name: str, chosen: list[PlotPoint], colour: str, dash: str, kind: str) -> go.Scatter:
    """An open circle drawn around one plan (legend entry, no hover of its own)."""
    return go.Scatter(
        x=[p.memory_gib for p in chosen],
        y=[p.time_s for p in chosen],
        customdata=[_customdata(p) for p in chosen],
        name=name,
        mode="markers",
        marker={"symbol": "circle-open", "size": 24, "color": colour, "line": {"width": 2.5}},
        hoverinfo="skip",
        showlegend=kind == "selected" and bool(chosen),
        meta={"kind": kind},
    )


def _add_budget(fig: go.Figure, budget_bytes: int | None, points: list[PlotPoint]) -> None:
    """Vertical budget line with its label above the plot area, and a light over-budget band."""
    if budget_bytes is None:
        return
    budget_gib = budget_bytes / GIB
    right_gib = max([budget_gib] + [p.memory_gib for p in points]) * 1.04
    fig.add_shape(
        type="rect", xref="x", yref="paper", x0=budget_gib, x1=right_gib, y0=0, y1=1,
        fillcolor="#D55E00", opacity=0.06, line={"width": 0}, layer="below",
    )
    fig.add_shape(
        type="line", xref="x", yref="paper", x0=budget_gib, x1=budget_gib, y0=0, y1=1,
        line={"color": "#B03A00", "width": 2, "dash": "dash"},
    )
    fig.add_annotation(
        x=budget_gib, y=1.0, xref="x", yref="paper", yanchor="bottom", showarrow=False,
        text=f"memory budget {budget_gib:.3g} GiB", font={"color": "#B03A00", "size": 12},
    )
