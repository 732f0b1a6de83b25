"""The Pareto page without a browser: data extraction, figure, embedded plans, `tensoropt plot`."""

from __future__ import annotations

import base64
import gzip
import json
import re

import pytest
from plotly.offline import get_plotlyjs

from tensoropt.cli import main
from tensoropt.plans import largest_transient_of_rows, plan_file_text
from tensoropt.plot import pareto_html
from tensoropt.plot.data import GIB, memory_unit, page_points
from tensoropt.plot.details import embedded_ids, page_payload
from tensoropt.plot.figure import DIMMED_OPACITY, pareto_figure
from tensoropt.plot.plan_texts import joined_text


def _script(page: str, element_id: str) -> str:
    m = re.search(rf'<script type="[^"]+" id="{element_id}">(.*?)</script>', page, re.S)
    assert m, f"no <script id={element_id}> in the page"
    return m.group(1)


def _data(page: str) -> dict:
    """The page's embedded plans, each plan.json text put together from its pieces."""
    data = json.loads(gzip.decompress(base64.b64decode(_script(page, "tensoropt-data"))))
    data["texts"] = {i: joined_text(data["pieces"], runs) for i, runs in data["texts"].items()}
    return data


def test_points_follow_the_file(frontier_json):
    budget = frontier_json["job"]["memory_budget"]
    points = page_points(frontier_json, budget)
    plans = {p["id"]: (f["devices"], p) for f in frontier_json["frontiers"] for p in f["plans"]}
    assert [p.plan_id for p in points] == list(plans)
    for point in points:
        devices, plan = plans[point.plan_id]
        assert point.devices == devices
        assert point.memory_gib == pytest.approx(plan["memory_bytes"] / GIB)
        assert point.throughput == pytest.approx(64 / plan["time_s"])
        peak = plan["memory_bytes"] + largest_transient_of_rows(plan.get("layers", []))
        assert point.peak_memory_bytes == pytest.approx(peak)
        assert point.fits == (peak <= budget)
    assert {p.fits for p in points} == {True, False}, "the fixture needs plans on both sides of the budget"


def test_a_plan_fits_by_its_peak_not_its_memory():
    """The budget is checked against memory + the largest transient, as `select` checks it: a plan
    whose memory fits but whose recompute transient does not is drawn over budget."""
    row = {"node": "fc", "op": "aten.linear.default", "module": "fc", "config": "r", "compute_s": 0.0,
           "comm_s": 0.0, "memory_bytes": 0}
    plans = [{"id": "d1-p0", "time_s": 1.0, "memory_bytes": 1.5 * GIB,
              "layers": [{**row, "recompute_chain_bytes": 1.0 * GIB}]},
             {"id": "d1-p1", "time_s": 2.0, "memory_bytes": 1.5 * GIB,
              "layers": [{**row, "buffer_bytes": 0.25 * GIB}]}]
    points = page_points({"job": {}, "frontiers": [{"devices": 1, "plans": plans}]}, budget_bytes=2 * GIB)
    assert [p.fits for p in points] == [False, True]
    assert points[0].peak_memory_bytes == 2.5 * GIB
    hover = pareto_figure(points, 2 * GIB, None)["data"][0]["customdata"][0][-1]
    assert "peak  2.5 GiB" in hover


def test_malformed_plan_names_the_field(frontier_json):
    frontier_json["frontiers"][2]["plans"][1]["time_s"] = "fast"
    with pytest.raises(ValueError, match=r"frontiers\[2\]\.plans\[1\]\.time_s must be a number"):
        page_points(frontier_json, None)


def test_figure_series_budget_and_selection(frontier_json):
    budget = frontier_json["job"]["memory_budget"]
    fig = pareto_figure(page_points(frontier_json, budget), budget, "d8-p1")
    series = [t for t in fig["data"] if t["meta"]["kind"] == "frontier"]
    assert [t["meta"]["devices"] for t in series] == [1, 2, 4, 8, 16]
    assert len({t["marker"]["color"] for t in series}) == 5
    assert len({t["marker"]["symbol"] for t in series}) == 5
    for t in series:
        for cd, opacity in zip(t["customdata"], t["marker"]["opacity"]):
            assert opacity == (1.0 if cd[3] * GIB <= budget else DIMMED_OPACITY), cd[0]
    (ring,) = [t for t in fig["data"] if t["meta"]["kind"] == "selected"]
    assert [cd[0] for cd in ring["customdata"]] == ["d8-p1"]
    lines = [s for s in fig["layout"]["shapes"] if s["type"] == "line"]
    assert len(lines) == 1 and lines[0]["x0"] == lines[0]["x1"] == pytest.approx(budget / GIB)
    assert "budget" in fig["layout"]["annotations"][0]["text"]
    assert fig["layout"]["xaxis"]["title"]["text"] == "Memory per device (GiB)"
    assert fig["layout"]["yaxis"]["title"]["text"] == "Step time (s)"


def test_small_models_use_mib(frontier_json):
    for f in frontier_json["frontiers"]:
        for p in f["plans"]:
            p["memory_bytes"] /= 1024
    points = page_points(frontier_json, 2**20)
    assert memory_unit(points) == ("MiB", 2**20)
    fig = pareto_figure(points, 2**20, None, memory_unit(points))
    assert fig["layout"]["xaxis"]["title"]["text"] == "Memory per device (MiB)"
    assert fig["layout"]["shapes"][1]["x0"] == pytest.approx(1.0)
    trace = fig["data"][0]
    assert trace["x"][0] == trace["customdata"][0][3] == pytest.approx(points[0].memory_bytes / 2**20)
    assert "MiB / device" in trace["hovertemplate"]


def test_far_budget_is_a_label_not_an_axis_stretch(frontier_json):
    points = page_points(frontier_json, 64 * GIB)
    fig = pareto_figure(points, 64 * GIB, None)
    assert fig["layout"]["shapes"] == [] and all(p.fits for p in points)
    (label,) = fig["layout"]["annotations"]
    assert "64 GiB" in label["text"] and "every plan fits" in label["text"] and label["xref"] == "paper"


def test_page_embeds_exact_plan_files_and_plotly(frontier_json):
    page = pareto_html(frontier_json)
    assert "<script src=" not in page and "<link" not in page, "the page must not load anything"
    assert "Plotly.newPlot" in page, "the page script must be inlined"
    plotly = gzip.decompress(base64.b64decode(_script(page, "tensoropt-plotly"))).decode()
    assert plotly == get_plotlyjs(), "plotly.js must be inlined (compressed)"
    data = _data(page)
    ids = [p["id"] for f in frontier_json["frontiers"] for p in f["plans"]]
    assert sorted(data["texts"]) == sorted(ids)
    for plan_id in ids:
        assert data["texts"][plan_id] == plan_file_text(frontier_json, plan_id)
    meta = json.loads(_script(page, "tensoropt-meta"))
    assert meta["selected"] == "d8-p1" and meta["batch"] == 64
    assert meta["memory_unit"] == "GiB" and meta["unit_bytes"] == GIB
    assert meta["budget_x"] == pytest.approx(frontier_json["job"]["memory_budget"] / GIB)
    figure = json.loads(_script(page, "tensoropt-figure"))
    assert sum(len(t["x"]) for t in figure["data"] if t["meta"]["kind"] == "frontier") == len(ids)


def test_script_text_cannot_close_its_element(frontier_json):
    frontier_json["frontiers"][1]["plans"][0]["summary"] = "evil </script><script>alert(1)</script> __CSS__"
    page = pareto_html(frontier_json)
    assert "</script><script>alert" not in page
    assert page.count("--muted:") == 1, "a placeholder inside the data must not be filled"
    figure = json.loads(_script(page, "tensoropt-figure"))
    assert any("evil </script>" in str(t["customdata"]) for t in figure["data"])


def test_cli_plot_writes_the_page(run_dir, capsys):
    out = run_dir / "p.html"
    assert main(["plot", str(run_dir / "frontier.json"), "-o", str(out), "--memory-budget", "512MiB"]) == 0
    assert "34 plans" in capsys.readouterr().out
    meta = json.loads(_script(out.read_text(), "tensoropt-meta"))
    assert meta["budget_x"] == pytest.approx(0.5)
    assert main(["plot", str(run_dir)]) == 0
    assert (run_dir / "pareto.html").stat().st_size > 1_500_000  # plotly.js, compressed


def test_cli_plot_bad_input(run_dir, capsys):
    assert main(["plot", str(run_dir / "missing.json")]) == 1
    assert "missing.json" in capsys.readouterr().err
    assert main(["plot", str(run_dir), "--memory-budget", "lots"]) == 1
    assert "--memory-budget" in capsys.readouterr().err


def test_large_frontiers_embed_an_even_subset(frontier_json):
    ids = [p["id"] for f in frontier_json["frontiers"] for p in f["plans"]]
    assert embedded_ids(frontier_json, "d8-p1", 10**9) == ids
    size = len(plan_file_text(frontier_json, "d16-p0"))
    subset = embedded_ids(frontier_json, "d8-p5", 8 * size)
    assert len(subset) < len(ids) and "d8-p5" in subset
    for f in frontier_json["frontiers"]:
        plans = [p["id"] for p in f["plans"]]
        assert plans[0] in subset and plans[-1] in subset, "fastest and smallest plan always embedded"
    # the page's limit applies to the pieces of text the plans share (each stored once)
    every = [p.plan_id for p in page_points(frontier_json, None)]
    shared = sum(map(len, page_payload(frontier_json, page_points(frontier_json, None), every)["pieces"]))
    assert shared < sum(len(plan_file_text(frontier_json, i)) for i in ids) / 2
    page = pareto_html(frontier_json, embed_limit_bytes=shared / 3)
    data = _data(page)
    expected = sorted(embedded_ids(frontier_json, "d8-p1", shared / 3, total_bytes=shared))
    assert len(expected) < len(ids)
    assert sorted(data["texts"]) == sorted(data["plans"]) == expected
    meta = json.loads(_script(page, "tensoropt-meta"))
    assert (meta["embedded"], meta["plans"]) == (len(data["texts"]), len(ids))
