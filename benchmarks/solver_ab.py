"""Two versions of the solver on the same cost graphs, in alternating processes (CPU seconds).

Reads the cost graphs ``benchmarks/block_solve.py --save FILE`` pickled, and for ``--rounds`` rounds
runs one process per solver directory (``--before DIR`` holding an older ``frontier/``, e.g. from
``git archive COMMIT frontier | tar -x -C DIR``; ``--after``: this checkout), each process solving
every graph once as ``tensoropt plan`` does after one warm-up solve (numba's compile), and prints
per graph and version the solve CPU seconds of every round (``time.process_time``), the ratio of the
least round to the first graph's least round, the plans and the bound. Alternating processes keep a
loaded machine's drift out of the comparison.

Usage::

    .venv/bin/python benchmarks/block_solve.py --save /tmp/graphs.pkl
    .venv/bin/python benchmarks/solver_ab.py /tmp/graphs.pkl --before /tmp/old [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def solve_all(path: str) -> list[dict]:
    """Solve every pickled graph once after a warm-up; one row per graph.

    Example:
        >>> solve_all("/tmp/graphs.pkl")  # doctest: +SKIP
        [{'name': 'recompute, zero1-3', 'cpu_s': 2.1, 'plans': 1381, 'bound': 0.0025}, ...]
    """
    import importlib
    import pickle

    import frontier  # first: block_solve puts this checkout at the front of sys.path

    solve_once = importlib.import_module("block_solve").solve_once

    with open(path, "rb") as f:
        graphs = pickle.load(f)
    solve_once(next(iter(graphs.values())))
    out = []
    for name, G in graphs.items():
        cpu, _, plans, bound = solve_once(G)
        out.append({"name": name, "cpu_s": cpu, "plans": plans, "bound": bound, "code": frontier.__file__})
    return out


def main() -> int:
    """Command line: print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("graphs")
    parser.add_argument("--before", required=True, help="directory holding the older frontier/")
    parser.add_argument("--after", default=str(ROOT), help="directory holding the newer frontier/")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(solve_all(args.graphs)))
        return 0
    runs: dict[str, list[list[dict]]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for version, code in (("before", args.before), ("after", args.after)):
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([code, str(ROOT / "benchmarks"), str(ROOT)]))
            out = subprocess.run([sys.executable, __file__, args.graphs, "--before", args.before, "--child"],
                                 env=env, check=True, capture_output=True, text=True).stdout
            runs[version].append(json.loads(out.strip().splitlines()[-1]))
    print(f"load after: {os.getloadavg()[0]:.1f}; solvers: " +
          ", ".join(f"{v} {r[0][0]['code']}" for v, r in runs.items()))
    print("| version | graph | solve CPU s (rounds) | least | x first graph | plans | bound |")
    print("|---|---|---|---|---|---|---|")
    for version, rounds in runs.items():
        first = None
        for i, row in enumerate(rounds[0]):
            cpus = [r[i]["cpu_s"] for r in rounds]
            first = first or min(cpus)
            last = rounds[-1][i]
            print(f"| {version} | {row['name']} | {' / '.join(f'{c:.2f}' for c in cpus)} | {min(cpus):.2f} | "
                  f"{min(cpus) / first:.2f} | {last['plans']} | {100 * last['bound']:.2g} % |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
