"""Elastic relaunch of pipelined plans, both ways (issue 27): the scenario that
tests/elastic/test_elastic_pipelined.py runs with 1 process per agent and
benchmarks/elastic_pipelined.py with 2 (pp=2 x dp=2 at 4 processes).

A torchrun agent starts ``tensoropt run --elastic`` alone: world size P, the P-device plan without
stages, which holds after step JOIN's checkpoint. A second agent of P processes joins and both
relaunch at world size 2P, where the job's rule selects a pipelined plan from frontier.json (the tiny
zoo GPT in 2 stages, 1F1B, 2 micro-batches, P replicas per stage), resumed from the loop's
checkpoint; it holds after step KILL's. The second agent is killed (command, agent, workers) and the
survivor relaunches at world size P on its plan without stages, resumes from the pipelined
checkpoint and trains to STEPS. ``--keep-checkpoints 1``: each runtime deletes the checkpoint the
other wrote once its own is complete.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from elastic_helpers import Agents, elastic_cli, free_port, trainer_state, wait_until

from tensoropt.config import Job
from tensoropt.elastic import HOLD_DIR_ENV, read_events

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from trainer_reference import reference  # noqa: E402

STEPS, JOIN, KILL, MICRO, TOL = 3, 1, 2, 2, 1e-5
"""Step 1 on P processes, step 2 pipelined on 2P, step 3 on P again; the tolerance of
test_elastic_trainer.py."""


def gpt_job(tmp: Path, per_agent: int) -> dict:
    """The tiny zoo GPT (untied head: 4 pipeline blocks) with momentum SGD in fp32 (AdamW turns the
    attention key biases' exactly-zero gradients into lr-sized steps: tests/pipeline_runtime/
    pipeline_jobs.py), for ``per_agent`` and twice as many devices, 2-stage pipelines planned."""
    return {"model": {"name": "gpt", "kwargs": {"layers": 2, "width": 32, "heads": 2, "seq_len": 8,
                                                "vocab_size": 64, "dropout": 0.0, "tie_weights": False}},
            "cluster": "cpu-local", "devices": [per_agent, 2 * per_agent], "select": "fastest",
            "training": {"global_batch_size": 8, "optimizer": "momentum", "learning_rate": 0.05, "seed": 0,
                         "steps": STEPS},
            "metrics": {"log_every": 1, "jsonl": str(tmp / "metrics.jsonl")},
            "planner": {"pipeline": {"stages": [2], "schedules": ["1F1B"], "micro_batches": [MICRO]}}}


def plan_frontier(job: dict, path: Path, per_agent: int) -> set[str]:
    """Plan ``job`` into ``path``: at ``per_agent`` devices without pipelines, at twice as many kept to
    the pipelined plans, its data-parallel plan dropped too (as a budget only they fit leaves it; on
    cpu-local no budget does that while a plan without stages fits the smaller count); returns the
    pipelined plans' ids."""
    from tensoropt.planner import plan_job

    small = plan_job(Job.from_dict({**job, "devices": [per_agent], "planner": {"pipeline": "off"}}))
    large = plan_job(Job.from_dict({**job, "devices": [2 * per_agent]}))
    staged = [p for p in large.frontier(2 * per_agent).plans if p.pipeline]
    assert staged and small.frontier(per_agent).plans, "needs pipelined plans at 2P and a plan at P"
    # the data-parallel plan goes too: the selection's margin rule would take it over a pipelined
    # plan predicted less than the estimator's error faster (tensoropt.selector.simplest_within)
    kept = dataclasses.replace(large.frontier(2 * per_agent), plans=staged, data_parallel=None)
    dataclasses.replace(large, frontiers=[small.frontier(per_agent), kept]).write(path)
    return {p.id for p in staged}


@dataclasses.dataclass
class Outcome:
    """What the scenario left: the checkpoints' ``trainer.json`` at JOIN (alone), KILL (both) and
    STEPS (the survivor), the metrics rows, the per-start events, the step folders left, the agents'
    logs, the 1-process reference and the seconds from the first start to each checkpoint."""

    alone: dict
    at_kill: dict
    end: dict
    staged: set[str]
    rows: list[dict]
    events: list[dict]
    folders: list[str]
    log: str
    want: list[dict]
    times_s: dict[str, float]


def gain_and_lose(tmp: Path, agents: Agents, per_agent: int = 1, timeout_s: float = 280) -> Outcome:
    """Run the scenario (module docstring) in ``tmp`` with agents of ``per_agent`` processes."""
    job = gpt_job(tmp, per_agent)
    frontier = tmp / "frontier.json"
    staged = plan_frontier(job, frontier, per_agent)
    path = tmp / "job.yaml"
    path.write_text(Job.from_dict(job).to_yaml())
    ckpt, hold = tmp / "ckpt", tmp / "hold"
    hold.mkdir()
    small, large = f"hold-ws{per_agent}", f"hold-ws{2 * per_agent}"
    (hold / small).write_text(str(JOIN))  # alone, hold after step JOIN's checkpoint
    (hold / large).write_text(str(KILL))  # both agents: hold after step KILL's checkpoint
    cmd = elastic_cli(path, frontier, ckpt, STEPS, free_port(), "--max-restarts", 3, "--keep-checkpoints", 1,
                      "--timeout-s", timeout_s, per_agent=per_agent)
    env = {HOLD_DIR_ENV: str(hold)}  # the agents bound every collective at 60 s (elastic_helpers)
    wait_s = timeout_s - 80
    start = time.perf_counter()
    agents.start("a", cmd, env)  # the first agent hosts the rendezvous store: it survives
    alone = wait_until(lambda: trainer_state(ckpt, JOIN), wait_s, agents, f"the checkpoint of step {JOIN}",
                       alive=("a",))
    times = {"alone": time.perf_counter() - start}

    agents.start("b", cmd, env)  # devices gained: both relaunch at world size 2P on the pipelined plan
    at_kill = wait_until(lambda: trainer_state(ckpt, KILL), wait_s, agents, f"the checkpoint of step {KILL}",
                         alive=("a", "b"))
    wait_until(lambda: not (ckpt / f"step-{JOIN}").exists(), 60, agents,  # --keep-checkpoints 1
               f"the pipelined runtime to delete step-{JOIN}", alive=("a", "b"))
    times["pipelined"] = time.perf_counter() - start

    (hold / small).unlink()  # the survivor trains on to the end
    agents.kill("b")  # devices lost: a's workers fail at their next collective, a's agent relaunches them
    (hold / large).unlink()
    assert agents.wait("a", wait_s) == 0, agents.all_text()
    times["end"] = time.perf_counter() - start
    return Outcome(alone=alone, at_kill=at_kill, end=trainer_state(ckpt, STEPS), staged=staged,
                   rows=[json.loads(line) for line in (tmp / "metrics.jsonl").read_text().splitlines()],
                   events=read_events(ckpt), folders=sorted(p.name for p in ckpt.glob("step-*")),
                   log="".join(agents.text(n) for n in ("a", "b")),  # rank 0 may be on either agent
                   want=reference(Job.from_dict(job), MICRO, STEPS), times_s=times)


def differences(outcome: Outcome) -> list[tuple[int, str, float, float, float]]:
    """Every step's (step, key, got, want, relative difference) of loss, learning rate and gradient
    norm against the uninterrupted 1-process loop."""
    out = []
    for got, want in zip(outcome.rows, outcome.want, strict=True):
        for key in ("loss", "lr", "grad_norm"):
            out.append((want["step"], key, got[key], want[key],
                        abs(got[key] - want[key]) / max(abs(want[key]), 1e-30)))
    return out
