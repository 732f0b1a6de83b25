"""The Pareto page shows each plan's micro-batch count (hover and a filter) and, for token inputs,
tokens/s per device and the predicted MFU."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "browser"))

from frontier_fixture import make_frontier_json  # noqa: E402

from tensoropt.plot import write_pareto_html  # noqa: E402
from tensoropt.plot.data import page_points  # noqa: E402
from tensoropt.plot.figure import pareto_figure  # noqa: E402


def _with_counts() -> dict:
    fj = copy.deepcopy(make_frontier_json())
    for f in fj["frontiers"]:
        for i, p in enumerate(f["plans"]):
            p["micro_batches"] = 1 + i % 3
            p["tokens_per_s_per_device"] = 1000.0 * (i + 1)
            p["mfu"] = 0.1 * (i % 5)
    return fj


def test_points_carry_the_count_and_the_units_and_the_hover_shows_them():
    fj = _with_counts()
    points = page_points(fj, budget_bytes=None)
    plans = [p for f in sorted(fj["frontiers"], key=lambda f: f["devices"]) for p in f["plans"]]
    assert [p.micro_batches for p in points] == [p["micro_batches"] for p in plans]
    assert [p.mfu for p in points] == [p["mfu"] for p in plans]
    figure = pareto_figure(points, None, None)
    trace = figure["data"][0]
    assert "micro-batches  %{customdata[10]} per step" in trace["hovertemplate"]
    first = trace["customdata"][0]
    plan = next(p for p in plans if p["id"] == first[0])
    assert first[10] == plan["micro_batches"]
    assert f"tokens  {plan['tokens_per_s_per_device']:,.0f}/s per device" in first[11]
    assert f"predicted MFU  {100 * plan['mfu']:.1f}%" in first[11]


def test_an_older_file_reads_as_one_micro_batch_without_units(tmp_path):
    points = page_points(make_frontier_json(), budget_bytes=None)
    assert {p.micro_batches for p in points} == {1} and {p.mfu for p in points} == {None}
    html = write_pareto_html(_with_counts(), tmp_path / "pareto.html").read_text()
    assert 'id="mbfilter"' in html and "setMicroBatches" in html
