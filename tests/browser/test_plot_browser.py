"""The Pareto page in headless Chromium: offline load, hover, click, panel, "Use this plan".

Points are hovered and clicked with the mouse at their pixel position, computed from plotly's
axes, so these tests exercise the same path a user's click takes.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tensoropt.plans import plan_file_text, unpack_frontier_json
from tensoropt.plot import write_pareto_html
from tensoropt.plot.details import embedded_ids

pytestmark = pytest.mark.browser

PIXEL_OF = """(id) => {
  const gd = document.getElementById("plot"), fl = gd._fullLayout, box = gd.getBoundingClientRect();
  for (const t of gd.data) {
    if (!t.meta || t.meta.kind !== "frontier") continue;
    const i = t.customdata.findIndex((cd) => cd[0] === id);
    if (i >= 0) return {x: box.left + fl.xaxis._offset + fl.xaxis.d2p(t.x[i]),
                        y: box.top + fl.yaxis._offset + fl.yaxis.d2p(t.y[i])};
  }
  return null;
}"""

RING_OF = """(kind) => {
  const t = document.getElementById("plot").data.find((t) => t.meta && t.meta.kind === kind);
  return t.customdata.map((cd) => cd[0]);
}"""


def _shown(value: float):
    """A number as the panel rounds it: 3 significant digits, 2 below 0.01."""
    return pytest.approx(value, rel=6e-3 if abs(value) >= 0.01 else 6e-2, abs=1e-12)


def _plans(frontier_json: dict) -> dict:
    return {p["id"]: (f["devices"], p) for f in frontier_json["frontiers"] for p in f["plans"]}


def _open(chromium, url: str):
    context = chromium.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
    page = context.new_page()
    requests, errors = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_selector("body[data-ready]", timeout=30_000)
    assert page.evaluate("document.body.dataset.ready") == "1", page.inner_text("#panel")
    return context, page, requests, errors


def _hover_and_click(page, plan_id: str, devices: int, plan: dict) -> None:
    pos = page.evaluate(PIXEL_OF, plan_id)
    assert pos, f"{plan_id} is not drawn"
    page.mouse.move(pos["x"], pos["y"])
    # plotly throttles hover: wait for this point's label, not a previous one still shown
    page.wait_for_function("""(id) => [...document.querySelectorAll(".hoverlayer .hovertext")]
        .some((e) => e.textContent.includes(id + " "))""", arg=plan_id, timeout=10_000)
    label = page.text_content(".hoverlayer .hovertext")
    assert plan_id in label and f"{devices} devices" in label, label
    numbers = {k: float(re.search(rf"{k}\s+([-+.e\d]+)", label).group(1))
               for k in ("step time", "throughput", "memory")}
    assert numbers["step time"] == pytest.approx(plan["time_s"], rel=1e-3)
    assert numbers["throughput"] == pytest.approx(plan["throughput_samples_per_s"], rel=1e-3)
    unit_bytes = page.evaluate("JSON.parse(document.getElementById('tensoropt-meta').textContent).unit_bytes")
    assert numbers["memory"] == pytest.approx(plan["memory_bytes"] / unit_bytes, rel=5e-3)
    assert plan["summary"].replace(" ", "") in label.replace(" ", "")
    page.mouse.click(pos["x"], pos["y"])
    page.wait_for_function("(id) => document.getElementById('plan-id')?.textContent === id", arg=plan_id)


def _check_panel(page, devices: int, plan: dict) -> None:
    facts = page.inner_text("#facts")
    assert f"{devices} (mesh" in facts and plan["summary"] in facts
    rows = page.eval_on_selector_all("#layers tbody tr", """rows => rows.map(r => ({
        node: r.dataset.node, op: r.querySelector('.op').title,
        module: r.querySelector('.module').textContent,
        config: r.querySelector('.config').textContent, compute: r.querySelector('.compute').textContent,
        comm: r.querySelector('.comm').textContent, memory: r.querySelector('.memory').textContent}))""")
    assert [r["node"] for r in rows] == [layer["node"] for layer in plan["layers"]]
    for row, layer in zip(rows, plan["layers"]):
        assert row["op"].startswith(layer["op"]) and row["module"] == (layer["module"] or "(top level)")
        assert row["config"] == layer["config"] == plan["ops"][layer["node"]]
        assert float(row["compute"]) == _shown(layer["compute_s"] * 1e3)
        assert float(row["comm"]) == _shown(layer["comm_s"] * 1e3)
        assert float(row["memory"]) == _shown(layer["memory_bytes"] / 2**20)


def test_file_page_offline_click_and_download(chromium, frontier_json, tmp_path):
    html = write_pareto_html(frontier_json, tmp_path / "pareto.html")
    context, page, requests, errors = _open(chromium, html.as_uri())
    try:
        # the selected plan is shown first and ringed
        assert page.text_content("#plan-id") == "d8-p1" and page.evaluate(RING_OF, "selected") == ["d8-p1"]
        plan_id = "d4-p3"
        devices, plan = _plans(frontier_json)[plan_id]
        _hover_and_click(page, plan_id, devices, plan)
        _check_panel(page, devices, plan)
        assert page.evaluate(RING_OF, "clicked") == [plan_id]
        assert page.text_content(".badge.fits") == "fits budget"

        with page.expect_download() as info:
            page.click("#use-plan")
        download = info.value
        assert download.suggested_filename == "plan.json"
        assert Path(download.path()).read_text() == plan_file_text(frontier_json, plan_id)
        command = f"tensoropt run JOB.yaml --plan plan.json --nproc {devices}"
        assert page.text_content("#run-command") == command
        assert page.is_visible("#run-command")

        # over-budget plans are dimmed and say so
        _hover_and_click(page, "d2-p0", *_plans(frontier_json)["d2-p0"])
        assert page.text_content(".badge.over") == "over budget"

        # the throughput toggle swaps y for samples/s on every series
        page.check("input[name=ymode][value=throughput]")
        ys = page.evaluate("""() => document.getElementById("plot").data
            .filter(t => t.meta.kind === "frontier").map(t => [t.customdata.map(c => c[0]), t.y])""")
        for ids, y in ys:
            for i, v in zip(ids, y):
                assert v == pytest.approx(64 / _plans(frontier_json)[i][1]["time_s"])
        assert page.evaluate("document.getElementById('plot')._fullLayout.yaxis.title.text") == \
            "Throughput (samples/s)"
        _hover_and_click(page, "d16-p2", *_plans(frontier_json)["d16-p2"])
    finally:
        context.close()
    assert not errors, errors
    offline = [u for u in requests if not u.startswith(("file:", "data:", "blob:"))]
    assert not offline, f"the page made network requests: {offline}"


def _not_embedded(frontier_json: dict, limit_mib: float) -> str:
    embedded = embedded_ids(frontier_json, frontier_json["selected"], limit_mib * 2**20)
    return next(i for i in _plans(frontier_json) if i.startswith("d16-") and i not in embedded)


def test_file_page_explains_plans_without_details(chromium, frontier_json, tmp_path):
    html = write_pareto_html(frontier_json, tmp_path / "pareto.html", embed_limit_bytes=0.05 * 2**20)
    context, page, requests, errors = _open(chromium, html.as_uri())
    try:
        plan_id = _not_embedded(frontier_json, 0.05)
        _hover_and_click(page, plan_id, *_plans(frontier_json)[plan_id])
        assert "tensoropt ui" in page.text_content("#no-details")
        assert page.query_selector("#use-plan") is None and page.query_selector("#layers") is None
    finally:
        context.close()
    assert not errors, errors


def _default_sigint() -> None:
    """In the child: Ctrl-C's default action, even when this test runs as a background job of a
    non-interactive shell (which starts it with SIGINT ignored, and Python keeps an ignored SIGINT)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_served_page_writes_plan_json(chromium, run_dir, frontier_json):
    """Served with a small embed limit: the clicked plan's details come from the server."""
    proc = subprocess.Popen([sys.executable, "-m", "tensoropt.cli", "ui", str(run_dir), "--job", "job.yaml",
                             "--embed-limit-mib", "0.05"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=_default_sigint)
    try:
        url = proc.stdout.readline().split(" at ")[1].split()[0]
        context, page, requests, errors = _open(chromium, url)
        plan_id = _not_embedded(frontier_json, 0.05)
        devices, plan = _plans(frontier_json)[plan_id]
        _hover_and_click(page, plan_id, devices, plan)
        _check_panel(page, devices, plan)
        page.click("#use-plan")
        page.wait_for_function("() => document.getElementById('use-status').textContent.startsWith('Wrote')")
        plan_path = run_dir / "plan.json"
        assert plan_path.read_text() == plan_file_text(frontier_json, plan_id)
        assert json.loads((run_dir / "frontier.json").read_text())["selected"] == plan_id
        command = page.text_content("#run-command")  # 16 devices = 2 machines of 8 (mesh levels)
        assert f"tensoropt run job.yaml --plan {plan_path} --nnodes 2 --nproc-per-node 8 --node-rank RANK" \
            in command and devices == 16
        assert page.evaluate(RING_OF, "selected") == [plan_id] and page.is_visible(".badge.selected")
        context.close()
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert not errors, errors
    assert all(u.startswith(url) for u in requests), requests


def test_page_on_another_web_server_still_downloads(chromium, frontier_json, tmp_path):
    """Over http but not from `tensoropt ui` (e.g. `python -m http.server`): download, no POST."""
    html = write_pareto_html(frontier_json, tmp_path / "pareto.html")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/{html.name}"
        context, page, requests, errors = _open(chromium, url)
        plan_id = "d2-p1"
        _hover_and_click(page, plan_id, *_plans(frontier_json)[plan_id])
        with page.expect_download() as info:
            page.click("#use-plan")
        assert Path(info.value.path()).read_text() == plan_file_text(frontier_json, plan_id)
        context.close()
    finally:
        server.shutdown()
        server.server_close()
    assert not errors, errors
    assert not any("/api/" in u for u in requests), requests


def test_page_written_by_tensoropt_plan(chromium, tmp_path):
    """End to end on real planner output: `tensoropt plan` writes the page; a plan from it runs as is."""
    from tensoropt.cli import main

    job = Path(__file__).resolve().parents[2] / "configs" / "jobs" / "cpu-demo.yaml"
    assert main(["plan", str(job), "--out", str(tmp_path), "--quiet"]) == 0
    frontier_json = unpack_frontier_json(json.loads((tmp_path / "frontier.json").read_text()))
    plans = _plans(frontier_json)
    plan_id = next(i for i in plans if i != frontier_json["selected"] and plans[i][0] > 1)
    context, page, requests, errors = _open(chromium, (tmp_path / "pareto.html").as_uri())
    try:
        assert page.text_content("#plan-id") == frontier_json["selected"]
        _hover_and_click(page, plan_id, *plans[plan_id])
        _check_panel(page, *plans[plan_id])
        with page.expect_download() as info:
            page.click("#use-plan")
        assert Path(info.value.path()).read_text() == plan_file_text(frontier_json, plan_id)
        assert page.text_content("#run-command").startswith(f"tensoropt run {job} --plan plan.json --nproc")
    finally:
        context.close()
    assert not errors, errors
    assert all(u.startswith(("file:", "data:", "blob:")) for u in requests), requests


def test_old_browser_unpacks_the_page_itself(chromium, frontier_json, tmp_path):
    """Without DecompressionStream (Firefox < 113, Safari < 16.4) the page's own inflate unpacks
    plotly.js and the plans: the chart draws, the panel shows the plan, the download is exact."""
    html = write_pareto_html(frontier_json, tmp_path / "pareto.html")
    context = chromium.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
    page = context.new_page()
    page.add_init_script("delete window.DecompressionStream")
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(html.as_uri())
        page.wait_for_selector("body[data-ready]", timeout=60_000)
        assert page.evaluate("document.body.dataset.ready") == "1", page.inner_text("#panel")
        assert page.evaluate("typeof DecompressionStream") == "undefined"
        assert page.evaluate("document.querySelectorAll('#plot .scatterlayer .trace').length") >= 5
        selected = frontier_json["selected"]
        plan = _plans(frontier_json)[selected][1]
        assert page.text_content("#plan-id") == selected
        assert page.evaluate("document.querySelectorAll('#layers tbody tr').length") == len(plan["layers"])
        with page.expect_download() as info:
            page.click("#use-plan")
        assert Path(info.value.path()).read_text() == plan_file_text(frontier_json, selected)
        assert not errors, errors
    finally:
        context.close()


FOREIGN_PAGE = """<!doctype html><title>another site</title><body><script>
(async () => {
  const target = "__TARGET__", body = JSON.stringify({plan_id: "d2-p1"}), tries = [];
  // a "simple" cross-site request: sent without asking, its answer unreadable (no-cors)
  tries.push(fetch(target, {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body}));
  // what the server's own page sends, with a guessed token: the browser asks first (preflight)
  tries.push(fetch(target, {method: "POST", headers: {"Content-Type": "application/json",
                                                      "X-Tensoropt-Token": "guess"}, body}));
  const settled = await Promise.allSettled(tries);
  document.body.dataset.done = JSON.stringify(settled.map((s) => s.status));
})();
</script></body>"""


def test_another_sites_page_cannot_select(chromium, server, run_dir):
    """A page from another origin, open in the same browser as `tensoropt ui`, posts to its API."""
    before = (run_dir / "frontier.json").read_bytes()
    site = run_dir / "elsewhere"
    site.mkdir()
    (site / "index.html").write_text(FOREIGN_PAGE.replace("__TARGET__", server.url + "api/select"))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    context = chromium.new_context()
    try:
        page = context.new_page()
        answers = []
        page.on("response", lambda r: answers.append((r.request.method, r.url, r.status)))
        page.goto(f"http://127.0.0.1:{other.server_address[1]}/index.html")
        page.wait_for_selector("body[data-done]", state="attached", timeout=30_000)
    finally:
        context.close()
        other.shutdown()
        other.server_close()
    to_ui = [(method, status) for method, url, status in answers if url.startswith(server.url)]
    assert ("POST", 403) in to_ui, f"the simple cross-site post must reach the server, refused: {answers}"
    assert ("POST", 200) not in to_ui, answers
    assert not (run_dir / "plan.json").exists()
    assert (run_dir / "frontier.json").read_bytes() == before


SHOWN = """() => document.getElementById("plot").data.filter((t) => t.meta && t.meta.kind === "frontier")
    .flatMap((t) => t.customdata.map((cd, i) => [cd[0], cd[10], t.x[i]]))"""


def test_micro_batch_filter_shows_the_plans_of_one_count(chromium, frontier_json, tmp_path):
    """Issue 25: the filter lists the counts the file holds and draws only the chosen count's plans."""
    for f in frontier_json["frontiers"]:
        for i, p in enumerate(f["plans"]):
            p["micro_batches"] = 1 + i % 2
    ids = {m: {p["id"] for f in frontier_json["frontiers"] for p in f["plans"] if p["micro_batches"] == m}
           for m in (1, 2)}
    html = write_pareto_html(frontier_json, tmp_path / "pareto.html")
    context, page, _, errors = _open(chromium, html.as_uri())
    try:
        options = page.eval_on_selector_all("#mbfilter option", "os => os.map((o) => o.value)")
        assert options == ["all", "1", "2"]
        page.select_option("#mbfilter", "2")
        page.wait_for_function(f"() => ({SHOWN})().length === {len(ids[2])}")
        shown = page.evaluate(SHOWN)
        assert {i for i, _, _ in shown} == ids[2] and {m for _, m, _ in shown} == {2}
        page.select_option("#mbfilter", "all")
        page.wait_for_function(f"() => ({SHOWN})().length === {len(ids[1] | ids[2])}")
        assert not errors, errors
    finally:
        context.close()
