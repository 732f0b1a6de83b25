"""`tensoropt ui` answers only its own page: raw HTTP requests from elsewhere get 403 and change nothing.

The requests are written byte by byte with http.client (no browser adds or fixes headers), as
another web page, a DNS-rebound name or a local program could send them.
"""

from __future__ import annotations

import http.client
import json
import re

import pytest

from tensoropt.plot.request_guard import TOKEN_HEADER
from tensoropt.plot.server import ParetoServer


def _request(server: ParetoServer, method: str, path: str, headers: dict,
             body: bytes = b"") -> tuple[int, bytes]:
    """Send exactly these headers (no Host or Accept-Encoding added); (status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        if method == "POST":
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body or None)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _own_page_headers(server: ParetoServer, host: str = "127.0.0.1") -> dict:
    """The headers Chromium sends for the page's own `fetch("api/select")`."""
    port = server.server_address[1]
    return {"Host": f"{host}:{port}", "Origin": f"http://{host}:{port}",
            "Content-Type": "application/json", TOKEN_HEADER: server.token}


def _select(server: ParetoServer, plan_id: str, headers: dict) -> tuple[int, bytes]:
    return _request(server, "POST", "/api/select", headers, json.dumps({"plan_id": plan_id}).encode())


def _files(run_dir) -> tuple[bytes, bytes]:
    return (run_dir / "plan.json").read_bytes(), (run_dir / "frontier.json").read_bytes()


def _foreign(server: ParetoServer) -> dict[str, dict]:
    """Each request a page or program other than the server's own page could send."""
    own = _own_page_headers(server)
    port = server.server_address[1]
    no_token = {k: v for k, v in own.items() if k != TOKEN_HEADER}
    return {
        "foreign Origin": {**own, "Origin": "http://evil.example"},
        "opaque Origin": {**own, "Origin": "null"},
        "the other local name as Origin": {**own, "Origin": f"http://localhost:{port}"},
        "another port as Origin": {**own, "Origin": f"http://127.0.0.1:{port + 1}"},
        "text/plain body": {**own, "Content-Type": "text/plain;charset=UTF-8"},
        "form body": {**own, "Content-Type": "application/x-www-form-urlencoded"},
        "no Content-Type": {k: v for k, v in own.items() if k != "Content-Type"},
        "foreign Host (DNS rebinding)": {**own, "Host": f"rebound.example:{port}", "Origin": None},
        "foreign Host, its own Origin": {**own, "Host": f"rebound.example:{port}",
                                         "Origin": f"http://rebound.example:{port}"},
        "Host with another port": {**own, "Host": f"127.0.0.1:{port + 1}", "Origin": None},
        "no Host": {k: v for k, v in own.items() if k not in ("Host", "Origin")},
        "missing token": no_token,
        "wrong token": {**own, TOKEN_HEADER: "x" * len(server.token)},
        "empty token": {**own, TOKEN_HEADER: ""},
        "simple cross-site post (no Origin, no token)": {**no_token, "Origin": None,
                                                         "Content-Type": "text/plain"},
    }


FOREIGN = ["foreign Origin", "opaque Origin", "the other local name as Origin", "another port as Origin",
           "text/plain body", "form body", "no Content-Type", "foreign Host (DNS rebinding)",
           "foreign Host, its own Origin", "Host with another port", "no Host", "missing token",
           "wrong token", "empty token", "simple cross-site post (no Origin, no token)"]


@pytest.mark.parametrize("case", FOREIGN)
def test_foreign_selection_is_refused_and_changes_nothing(server, run_dir, case):
    assert _select(server, "d4-p3", _own_page_headers(server))[0] == 200  # a plan.json to keep intact
    before = _files(run_dir)
    cases = _foreign(server)
    assert sorted(cases) == sorted(FOREIGN)
    headers = {k: v for k, v in cases[case].items() if v is not None}
    status, body = _select(server, "d2-p1", headers)
    assert status == 403, body
    assert json.loads(body)["error"].startswith("refused: ")
    assert _files(run_dir) == before, "a refused request changed plan.json or frontier.json"


def test_own_page_selects_under_either_local_name(server, run_dir):
    for host, plan_id in (("127.0.0.1", "d2-p1"), ("localhost", "d4-p3")):
        status, body = _select(server, plan_id, _own_page_headers(server, host))
        assert status == 200, body
        assert json.loads((run_dir / "frontier.json").read_text())["selected"] == plan_id
        assert json.loads((run_dir / "plan.json").read_text())["id"] == plan_id
    # a same-origin fetch may leave Origin out; the token and the rest still suffice
    headers = {k: v for k, v in _own_page_headers(server).items() if k != "Origin"}
    assert _select(server, "d2-p1", headers)[0] == 200


def test_page_carries_this_servers_token_and_a_rebound_name_gets_no_page(server, run_dir):
    port = server.server_address[1]
    status, page = _request(server, "GET", "/", {"Host": f"127.0.0.1:{port}"})
    assert status == 200
    meta = json.loads(re.search(rb'id="tensoropt-meta">(.*?)</script>', page).group(1))
    assert meta["token"] == server.token and meta["server"] is True
    assert len(server.token) >= 32
    other = ParetoServer(run_dir / "frontier.json", port=0)
    try:
        assert other.token != server.token, "the token must be random per server"
    finally:
        other.server_close()
    for path in ("/", "/api/plan?id=d2-p1"):
        status, body = _request(server, "GET", path, {"Host": f"rebound.example:{port}"})
        assert status == 403 and server.token.encode() not in body, path
