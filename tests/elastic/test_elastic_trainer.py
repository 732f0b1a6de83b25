"""The trainer's loop under `tensoropt run --elastic` (issue 25): two torchrun agents train a job with
trainer keys (AdamW, warmup + cosine, clipping, 2 planned micro-batches) at world size 2; one agent
is killed mid-run (SIGKILL of its command, agent and worker); the survivor's agent relaunches its
worker at world size 1, which takes the 1-device plan from frontier.json, resumes from the 2-process
run's DCP checkpoint (resharded) and trains to the end. Every step's loss, learning rate and
gradient norm equal an uninterrupted 1-process PyTorch loop's within 1e-5."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from elastic_helpers import elastic_cli, free_port, listening, trainer_state, wait_until

from tensoropt.config import Job
from tensoropt.planner import plan_job

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(500)]

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from trainer_reference import reference  # noqa: E402

STEPS, KILL, MICRO, TOL = 8, 3, 2, 1e-5


def _job(tmp_path: Path) -> Job:
    return Job.from_dict({
        "model": {"name": "mlp", "kwargs": {"in_features": 16, "hidden": [32, 32], "num_classes": 8},
                  "task": "classification", "input_shape": [16], "num_classes": 8},
        "cluster": "cpu-local", "devices": [1, 2], "planner": {"epsilon": 0}, "select": "fastest",
        "optimizer": {"name": "adamw", "lr": 1e-2, "weight_decay": 0.1, "no_decay": ["bias"]},
        "lr_scheduler": {"warmup_steps": 2, "decay": "cosine", "min_lr_ratio": 0.1},
        "metrics": {"log_every": 1, "jsonl": str(tmp_path / "metrics.jsonl")},
        "training": {"global_batch_size": 16, "steps": STEPS, "micro_batches": MICRO, "max_grad_norm": 0.5,
                     "seed": 0}})


def test_a_killed_agent_leaves_the_survivor_training_on_its_own_plan_exactly(tmp_path, agents):
    job = _job(tmp_path)
    frontier = tmp_path / "frontier.json"
    plan_job(job).write(frontier)
    path = tmp_path / "job.yaml"
    path.write_text(job.to_yaml())
    ckpt, hold = tmp_path / "ckpt", tmp_path / "hold"
    hold.mkdir()
    (hold / "hold-ws2").write_text(str(KILL))  # at world size 2, hold after step KILL's checkpoint
    # Should agent a's rendezvous close before b joins (a loaded machine), a starts alone at world
    # size 1 and holds after its first step; b's arrival then restarts both at world size 2, which
    # resume from that checkpoint (the steps' values are those of one uninterrupted run either way).
    (hold / "hold-ws1").touch()
    port = free_port()
    cmd = elastic_cli(path, frontier, ckpt, STEPS, port, "--max-restarts", 3, "--timeout-s", 450)
    env = {"TENSOROPT_TEST_HOLD_DIR": str(hold)}
    agents.start("a", cmd, env)  # the first agent hosts the rendezvous store: it survives
    wait_until(lambda: listening(port), 120, agents, "the rendezvous store of agent a", alive=("a",))
    agents.start("b", cmd, env)
    at_kill = wait_until(lambda: trainer_state(ckpt, KILL), 240, agents, f"the checkpoint of step {KILL}",
                         alive=("a", "b"))
    assert at_kill["world_size"] == 2 and at_kill["plan_id"].startswith("d2-"), at_kill

    agents.kill("b")  # mid-run: b's worker dies holding after step KILL, a's fails at its next collective
    (hold / "hold-ws2").unlink()
    (hold / "hold-ws1").unlink()  # the survivor trains on to the end
    assert agents.wait("a", 400) == 0, agents.all_text()

    end = trainer_state(ckpt, STEPS)
    assert end["world_size"] == 1 and end["plan_id"].startswith("d1-"), end
    log = agents.text("a")
    assert "elastic: world size 1: plan d1-" in log, log[-3000:]
    assert f"resumed from {ckpt / f'step-{KILL}'} at step {KILL} on 1 process" in log, log[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), [r["step"] for r in rows]
    want = reference(job, MICRO, STEPS)
    for got, w in zip(rows, want, strict=True):
        for key in ("loss", "lr", "grad_norm"):
            assert got[key] == pytest.approx(w[key], abs=TOL, rel=TOL), (got["step"], key, got[key], w[key])
