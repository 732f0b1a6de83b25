"""frontier.json and the Pareto page at Llama-3-8B scale (issue 26, "the files stay usable").

Reads a frontier file written by ``tensoropt plan`` (either version; by default the one
``benchmarks/scale.py --case 8b`` leaves in /tmp/scale/8b: Llama-3-8B shape on 8/16/32/64 GPUs,
200 plans) and prints one table, the two forms side by side, each timed in interleaved rounds
(wall and CPU seconds; the machine is shared):

* the file's size in version 1 (every plan holds its rows) and version 2 (rows shared by index);
* writing it: the object to text (``json.dumps`` of ``to_json()`` / ``frontier_file_text`` of
  ``to_json(shared=True)``), as ``tensoropt plan`` does;
* reading it back (``load_frontier_file``) from a file of each version;
* the Pareto page built from it (``pareto_html``): its size and build time (only version 2's page
  exists on this branch; the page of version 1's code is measured by running this script there).

Usage::

    .venv/bin/python benchmarks/frontier_file.py [/tmp/scale/8b/frontier.json] [--rounds 2]
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from pathlib import Path

MB = 1e6


def _timed(fn):
    """(result, wall s, CPU s) of ``fn()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("frontier", nargs="?", default="/tmp/scale/8b/frontier.json")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    from tensoropt.planner import frozen_heap
    from tensoropt.plans import frontier_file_text, load_frontier_file
    from tensoropt.plot.page import pareto_html, plotly_b64

    ff = load_frontier_file(args.frontier)
    plans = sum(len(f.plans) for f in ff.frontiers)
    counts = "/".join(str(f.devices) for f in ff.frontiers)
    folder = Path(tempfile.mkdtemp())
    plotly_b64()  # once per process, as in `tensoropt plan`
    rows: dict[str, list] = {}
    with frozen_heap():  # as `tensoropt plan` writes: no collection walks the plans' rows
        for _ in range(args.rounds):
            old, w1, c1 = _timed(lambda: json.dumps(ff.to_json(), separators=(",", ":")) + "\n")
            new, w2, c2 = _timed(lambda: frontier_file_text(ff.to_json(shared=True)))
            rows.setdefault("write", []).append((w1, c1, w2, c2))
            (folder / "v1.json").write_text(old.replace('{"version":2', '{"version":1', 1))
            (folder / "v2.json").write_text(new)
            _, w1, c1 = _timed(lambda: load_frontier_file(folder / "v1.json"))
            _, w2, c2 = _timed(lambda: load_frontier_file(folder / "v2.json"))
            rows.setdefault("read", []).append((w1, c1, w2, c2))
            data = json.loads(new)
            page, w2, c2 = _timed(lambda: pareto_html(data))  # noqa: B023 (called at once)
            rows.setdefault("page", []).append((None, None, w2, c2))
            gc.collect()
    sizes = {"v1": len(old.encode()), "v2": len(new.encode()), "page": len(page.encode())}
    print(f"{args.frontier}: {plans} plans on {counts} devices, {args.rounds} interleaved rounds")
    print("| what | version 1 (rows inline) | version 2 (rows shared) |")
    print("|---|---|---|")
    print(f"| frontier.json size | {sizes['v1'] / MB:.1f} MB | {sizes['v2'] / MB:.2f} MB |")
    for name, label in (("write", "to text (wall / CPU s)"), ("read", "load_frontier_file (wall / CPU s)"),
                        ("page", "Pareto page build (wall / CPU s)")):
        cells = []
        for k in (0, 2):
            vals = [r[k] for r in rows[name] if r[k] is not None]
            cpus = [r[k + 1] for r in rows[name] if r[k + 1] is not None]
            cells.append(" , ".join(f"{w:.2f} / {c:.2f}" for w, c in zip(vals, cpus)) or "-")
        print(f"| {label} | {cells[0]} | {cells[1]} |")
    print(f"| Pareto page size | - | {sizes['page'] / MB:.2f} MB ({sizes['page'] / 2**20:.2f} MiB) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
