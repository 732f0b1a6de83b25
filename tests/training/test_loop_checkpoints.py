"""The trainer's loop keeps ``--keep-checkpoints`` complete checkpoints and appends one line per
start to elastic-log.jsonl, as the executor's worker does (in one process, no torchrun; the
pipelined runtime's side: tests/elastic/test_elastic_pipelined.py)."""

from __future__ import annotations

import io
import json

import pytest

from tensoropt.config import Job
from tensoropt.elastic import read_events
from tensoropt.planner import plan_job
from tensoropt.plans import plan_file_text
from tensoropt.training.loop import train

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]


def test_the_loop_keeps_its_newest_checkpoints_and_logs_each_start(tmp_path):
    model = {"name": "mlp", "kwargs": {"in_features": 8, "hidden": [16], "num_classes": 4}}
    job = Job.from_dict({"model": model, "cluster": "cpu-local", "devices": [1],
                         "training": {"global_batch_size": 8, "optimizer": "momentum", "learning_rate": 0.05,
                                      "seed": 0, "steps": 6},
                         "metrics": {"log_every": 1, "jsonl": str(tmp_path / "metrics.jsonl")}})
    frontier = plan_job(job).to_json()
    plan = json.loads(plan_file_text(frontier, frontier["frontiers"][0]["plans"][0]["id"]))
    ck = tmp_path / "ck"
    (ck / "step-00000001").mkdir(parents=True)  # the executor's worker's layout: not the loop's to delete
    common = dict(out_dir=tmp_path, checkpoint_dir=ck, checkpoint_every=1, stream=io.StringIO())
    train(job, plan, steps=4, keep_checkpoints=2, **common)
    assert sorted(p.name for p in ck.glob("step-*")) == ["step-00000001", "step-3", "step-4"]
    (ck / "step-2").mkdir()  # an incomplete folder of an earlier step (a save cut short): deleted
    train(job, plan, keep_checkpoints=3, **common)  # resumed at 4, to the job's 6 steps
    assert sorted(p.name for p in ck.glob("step-*")) == ["step-00000001", "step-4", "step-5", "step-6"]
    starts = [(e["world_size"], e["plan_id"], e["start_step"], e["resumed_from"], e["total_steps"])
              for e in read_events(ck)]
    assert starts == [(1, plan["id"], 0, None, 4), (1, plan["id"], 4, 4, 6)]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
