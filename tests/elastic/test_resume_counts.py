"""Acceptance: the non-elastic path. `tensoropt run` stopped at 2 processes resumes at 1, then at
4 (a count the frontier file lacks: planned on the spot), each under its own plan, and ends
where an uninterrupted run ends."""

from __future__ import annotations

import json

import pytest
from elastic_helpers import TOTAL_STEPS, assert_params_close, checkpoint_params, job_yaml, newest, run_cli

from tensoropt.elastic import read_events

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(500)]


def test_resume_on_two_then_one_then_four(tmp_path, agents, frontier_file, reference_params):
    ckpt, job = tmp_path / "ckpt", job_yaml(tmp_path)
    # --steps is the total: 3 steps at 2 processes, on to 5 at 1, on to 8 at 4.
    legs = ((2, 0, 3), (1, 3, 5), (4, 5, TOTAL_STEPS))
    for nproc, start, steps in legs:
        metrics = tmp_path / f"metrics{nproc}.json"
        cmd = run_cli(job, "--nproc", nproc, "--steps", steps, "--frontier", frontier_file,
                      "--checkpoint-dir", ckpt, "--checkpoint-every", 2, "--metrics", metrics,
                      "--timeout-s", 280)
        agents.start(f"n{nproc}", cmd)
        assert agents.wait(f"n{nproc}", 300) == 0, agents.all_text()
        found = newest(ckpt)
        assert (found.manifest.step, found.manifest.world_size) == (steps, nproc)
        ran = json.loads(metrics.read_text())
        assert ran["devices"] == nproc and [s["step"] for s in ran["steps"]] == list(range(start, steps))

    events = read_events(ckpt)
    assert [(e["world_size"], e["resumed_from"]) for e in events] == [(2, None), (1, 3), (4, 5)]
    assert events[0]["plan_id"].startswith("d2-") and events[1]["plan_id"] == "d1-p0"
    assert events[2]["plan_id"].startswith("d4-")
    log4 = agents.text("n4")
    assert "has no frontier for 4 devices; planning on the spot" in log4, log4
    assert "world size 4: plan d4-" in log4 and "resumed at step 5" in log4
    assert_params_close(checkpoint_params(ckpt, TOTAL_STEPS), reference_params)
