"""`tensoropt ui` without a browser: the HTTP API, the atomic writes, and a clean stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from tensoropt.cli import main
from tensoropt.plans import plan_file_text
from tensoropt.plot.request_guard import TOKEN_HEADER
from tensoropt.plot.server import ParetoServer


def _post(server: ParetoServer, body: bytes) -> tuple[int, dict]:
    """POST /api/select as the server's own page does (its token in the header)."""
    req = urllib.request.Request(server.url + "api/select", data=body,
                                 headers={"Content-Type": "application/json", TOKEN_HEADER: server.token})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_select_writes_plan_and_records_selection(server, run_dir, frontier_json):
    status, body = _post(server, json.dumps({"plan_id": "d4-p3"}).encode())
    assert status == 200, body
    assert (run_dir / "plan.json").read_text() == plan_file_text(frontier_json, "d4-p3")
    assert json.loads((run_dir / "frontier.json").read_text())["selected"] == "d4-p3"
    assert body["command"] == f"tensoropt run job.yaml --plan {run_dir / 'plan.json'} --nproc 4"
    assert not [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")], "temporary files left behind"
    with urllib.request.urlopen(server.url, timeout=10) as resp:
        assert '"selected": "d4-p3"' in resp.read().decode(), "the page must show the new selection"
    status, body = _post(server, json.dumps({"plan_id": "d16-p1"}).encode())
    assert status == 200 and "--nnodes 2 --nproc-per-node 8 --node-rank RANK" in body["command"]


def test_page_follows_changes_made_elsewhere(server, run_dir, frontier_json):
    """E.g. `tensoropt select` run while the server is up: the next page load shows its choice."""
    frontier_json["selected"] = "d2-p3"
    (run_dir / "frontier.json").write_text(json.dumps(frontier_json, indent=1) + "\n")
    with urllib.request.urlopen(server.url, timeout=10) as resp:
        assert '"selected": "d2-p3"' in resp.read().decode()


def test_plan_details_on_request(server, frontier_json):
    with urllib.request.urlopen(server.url + "api/plan?id=d2-p1", timeout=10) as resp:
        body = json.loads(resp.read())
    assert body["text"] == plan_file_text(frontier_json, "d2-p1")
    plan = frontier_json["frontiers"][1]["plans"][1]
    assert body["plan"]["layers"] == plan["layers"] and body["plan"]["devices"] == 2
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(server.url + "api/plan?id=d2-p99", timeout=10)
    assert err.value.code == 404 and "d2-p99" in json.loads(err.value.read())["error"]


@pytest.mark.parametrize(("body", "status", "message"), [
    (b'{"plan_id": "d3-p9"}', 404, "no plan 'd3-p9'"),
    (b"not json", 400, "plan_id"),
    (b'{"plan": "d4-p1"}', 400, "plan_id"),
])
def test_bad_requests_write_nothing(server, run_dir, body, status, message):
    before = (run_dir / "frontier.json").read_text()
    got_status, got = _post(server, body)
    assert got_status == status and message in got["error"]
    assert not (run_dir / "plan.json").exists()
    assert (run_dir / "frontier.json").read_text() == before


def test_cli_ui_prints_url_and_stops_on_sigterm(run_dir):
    """(Ctrl-C, SIGINT, is covered by the browser test of the served page.)"""
    proc = subprocess.Popen([sys.executable, "-m", "tensoropt.cli", "ui", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stdout.readline()
        url = line.split(" at ")[1].split()[0]
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert resp.status == 200 and b"Plotly.newPlot" in resp.read()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "stopped" in out and "Traceback" not in err


def test_cli_ui_bad_input(tmp_path, run_dir, capsys):
    assert main(["ui", str(tmp_path / "nowhere")]) == 1
    assert "frontier.json" in capsys.readouterr().err
    assert main(["ui", str(run_dir), "--port", "70000"]) == 1
    assert "--port" in capsys.readouterr().err
