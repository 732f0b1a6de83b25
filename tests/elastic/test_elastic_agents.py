"""Acceptance: `tensoropt run --elastic` on two torchrun agents; one dies, training goes on at
world size 1, a new agent joins, training finishes at world size 2, and the result equals an
uninterrupted run."""

from __future__ import annotations

import json

import pytest
from elastic_helpers import (
    TOTAL_STEPS,
    assert_params_close,
    checkpoint_params,
    elastic_cli,
    free_port,
    job_yaml,
    listening,
    newest,
    wait_until,
)

from tensoropt.elastic import read_events

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(400)]


def test_agent_dies_and_another_joins(tmp_path, agents, frontier_file, reference_params):
    ckpt, hold, metrics = tmp_path / "ckpt", tmp_path / "hold", tmp_path / "metrics.json"
    hold.mkdir()
    port = free_port()
    cmd = elastic_cli(job_yaml(tmp_path), frontier_file, ckpt, TOTAL_STEPS, port, "--max-restarts", 5,
                      "--metrics", metrics, "--timeout-s", 380)
    env = {"TENSOROPT_TEST_HOLD_DIR": str(hold)}

    # Round 1: world size 2. Workers hold after each step (and its checkpoint) until released.
    # Should agent a's rendezvous close before b joins, a starts alone at world size 1 and holds
    # there too; b's arrival then restarts both at world size 2.
    (hold / "hold-ws2").touch()
    (hold / "hold-ws1").touch()
    agents.start("a", cmd, env)  # the first agent hosts the rendezvous store: it is the survivor
    wait_until(lambda: listening(port), 120, agents, "the rendezvous store of agent a", alive=("a",))
    agents.start("b", cmd, env)
    first = wait_until(lambda: (c := newest(ckpt)) and c.manifest.world_size == 2 and c, 180, agents,
                       "a checkpoint at world size 2", alive=("a", "b"))
    assert first.manifest.plan_id.startswith("d2-")

    # Agent b dies (command, agent and worker). The survivor's worker fails at its next
    # collective and its agent restarts it at world size 1: it resumes, steps, checkpoints, holds.
    agents.kill("b")
    (hold / "hold-ws2").unlink()
    second = wait_until(lambda: (c := newest(ckpt)) and c.manifest.world_size == 1
                        and c.manifest.step > first.manifest.step and c, 180, agents,
                        "a checkpoint at world size 1", alive=("a",))
    assert second.manifest.plan_id == "d1-p0"

    # A new agent joins: everyone restarts at world size 2 and trains to the end.
    agents.start("c", cmd, env)
    assert agents.wait("a", 300) == 0, agents.all_text()
    assert agents.wait("c", 60) == 0, agents.all_text()

    events = read_events(ckpt)  # one per start, written by rank 0
    assert [e["world_size"] for e in events][-3:] == [2, 1, 2], events
    before, survivor, last = events[-3:]
    assert before["plan_id"].startswith("d2-") and last["plan_id"] == before["plan_id"]
    assert survivor["plan_id"] == "d1-p0" and survivor["resumed_from"] == first.manifest.step
    assert last["resumed_from"] == second.manifest.step
    log = "".join(agents.text(n) for n in ("a", "b", "c"))  # rank 0 may be on any agent
    assert f"world size 2: plan {before['plan_id']}" in log and "world size 1: plan d1-p0" in log, log
    assert f"resumed at step {first.manifest.step}" in log

    ran = [s["step"] for s in json.loads(metrics.read_text())["steps"]]
    assert ran == list(range(second.manifest.step, TOTAL_STEPS))
    assert_params_close(checkpoint_params(ckpt, TOTAL_STEPS), reference_params)
