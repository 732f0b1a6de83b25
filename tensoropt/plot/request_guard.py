"""Which requests ``tensoropt ui`` answers: only those of its own page on this machine.

A page the user visits elsewhere while the server runs can send requests to 127.0.0.1 too.
Three checks keep it from reading the page or selecting a plan (writing the plan.json that the
next ``tensoropt run`` trains):

* ``Host`` must be the server's own address (``127.0.0.1:PORT`` or ``localhost:PORT``): a name
  that another site made resolve to 127.0.0.1 (DNS rebinding) arrives with that site's name.
* On ``POST /api/select``: ``Origin``, when the browser sends it, must be the server's own
  origin; the body must be ``application/json`` (a ``text/plain`` form post is a "simple"
  cross-site request, sent without asking); and the :data:`TOKEN_HEADER` header must carry the
  per-server random token that only the server's own page holds (a custom header also makes a
  browser ask first, and another origin cannot read the page to learn the token).

Example:
    >>> host_refusal({"Host": "127.0.0.1:8000"}, 8000) is None
    True
    >>> select_refusal({"Host": "localhost:8000", "Origin": "http://evil.example",
    ...                 "Content-Type": "application/json", TOKEN_HEADER: "t"}, 8000, "t")
    "Origin 'http://evil.example' is not this server's (http://localhost:8000)"
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

TOKEN_HEADER = "X-Tensoropt-Token"
"""The request header that carries the page's token on ``POST /api/select``."""

LOCAL_NAMES = ("127.0.0.1", "localhost")
"""Host names the server answers to (it listens on 127.0.0.1 only)."""


def host_refusal(headers: Mapping[str, str], port: int) -> str | None:
    """Why a request is refused for its ``Host`` header, or None when it names this server.

    Args:
        headers: the request headers (``http.server``'s message object or a dict).
        port: the port the server listens on.

    Returns:
        A one-line reason, or None.

    Example:
        >>> host_refusal({"Host": "localhost:8000"}, 8000) is None
        True
        >>> host_refusal({"Host": "rebound.example:8000"}, 8000)
        "Host 'rebound.example:8000' is not this server (127.0.0.1:8000 or localhost:8000)"
    """
    host = headers.get("Host")
    allowed = [f"{name}:{port}" for name in LOCAL_NAMES]
    if host is None or host.lower() not in allowed:
        return f"Host {host!r} is not this server ({' or '.join(allowed)})"
    return None


def select_refusal(headers: Mapping[str, str], port: int, token: str) -> str | None:
    """Why a ``POST /api/select`` is refused, or None when it comes from the server's own page.

    Args:
        headers: the request headers.
        port: the port the server listens on.
        token: the server's random token (embedded in the page it serves).

    Returns:
        A one-line reason, or None.

    Example:
        >>> ok = {"Host": "127.0.0.1:8000", "Origin": "http://127.0.0.1:8000",
        ...       "Content-Type": "application/json", TOKEN_HEADER: "s3cret"}
        >>> select_refusal(ok, 8000, "s3cret") is None
        True
        >>> select_refusal({**ok, "Content-Type": "text/plain"}, 8000, "s3cret")
        "Content-Type 'text/plain' is not application/json"
        >>> select_refusal({**ok, TOKEN_HEADER: "guess"}, 8000, "s3cret")
        "missing or wrong X-Tensoropt-Token (the server's page sends it; reload the page)"
    """
    problem = host_refusal(headers, port)
    if problem:
        return problem
    origin = headers.get("Origin")
    own_origin = f"http://{headers['Host'].lower()}"
    if origin is not None and origin.lower() != own_origin:
        return f"Origin {origin!r} is not this server's ({own_origin})"
    content_type = headers.get("Content-Type") or ""
    if content_type.split(";", 1)[0].strip().lower() != "application/json":
        return f"Content-Type {content_type!r} is not application/json"
    sent = headers.get(TOKEN_HEADER) or ""
    if not hmac.compare_digest(sent.encode("utf-8"), token.encode("utf-8")):
        return f"missing or wrong {TOKEN_HEADER} (the server's page sends it; reload the page)"
    return None
