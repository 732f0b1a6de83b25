"""Elastic relaunch of pipelined plans (issue 27), both ways, on torchrun agents of 1 process each
(tests/elastic/pipelined_scenario.py): alone on the 1-device plan without stages, a second agent
joins (pp=2 at world size 2, resumed from the loop's checkpoint), that agent is killed (the 1-device
plan again, resumed from the pipelined checkpoint). Every step's loss, learning rate and gradient
norm equal an uninterrupted 1-process loop's within 1e-5; each start appends its line to
elastic-log.jsonl and each runtime keeps ``--keep-checkpoints`` (1) checkpoints."""

from __future__ import annotations

import pytest
from pipelined_scenario import JOIN, KILL, STEPS, TOL, gain_and_lose

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(300)]


def test_a_run_gains_a_device_onto_a_pipelined_plan_and_loses_it_exactly(tmp_path, agents):
    ran = gain_and_lose(tmp_path, agents, per_agent=1)
    alone, at_kill, end = ran.alone, ran.at_kill, ran.end
    assert alone["world_size"] == 1 and alone["plan_id"].startswith("d1-") and not alone.get("pipelined")
    assert at_kill["world_size"] == 2 and at_kill["pipelined"] and at_kill["plan_id"] in ran.staged, at_kill
    assert end["world_size"] == 1 and end["plan_id"] == alone["plan_id"] and not end.get("pipelined"), end

    # one line per start, from the loop (world size 1) and the pipelined runtime (2); each runtime
    # deleted the other's checkpoint once its own was complete (the pipelined one: the scenario waits)
    starts = [(e["world_size"], e["plan_id"], e["start_step"], e["resumed_from"], e["total_steps"])
              for e in ran.events]
    assert starts == [(1, alone["plan_id"], 0, None, STEPS), (2, at_kill["plan_id"], JOIN, JOIN, STEPS),
                      (1, alone["plan_id"], KILL, KILL, STEPS)], ran.events
    assert ran.folders == [f"step-{STEPS}"], ran.folders

    assert f"elastic: world size 2: plan {at_kill['plan_id']}" in ran.log, ran.log[-3000:]
    assert f"elastic: world size 1: plan {alone['plan_id']}" in ran.log, ran.log[-3000:]
    ckpt = tmp_path / "ckpt"
    assert f"resumed from {ckpt / f'step-{JOIN}'} at step {JOIN} on 2 process" in ran.log, ran.log[-3000:]
    assert f"resumed from {ckpt / f'step-{KILL}'} at step {KILL} on 1 process" in ran.log, ran.log[-3000:]
    assert [r["step"] for r in ran.rows] == list(range(1, STEPS + 1)), [r["step"] for r in ran.rows]
    for got, want in zip(ran.rows, ran.want, strict=True):
        for key in ("loss", "lr", "grad_norm"):
            assert got[key] == pytest.approx(want[key], abs=TOL, rel=TOL), (got["step"], key, got[key],
                                                                             want[key])
