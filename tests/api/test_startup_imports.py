"""What starting a worker or the command line imports: each worker entry torchrun starts, and
``tensoropt --help``, in a fresh interpreter, leave the modules they do not use unloaded (the
solver and numba, plotly, the planner, DCP; torch itself for the help). Not a timing test: it
fails when an import at module level pulls one of them back in, and names the chain that did."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

WORKER_ENTRIES = ("tensoropt.training.worker", "tensoropt.training.loop", "tensoropt.training.pipelined",
                  "tensoropt.pipeline_runtime.worker")
"""The modules ``tensoropt run`` starts under torchrun (``python -m MODULE RUN.json``)."""

NOT_IN_WORKERS = ("numba", "frontier", "plotly", "pymoo", "scipy", "transformers", "tensoropt.planner",
                  "tensoropt.cost_graph", "tensoropt.plot", "tensoropt.configspace.rules",
                  "torch.distributed.checkpoint")
"""Loaded by none of them at import: a run without checkpoints never needs DCP, and no worker plans
(an elastic start that plans on the spot imports the planner then)."""

NOT_IN_HELP = ("torch", "numpy", "networkx", "plotly", "numba", "frontier")
"""``tensoropt --help`` (and ``select``, ``explain``) read JSON and YAML only."""


def _loaded(code: str, names: tuple[str, ...]) -> list[str]:
    """The ``names`` (or their submodules) in ``sys.modules`` after running ``code`` in a fresh
    interpreter, each with the import chain ``python -X importtime`` shows for it."""
    probe = (f"{code}\nimport sys, json\nnames = {list(names)!r}\n"
             "print(json.dumps(sorted({n for n in names for m in list(sys.modules) "
             "if m == n or m.startswith(n + '.')})))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", probe], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    return [f"{name} (imported by: {_chain(out.stderr, name)})" for name in found]


def _chain(importtime: str, name: str) -> str:
    """``name <- its importer <- ...`` from ``-X importtime``'s tree (children print first)."""
    rows = [(len(line.split("|")[2]) - len(line.split("|")[2].lstrip()), line.split("|")[2].strip())
            for line in importtime.splitlines() if line.startswith("import time:") and "[us]" not in line]
    for i, (depth, module) in enumerate(rows):
        if module == name or module.startswith(name + "."):
            chain = [module]
            for d, parent in rows[i + 1:]:
                if d < depth:
                    chain.append(parent)
                    depth = d
            return " <- ".join(chain)
    return "?"


def test_the_worker_entries_import_only_what_they_use():
    """All four in one interpreter (one start of torch, ~5 s): the chain names the entry at fault."""
    assert _loaded("; ".join(f"import {entry}" for entry in WORKER_ENTRIES), NOT_IN_WORKERS) == []


def test_the_command_lines_help_imports_no_torch():
    assert _loaded("from tensoropt.cli import build_parser; build_parser()", NOT_IN_HELP) == []
