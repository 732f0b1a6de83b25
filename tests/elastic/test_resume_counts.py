"""Acceptance: the non-elastic path. A run stopped at 2 processes resumes at 1, then at 4 (a count
the frontier file lacks: planned on the spot), each under its own plan, and ends where an
uninterrupted run ends."""

from __future__ import annotations

import json

import pytest
import torch
from elastic_helpers import TOTAL_STEPS, assert_params_close, newest, run_config

from tensoropt.elastic import read_events
from tensoropt.launch import LaunchOptions

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(400)]


def test_resume_on_two_then_one_then_four(tmp_path, agents, frontier_file, reference_params):
    ckpt = tmp_path / "ckpt"
    # --steps is the total: 3 steps at 2 processes, on to 5 at 1, on to 8 at 4.
    for nproc, steps in ((2, 3), (1, 5), (4, TOTAL_STEPS)):
        run_json = run_config(tmp_path, ckpt, frontier_file, steps, every=2, name=f"run{nproc}")
        agents.start(f"n{nproc}", LaunchOptions(nproc), run_json)
        assert agents.wait(f"n{nproc}", 300) == 0, agents.all_text()
        found = newest(ckpt)
        assert found.manifest.step == steps and found.manifest.world_size == nproc
        metrics = json.loads((tmp_path / f"run{nproc}-metrics.json").read_text())
        assert metrics["devices"] == nproc
        assert [s["step"] for s in metrics["steps"]] == list(range(steps - {2: 3, 1: 2, 4: 3}[nproc], steps))

    events = read_events(ckpt)
    assert [(e["world_size"], e["resumed_from"]) for e in events] == [(2, None), (1, 3), (4, 5)]
    assert events[0]["plan_id"].startswith("d2-") and events[1]["plan_id"] == "d1-p0"
    assert events[2]["plan_id"].startswith("d4-")
    log4 = agents.text("n4")
    assert "has no frontier for 4 devices; planning on the spot" in log4, log4
    assert "world size 4: plan d4-" in log4 and "resumed at step 5" in log4
    assert_params_close(torch.load(tmp_path / "run4-params.pt"), reference_params)
