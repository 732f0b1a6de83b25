"""Elastic relaunch of pipelined plans (issue 27), both ways: a torchrun agent starts `tensoropt
run --elastic` alone (world size 1: the 1-device plan, no stages) and holds after step JOIN's
checkpoint; a second agent joins and both relaunch at world size 2, where the job's rule selects a
pipelined plan from frontier.json (the tiny zoo GPT in 2 stages, 1F1B, 2 micro-batches), resumed
from the 1-process checkpoint; after step KILL's checkpoint the second agent is killed and the
survivor relaunches at world size 1 on the 1-device plan, resumes from the pipelined checkpoint and
trains to the end. Every step's loss, learning rate and gradient norm equal an uninterrupted
1-process loop's within 1e-5 (the tolerance of test_elastic_trainer.py)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
from elastic_helpers import free_port, run_cli, wait_until

from tensoropt.config import Job
from tensoropt.elastic import HOLD_DIR_ENV

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(300)]

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from trainer_reference import reference  # noqa: E402

STEPS, JOIN, KILL, MICRO, TOL = 5, 1, 3, 2, 1e-5


def _job(tmp_path: Path) -> dict:
    """The tiny zoo GPT (untied head: 4 pipeline blocks) with momentum SGD in fp32 (AdamW turns the
    attention key biases' exactly-zero gradients into lr-sized steps: tests/pipeline_runtime/
    pipeline_jobs.py), planned for 1 and 2 devices with 2-stage pipelines beside the other plans."""
    return {"model": {"name": "gpt", "kwargs": {"layers": 2, "width": 32, "heads": 2, "seq_len": 8,
                                                "vocab_size": 64, "dropout": 0.0, "tie_weights": False}},
            "cluster": "cpu-local", "devices": [1, 2], "select": "fastest",
            "training": {"global_batch_size": 8, "optimizer": "momentum", "learning_rate": 0.05, "seed": 0,
                         "steps": STEPS},
            "metrics": {"log_every": 1, "jsonl": str(tmp_path / "metrics.jsonl")},
            "planner": {"pipeline": {"stages": [2], "schedules": ["1F1B"], "micro_batches": [MICRO]}}}


def _frontier(job: dict, path: Path) -> set[str]:
    """Plan the job into ``path``, the 2-device frontier kept to its pipelined plans (as a budget
    that only pipelined plans fit leaves it; on cpu-local no budget does that while a 1-device plan
    still fits); returns the pipelined plans' ids."""
    from tensoropt.planner import plan_job

    one = plan_job(Job.from_dict({**job, "devices": [1], "planner": {"pipeline": "off"}}))  # 2 stages need 2
    two = plan_job(Job.from_dict({**job, "devices": [2]}))
    staged = [p for p in two.frontier(2).plans if p.pipeline]
    assert staged and one.frontier(1).plans, "the test needs pipelined plans at 2 and a plan at 1"
    kept = dataclasses.replace(two.frontier(2), plans=staged)
    dataclasses.replace(two, frontiers=[one.frontier(1), kept]).write(path)
    return {p.id for p in staged}


def _state(ckpt: Path, step: int) -> dict | None:
    path = ckpt / f"step-{step}" / "trainer.json"
    return json.loads(path.read_text()) if path.is_file() else None


def test_a_run_gains_a_device_onto_a_pipelined_plan_and_loses_it_exactly(tmp_path, agents):
    job = _job(tmp_path)
    frontier = tmp_path / "frontier.json"
    staged = _frontier(job, frontier)
    path = tmp_path / "job.yaml"
    path.write_text(Job.from_dict(job).to_yaml())
    ckpt, hold = tmp_path / "ckpt", tmp_path / "hold"
    hold.mkdir()
    (hold / "hold-ws1").write_text(str(JOIN))  # alone, hold after step JOIN's checkpoint
    (hold / "hold-ws2").write_text(str(KILL))  # at world size 2, hold after step KILL's checkpoint
    cmd = run_cli(path, "--elastic", "--nnodes", "1:2", "--nproc-per-node", 1, "--rdzv-endpoint",
                  f"127.0.0.1:{free_port()}", "--rdzv-conf", "last_call_timeout=1,join_timeout=120",
                  "--max-restarts", 3, "--frontier", frontier, "--steps", STEPS,
                  "--checkpoint-dir", ckpt, "--checkpoint-every", 1, "--timeout-s", 280)
    env = {HOLD_DIR_ENV: str(hold)}  # the agents bound every collective at 60 s (elastic_helpers)
    agents.start("a", cmd, env)  # the first agent hosts the rendezvous store: it survives
    alone = wait_until(lambda: _state(ckpt, JOIN), 200, agents, f"the checkpoint of step {JOIN}",
                       alive=("a",))
    assert alone["world_size"] == 1 and alone["plan_id"].startswith("d1-") and not alone.get("pipelined")

    agents.start("b", cmd, env)  # a device gained: both relaunch at world size 2 on the pipelined plan
    at_kill = wait_until(lambda: _state(ckpt, KILL), 200, agents, f"the checkpoint of step {KILL}",
                         alive=("a", "b"))
    assert at_kill["world_size"] == 2 and at_kill["pipelined"] and at_kill["plan_id"] in staged, at_kill

    (hold / "hold-ws1").unlink()  # the survivor trains on to the end
    agents.kill("b")  # a device lost: a's worker fails at its next collective, a's agent relaunches it
    (hold / "hold-ws2").unlink()
    assert agents.wait("a", 200) == 0, agents.all_text()
    end = _state(ckpt, STEPS)
    assert end["world_size"] == 1 and end["plan_id"] == alone["plan_id"] and not end.get("pipelined"), end

    log = "".join(agents.text(n) for n in ("a", "b"))  # rank 0 may be on either agent
    assert f"elastic: world size 2: plan {at_kill['plan_id']}" in log, log[-3000:]
    assert f"elastic: world size 1: plan {alone['plan_id']}" in log, log[-3000:]
    assert f"resumed from {ckpt / f'step-{JOIN}'} at step {JOIN} on 2 process" in log, log[-3000:]
    assert f"resumed from {ckpt / f'step-{KILL}'} at step {KILL} on 1 process" in log, log[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), [r["step"] for r in rows]
    want = reference(Job.from_dict(job), MICRO, STEPS)
    for got, w in zip(rows, want, strict=True):
        for key in ("loss", "lr", "grad_norm"):
            assert got[key] == pytest.approx(w[key], abs=TOL, rel=TOL), (got["step"], key, got[key], w[key])
