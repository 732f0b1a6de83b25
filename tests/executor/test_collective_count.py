"""The cost graph's sync points against the replayed program's blocking collectives (issue 29 item 4).

At 2 gloo processes, hand plans of the toy models are traced once each and every collective of the
program listed (``benchmarks/collective_match.py``); the plan's priced collectives are listed by
:func:`estimators.priced_collectives.priced_collectives`. Per plan the blocking ones are equal in
number and in (kind, bytes), and each plan trains as the one-process model:

* ``cnn-convout``: the channel-split batch norm's running statistics, gathered back into the
  replicated buffers, are no longer waited for at the batch norm (the program's wait and the
  buffers' writes sink to its end: ``graph_passes.sink_waits``);
* ``mlp-tp``: Megatron's pair (the row-parallel output's all-reduce), matched as it was;
* ``cls-dp-head``: a batch-split output whose first token's rows a replicated head reads: the rows
  are selected on each shard and gathered (8 x 8 floats), not the whole output gathered first
  (8 x 6 x 8; ``interpreter.carried``), as the cost graph prices it.

A gradient only its producer's parameters read is no sync point:
``tests/estimators/test_priced_collectives.py``.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
from hand_plans import SPECS, all_plans, cls_plans
from launch_helpers import ENV, HERE, ROOT, single_process

from estimators.configuration import Configuration, Mesh
from estimators.priced_collectives import priced_collectives
from tensoropt.capture import capture
from tensoropt.executor.job.data import synthetic_batch
from tensoropt.launch import LaunchOptions, launch_module

BENCHMARKS = ROOT / "benchmarks"
PLANS = {"cnn-convout": "cnn", "mlp-tp": "mlp", "cls-dp-head": "cls"}


def _priced(name: str, plan: dict) -> list[dict]:
    spec = SPECS[name]
    batch = synthetic_batch(list(spec.inputs), spec.global_batch_size, spec.seed, 0)
    graph = capture(spec.build_model(), batch)
    assignment = {n: Configuration.from_json(c) for n, c in plan["placements"].items()}
    return priced_collectives(graph.nx, "cpu-local", Mesh.from_json(plan["mesh"]), assignment)


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_priced_blocking_collectives_are_the_replayed_programs(tmp_path):
    out = tmp_path / "collectives.json"
    env = {**ENV, "PYTHONPATH": os.pathsep.join([ENV["PYTHONPATH"], str(BENCHMARKS)])}
    rc = launch_module(str(HERE / "collective_count_probe.py"), [str(out), *PLANS],
                       LaunchOptions(2, timeout_s=240), env=env)
    assert rc == 0
    got = json.loads(out.read_text())
    run = {plan_id: g["collectives"] for plan_id, g in got.items()}
    plans = {p["id"]: p for _, p in all_plans(2)} | {p["id"]: p for p in cls_plans()}
    for plan_id, name in PLANS.items():
        priced = Counter((p["kind"], round(p["bytes"])) for p in _priced(name, plans[plan_id])
                         if p["blocking"])
        blocking = Counter((r["kind"], round(r["bytes"])) for r in run[plan_id]
                           if not r["bucket"] and not r["hidden"])
        assert priced == blocking, (plan_id, priced, blocking, run[plan_id])
    for plan_id, name in PLANS.items():  # trained as the one-process model (steps 1-2 replayed)
        assert got[plan_id]["losses"] == pytest.approx(single_process(SPECS[name])[0], rel=1e-5), plan_id
    # the gathered running statistics: issued at the batch norm, waited for at the program's end
    gathers = [r for r in run["cnn-convout"] if r["kind"] == "all_gather" and r["owner"] == "batch_norm"]
    assert len(gathers) == 1 and gathers[0]["hidden"] and gathers[0]["between"] > 20, run["cnn-convout"]
