"""``tensoropt plot DIR/frontier.json -o pareto.html``: the interactive Pareto page as one file.

The page is self-contained (plotly.js inlined; it makes no network request): memory per
device against step time (or throughput), one series per device count, the memory budget,
a per-layer panel for the clicked plan, and a "Use this plan" button that downloads its
plan.json (the same text ``tensoropt select`` writes).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tensoropt.commands import CommandError
from tensoropt.commands.select import budget_bytes, frontier_path
from tensoropt.plans import load_frontier_file, write_text_atomic
from tensoropt.plot.details import EMBED_LIMIT_BYTES


def add_parser(subparsers) -> None:
    """Add the ``plot`` subcommand."""
    p = subparsers.add_parser("plot", help="write the interactive Pareto plot (self-contained HTML)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("frontier", help="frontier.json written by `tensoropt plan` (or its folder)")
    p.add_argument("-o", "--output", default=None,
                   help="HTML file to write (default: pareto.html beside the frontier file)")
    p.add_argument("--memory-budget", default=None,
                   help="per-device budget to draw, e.g. 16GiB (default: the job's memory_budget)")
    p.add_argument("--job", default=None, help="job YAML named in the page's `tensoropt run` command")
    p.add_argument("--embed-limit-mib", type=float, default=EMBED_LIMIT_BYTES / 2**20,
                   help="plan files embedded in the page, in MiB of their distinct JSON text (the plans "
                        "share most of it; default %(default)g); beyond it only an even subset of plans "
                        "carries its per-layer details")


def run(args: argparse.Namespace) -> int:
    """Read the frontier file, write the page, print where."""
    path = frontier_path(args.frontier)
    frontier_json = load_frontier_file(path).to_json(shared=True)  # the file's form: rows shared
    out = Path(args.output) if args.output else path.parent / "pareto.html"
    budget = budget_bytes(args.memory_budget, frontier_json["job"])
    from tensoropt.plot.page import pareto_html  # plotly: imported by this command only

    text = pareto_html(frontier_json, budget, args.job, embed_limit_bytes=_limit_bytes(args.embed_limit_mib))
    write_text_atomic(out, text)
    plans = sum(len(f["plans"]) for f in frontier_json["frontiers"])
    print(f"wrote {out} ({plans} plans, {len(text.encode()) / 2**20:.1f} MiB, works offline)")
    return 0


def _limit_bytes(mib: float) -> float:
    """``--embed-limit-mib`` in bytes (checked)."""
    if not mib >= 0:
        raise CommandError(f"--embed-limit-mib must be >= 0, got {mib}")
    return mib * 2**20
