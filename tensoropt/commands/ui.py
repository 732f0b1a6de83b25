"""``tensoropt ui DIR``: serve the Pareto page on 127.0.0.1; "Use this plan" writes DIR/plan.json.

The page is the one ``tensoropt plot`` writes, served from DIR/frontier.json. Clicking "Use this
plan" writes DIR/plan.json (the same text ``tensoropt select`` writes) and records the plan as
``selected`` in DIR/frontier.json, so the next ``tensoropt run`` uses it. Ctrl-C stops the server.
"""

from __future__ import annotations

import argparse
import sys
import webbrowser
from pathlib import Path

from tensoropt.commands import CommandError
from tensoropt.commands.plot import _limit_bytes
from tensoropt.commands.select import budget_bytes
from tensoropt.plans import load_frontier_file
from tensoropt.plot.details import EMBED_LIMIT_BYTES


def add_parser(subparsers) -> None:
    """Add the ``ui`` subcommand."""
    p = subparsers.add_parser("ui", help="serve the Pareto plot locally; clicking a plan writes plan.json",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", help="run folder holding frontier.json (written by `tensoropt plan --out DIR`), "
                               "or the frontier file itself")
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    p.add_argument("--memory-budget", default=None,
                   help="per-device budget to draw, e.g. 16GiB (default: the job's memory_budget)")
    p.add_argument("--job", default=None, help="job YAML named in the page's `tensoropt run` command")
    p.add_argument("--embed-limit-mib", type=float, default=EMBED_LIMIT_BYTES / 2**20,
                   help="plan files embedded in the page, in MiB of JSON (default %(default)g); beyond it "
                        "only an even subset of plans carries its per-layer details (the server sends the "
                        "others on request)")
    p.add_argument("--open", action="store_true", help="also open the page in the default web browser")


def run(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C / SIGTERM."""
    from tensoropt.plot.server import ParetoServer, serve  # plotly: imported by this command only

    path = Path(args.dir)
    path = path if path.suffix == ".json" else path / "frontier.json"
    job = load_frontier_file(path).job
    budget = budget_bytes(args.memory_budget, job)
    if not 0 <= args.port <= 65535:
        raise CommandError(f"--port must be in 0..65535, got {args.port}")
    print(f"preparing the page for {path} ...", file=sys.stderr, flush=True)
    try:
        server = ParetoServer(path, port=args.port, job_file=args.job, budget_bytes=budget,
                              embed_limit_bytes=_limit_bytes(args.embed_limit_mib))
    except OSError as e:
        raise CommandError(f"cannot listen on 127.0.0.1:{args.port}: {e.strerror}; "
                           "pick another --port or omit it for a free one") from None

    def ready() -> None:
        print(f"serving the Pareto plot of {path} at {server.url}  (Ctrl-C to stop)", flush=True)
        if args.open:
            webbrowser.open(server.url)

    serve(server, ready)
    print("stopped", flush=True)
    return 0
