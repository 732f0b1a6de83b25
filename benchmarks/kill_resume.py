"""Killed at step 30 of 60 and resumed at another device count (issue 25's resume target), as a
table: the run of tests/training/test_kill_resume.py (its job and helpers), with the wall time of
each phase and the largest difference from the uninterrupted plain 1-process loop, before and
after the kill.

Per direction (``2->1``: killed on 2 processes, resumed on 1; ``1->2`` the other way): the killed
run holds after step 30's checkpoint and is SIGKILLed (torchrun and its workers), the resumed run
starts on the same checkpoint directory and trains to step 60; every step's loss, learning rate
and gradient norm (metrics.jsonl) against ``trainer_reference.reference``.

Usage::

    .venv/bin/python benchmarks/kill_resume.py [--direction 2-1 --direction 1-2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "training"))

from test_kill_resume import KILL, MICRO, STEPS, _job, _plans, _rows, _run, _run_file, _run_killed_at  # noqa: E402
from trainer_reference import reference  # noqa: E402

from tensoropt.tables import format_table  # noqa: E402


def one_direction(killed_on: int, resumed_on: int, tmp: Path) -> list:
    """One table row: the kill and the resume, timed, and the largest differences."""
    job = _job(tmp)
    plans = _plans(job)
    start = time.perf_counter()
    _run_killed_at(tmp, killed_on, _run_file(tmp, "first", job, plans[killed_on], checkpoint_every=10,
                                             hold_after=KILL), KILL)
    killed_s = time.perf_counter() - start
    start = time.perf_counter()
    _run(resumed_on, _run_file(tmp, "rest", job, plans[resumed_on], checkpoint_every=10))
    resumed_s = time.perf_counter() - start
    rows = _rows(tmp / "metrics.jsonl")
    want = reference(job, MICRO, STEPS)
    assert [r["step"] for r in rows] == [w["step"] for w in want], [r["step"] for r in rows]

    def worst(key: str, part: slice) -> float:
        return max(abs(r[key] - w[key]) / max(1.0, abs(w[key])) for r, w in zip(rows[part], want[part]))

    before, after = slice(0, KILL), slice(KILL, STEPS)
    return [f"{killed_on} -> {resumed_on}", f"{plans[killed_on]['id']} -> {plans[resumed_on]['id']}",
            f"{killed_s:.1f}", f"{resumed_s:.1f}",
            *(f"{worst(k, p):.1e}" for p in (before, after) for k in ("loss", "lr", "grad_norm"))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--direction", action="append", choices=["2-1", "1-2"])
    args = parser.parse_args(argv)
    rows = []
    for direction in args.direction or ["2-1", "1-2"]:
        killed_on, resumed_on = map(int, direction.split("-"))
        with tempfile.TemporaryDirectory(prefix="kill-resume-") as tmp:
            rows.append(one_direction(killed_on, resumed_on, Path(tmp)))
        print(" | ".join(rows[-1]), flush=True)
    headers = ["processes", "plans", "killed run s", "resumed run s", "loss 1-30", "lr 1-30", "norm 1-30",
               "loss 31-60", "lr 31-60", "norm 31-60"]
    print(format_table(headers, rows, right=list(range(2, len(headers)))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
