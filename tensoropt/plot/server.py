"""``tensoropt ui``: serve the Pareto page on 127.0.0.1 and write DIR/plan.json on request.

Routes:

* ``GET /`` -- the Pareto page, rendered from the current DIR/frontier.json.
* ``GET /api/plan?id=d8-p3`` -- ``{"plan", "text"}``: the details of a plan the page does not
  embed (large frontiers, see :mod:`tensoropt.plot.details`).
* ``POST /api/select`` with ``{"plan_id": "d8-p3"}`` -- writes DIR/plan.json (exactly what
  ``tensoropt select`` writes) and records ``selected`` in DIR/frontier.json, both atomically;
  answers ``{"plan_id", "plan_path", "command"}`` or ``{"error"}`` with status 400/404.

Only the server's own page is answered (:mod:`tensoropt.plot.request_guard`): every request
must name the server in ``Host``; a selection must also come from the server's origin, as
``application/json``, with the page's per-server token in the ``X-Tensoropt-Token`` header.
Anything else gets 403 and changes nothing.

The server runs ``http.server`` in a background thread; :func:`serve` blocks until Ctrl-C or
SIGTERM, then shuts it down.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import signal
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from tensoropt.plans import PlanFileError, load_frontier_file, write_selection
from tensoropt.plot.details import EMBED_LIMIT_BYTES, frontier_nodes, plan_details, run_command
from tensoropt.plot.page import pareto_html, with_meta
from tensoropt.plot.request_guard import host_refusal, select_refusal

MAX_BODY_BYTES = 4096
"""Largest request body accepted by /api/select."""


class ParetoServer(ThreadingHTTPServer):
    """An HTTP server bound to 127.0.0.1 serving one frontier file (plan.json goes beside it).

    Example:
        >>> # not run here: serves out/vgg16 from `tensoropt plan` until stopped
        >>> srv = ParetoServer("out/vgg16/frontier.json", port=0)  # doctest: +SKIP
        >>> srv.start(); print(srv.url); srv.stop()  # doctest: +SKIP
        http://127.0.0.1:40123/
    """

    daemon_threads = True

    def __init__(self, frontier_path: str | Path, port: int = 0, job_file: str | None = None,
                 budget_bytes: int | None = None, embed_limit_bytes: float = EMBED_LIMIT_BYTES):
        self.frontier_path = Path(frontier_path)
        self.plan_path = self.frontier_path.parent / "plan.json"
        self.job_file = job_file
        self.budget_bytes = budget_bytes
        self.embed_limit_bytes = embed_limit_bytes
        self.write_lock = threading.Lock()
        self.token = secrets.token_urlsafe(32)
        """The random token the served page carries and a selection must echo."""
        self._cache: tuple[bytes, str, dict] | None = None  # (content key, page, frontier json)
        load_frontier_file(self.frontier_path)  # fail now, with the file named, if it is unusable
        self.page()  # render now, so that the first GET is quick
        super().__init__(("127.0.0.1", port), _Handler)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The page's address, e.g. ``http://127.0.0.1:40123/``."""
        return f"http://127.0.0.1:{self.server_address[1]}/"

    def start(self) -> None:
        """Serve in a background thread."""
        self._thread = threading.Thread(target=self.serve_forever, name="tensoropt-ui", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving, join the thread and close the socket."""
        self.shutdown()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.server_close()

    def page(self) -> str:
        """The page for the frontier file as it is now (re-rendered only when the file changed)."""
        return self._current()[1]

    def plan_details(self, plan_id: str) -> dict:
        """``{"plan", "text"}`` of one plan (KeyError if no such plan)."""
        return plan_details(self._current()[2], plan_id, self.budget_bytes, self.job_file or "JOB.yaml")

    def no_plan(self, plan_id: str) -> str:
        """The error message for an unknown plan id."""
        return f"no plan {plan_id!r} in {self.frontier_path}"

    def _current(self) -> tuple[bytes, str, dict]:
        with self.write_lock:
            key = _content_key(self.frontier_path)
            if self._cache is None or self._cache[0] != key:
                fj = load_frontier_file(self.frontier_path).to_json(shared=True)  # rows shared
                page = pareto_html(fj, self.budget_bytes, self.job_file,
                                   embed_limit_bytes=self.embed_limit_bytes)
                page = with_meta(page, server=True, token=self.token)  # it writes through this server
                self._cache = (key, page, fj)
            return self._cache

    def select(self, plan_id: str) -> dict:
        """Write plan.json for ``plan_id`` and record it as selected (KeyError if no such plan)."""
        with self.write_lock:
            before = _content_key(self.frontier_path)
            frontier_file = load_frontier_file(self.frontier_path)
            frontier, plan = frontier_file.find(plan_id)
            write_selection(frontier_file, plan.id, self.frontier_path, self.plan_path)
            if self._cache is not None and self._cache[0] == before:
                # only `selected` changed: patch the cached page instead of re-rendering it
                _, page, fj = self._cache
                fj["selected"] = plan_id
                self._cache = (_content_key(self.frontier_path), with_meta(page, selected=plan_id), fj)
        nodes = frontier_nodes({"mesh": frontier.mesh.shape, "mesh_levels": frontier.mesh.levels})
        command = run_command(self.job_file or "JOB.yaml", str(self.plan_path), frontier.devices, nodes)
        return {"plan_id": plan_id, "plan_path": str(self.plan_path), "command": command}


class _Handler(BaseHTTPRequestHandler):
    """GET / (the page) and POST /api/select."""

    server: ParetoServer
    server_version = "tensoropt-ui"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self._refused(host_refusal(self.headers, self.server.server_address[1])):
            return
        path = self.path.split("?", 1)[0]
        if path in ("/", "/index.html", "/pareto.html"):
            try:
                body = self.server.page().encode("utf-8")
            except (PlanFileError, ValueError) as e:
                self._send(HTTPStatus.INTERNAL_SERVER_ERROR, f"cannot render the page: {e}".encode(),
                           "text/plain; charset=utf-8")
                return
            self._send(HTTPStatus.OK, body, "text/html; charset=utf-8")
        elif path == "/api/plan":
            plan_id = parse_qs(urlsplit(self.path).query).get("id", [""])[0]
            try:
                self._json(HTTPStatus.OK, self.server.plan_details(plan_id))
            except KeyError:
                self._json(HTTPStatus.NOT_FOUND, {"error": self.server.no_plan(plan_id)})
        elif path == "/favicon.ico":
            self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
        else:
            self._json(HTTPStatus.NOT_FOUND, {"error": f"no such page {path!r}; open /"})

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        if self.path != "/api/select":
            self._json(HTTPStatus.NOT_FOUND, {"error": f"no such endpoint {self.path!r}"})
            return
        length = self.headers.get("Content-Length") or "0"
        if not (length.isascii() and length.isdigit()) or int(length) > MAX_BODY_BYTES:
            self.close_connection = True  # its body is not read
            self._json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                       {"error": f"request body too large or its Content-Length {length!r} unusable"})
            return
        body = self.rfile.read(int(length))
        if self._refused(select_refusal(self.headers, self.server.server_address[1], self.server.token)):
            return
        try:
            plan_id = json.loads(body or b"{}")["plan_id"]
            if not isinstance(plan_id, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            self._json(HTTPStatus.BAD_REQUEST, {"error": 'expected a JSON body {"plan_id": "<id>"}'})
            return
        try:
            self._json(HTTPStatus.OK, self.server.select(plan_id))
        except KeyError:
            self._json(HTTPStatus.NOT_FOUND, {"error": self.server.no_plan(plan_id)})
        except (PlanFileError, OSError) as e:
            self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": str(e)})
        else:
            print(f"wrote {self.server.plan_path} ({plan_id}); recorded as selected in "
                  f"{self.server.frontier_path}", flush=True)

    def _refused(self, problem: str | None) -> bool:
        """Answer 403 when a request check found a problem; whether it did."""
        if problem:
            self._json(HTTPStatus.FORBIDDEN, {"error": f"refused: {problem}"})
        return bool(problem)

    def _json(self, status: HTTPStatus, obj: dict) -> None:
        self._send(status, json.dumps(obj).encode("utf-8"), "application/json")

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's signature
        """Quiet: only selections are printed."""


def serve(server: ParetoServer, on_ready: Callable[[], None] | None = None) -> None:
    """Serve until Ctrl-C or SIGTERM, then stop cleanly.

    Args:
        server: the server to run.
        on_ready: called once the server accepts requests and the signals are handled (e.g. to
            print the address).

    Example:
        >>> # not run here: serves out/vgg16 from `tensoropt plan` until stopped
        >>> serve(ParetoServer("out/vgg16/frontier.json"), lambda: print("ready"))  # doctest: +SKIP
    """
    stop = threading.Event()
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set()) if in_main else None
    try:
        server.start()
        if on_ready is not None:
            on_ready()
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        if in_main:
            signal.signal(signal.SIGTERM, previous)


def _content_key(path: Path) -> bytes:
    """Digest of the file's bytes (a stat-based key misses rewrites within one timestamp tick)."""
    return hashlib.blake2b(path.read_bytes(), digest_size=16).digest()
