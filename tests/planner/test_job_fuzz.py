"""Bad input around models gets the project's own clear error (issue 29, item 6).

Seeded random mutations of the example jobs in configs/jobs (a key deleted or misspelt, a value
of another type, too large, negative or empty) go through ``tensoropt plan``'s path up to the
captured graph (load, build, resolve, capture, runnable check: where bad input is met; the
solver then only sees a valid graph). Every outcome is a captured graph or the command's error:
no traceback, no C++ stack frames, no log dump, and every message names a key path. Bounded in
count and time.
"""

from __future__ import annotations

import copy
import logging
import random
import re
import time
import warnings
from pathlib import Path

import pytest
import yaml

from tensoropt.config import ConfigError, load_job
from tensoropt.job_model import PlanningError
from tensoropt.planner import plan_job

JOBS = sorted((Path(__file__).resolve().parents[2] / "configs" / "jobs").glob("*.yaml"))
SEED = 29
MUTATIONS = 48
BUDGET_S = 150
KEY_PATH = re.compile(r"\b(model|training|cluster|devices|memory_budget|select|planner|data|executor|"
                      r"max_time_s|precision|memory|elastic)(\.[\w\[\]<>-]+|\[\d+\])*\b")
DUMPS = ("Traceback (most recent call last)", "Exception raised from", "frame #0", "most recent call first")
ODD_VALUES = ["x", [1, "a"], {"a": 1}, -3, 0, 10**15, 1e30, None, True, [], 2.5]


class _Captured(Exception):
    """Raised by the progress callback once the graph is captured (the solver is not the subject)."""


def _stop_after_capture(message: str, fraction: float) -> None:
    if message.startswith("cost graph"):
        raise _Captured


def _paths(node, prefix=()):
    """Every key path of a YAML document (dict keys and list indices)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*prefix, key)
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield (*prefix, i)
            yield from _paths(value, (*prefix, i))


def _mutate(doc: dict, rng: random.Random) -> tuple[dict, str]:
    doc = copy.deepcopy(doc)
    path = rng.choice(list(_paths(doc)))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    kind = rng.choice(["value", "value", "value", "delete", "rename"])
    if kind == "delete" and isinstance(parent, dict):
        del parent[last]
    elif kind == "rename" and isinstance(parent, dict):
        parent[f"{last}_typo"] = parent.pop(last)
    else:
        kind = "value"
        parent[last] = rng.choice(ODD_VALUES)
    return doc, f"{kind} {'.'.join(map(str, path))}"


def _plan_front(path: Path) -> str | None:
    """The error line ``tensoropt plan`` prints for ``path`` (its error path, as commands/plan.py and
    cli.py format it), or None when the job gets as far as a captured graph."""
    try:
        plan_job(load_job(path), progress=_stop_after_capture)
    except _Captured:
        return None
    except ConfigError as e:
        return f"tensoropt plan: error: {e}"
    except PlanningError as e:
        return f"tensoropt plan: error: {path}: {e}"
    return None


@pytest.mark.timeout(600)
def test_mutated_example_jobs_get_a_clear_error_naming_a_key_path(tmp_path, capfd, caplog):
    rng = random.Random(SEED)
    docs = {p.name: yaml.safe_load(p.read_text()) for p in JOBS}
    start = time.perf_counter()
    outcomes, problems = [], []
    for i in range(MUTATIONS):
        if time.perf_counter() - start > BUDGET_S:
            break
        name = rng.choice(sorted(docs))
        doc, change = _mutate(docs[name], rng)
        path = tmp_path / f"{i}-{name}"
        path.write_text(yaml.safe_dump(doc))
        caplog.clear()
        with warnings.catch_warnings(), caplog.at_level(logging.WARNING):
            warnings.simplefilter("ignore")
            try:
                message = _plan_front(path)
            except Exception as e:  # not the project's error: a traceback would reach the user
                problems.append(f"{name} ({change}): {type(e).__name__}: {str(e)[:300]}")
                continue
        printed = capfd.readouterr().err + "\n".join(r.getMessage() for r in caplog.records
                                                     if r.levelno >= logging.ERROR)
        outcomes.append((name, change, message))
        if message is None:
            continue
        if any(d in message or d in printed for d in DUMPS):
            problems.append(f"{name} ({change}): a stack dump in {message[:300]!r} / {printed[-300:]!r}")
        if not KEY_PATH.search(message):
            problems.append(f"{name} ({change}): no key path in {message[:300]!r}")
    assert not problems, "\n".join(problems)
    errors = [m for *_, m in outcomes if m is not None]
    assert len(outcomes) >= 12 and len(errors) >= 6, outcomes  # the budget let enough mutations run
