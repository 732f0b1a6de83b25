"""``tensoropt run`` refuses trainer keys its model or plan cannot honour before any worker starts
(issue 25's acceptance list), each with a one-line error naming the key; and `plan` writes the
micro-batch count into every plan entry, which `explain` and the table show."""

from __future__ import annotations

import json

import pytest
import yaml

from tensoropt import cli
from tensoropt.plans import plan_file_text

MLP = {"name": "mlp", "kwargs": {"in_features": 16, "hidden": [32], "num_classes": 4}}


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """An mlp job planned for 2 devices with micro_batches: auto (its frontier and a plan.json)."""
    out = tmp_path_factory.mktemp("plan")
    job = {"model": MLP, "cluster": "cpu-local", "devices": [2],
           "training": {"global_batch_size": 8, "steps": 4, "micro_batches": "auto"}}
    (out / "job.yaml").write_text(yaml.safe_dump(job))
    assert cli.main(["plan", str(out / "job.yaml"), "--out", str(out)]) == 0
    return out, job


def _run(tmp_path, job, plan, capsys, **sections):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**job, **sections}))
    rc = cli.main(["run", str(path), "--plan", str(plan), "--nproc", "2", "--timeout-s", "60"])
    return rc, capsys.readouterr().err


def test_plan_files_carry_the_count_and_the_table_and_explain_show_it(planned, capsys):
    out, _ = planned
    frontier = json.loads((out / "frontier.json").read_text())
    plans = frontier["frontiers"][0]["plans"]
    assert all(isinstance(p["micro_batches"], int) for p in plans)
    assert len({p["micro_batches"] for p in plans}) > 1
    plan = json.loads((out / "plan.json").read_text())
    assert plan["micro_batches"] in {p["micro_batches"] for p in plans}
    assert cli.main(["explain", str(out / "frontier.json"), "--id", plans[-1]["id"]]) == 0
    assert f"micro-batches: {plans[-1]['micro_batches']} per step" in capsys.readouterr().out


def test_no_decay_naming_nothing_is_refused_before_any_worker(planned, tmp_path, capsys):
    out, job = planned
    rc, err = _run(tmp_path, job, out / "plan.json", capsys, optimizer={"no_decay": ["bias", "norm"]})
    assert rc == 1 and "optimizer.no_decay: 'norm' names none of the model's" in err
    assert "tensoropt run: mlp" not in err  # nothing launched


def test_an_unwritable_tensorboard_directory_is_refused(planned, tmp_path, capsys):
    out, job = planned
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    rc, err = _run(tmp_path, job, out / "plan.json", capsys, metrics={"tensorboard": str(blocked / "tb")})
    assert rc == 1 and f"metrics.tensorboard: cannot write to {blocked / 'tb'}" in err


def test_a_plan_of_another_count_than_the_job_s_is_refused(planned, tmp_path, capsys):
    out, job = planned
    frontier = json.loads((out / "frontier.json").read_text())
    plan_id = next(p["id"] for p in frontier["frontiers"][0]["plans"] if p["micro_batches"] > 1)
    (tmp_path / "p.json").write_text(plan_file_text(frontier, plan_id))
    m = json.loads((tmp_path / "p.json").read_text())["micro_batches"]
    fixed = {**job, "training": {**job["training"], "micro_batches": 1}}
    rc, err = _run(tmp_path, fixed, tmp_path / "p.json", capsys)
    assert rc == 1 and f"was planned with {m} micro-batches" in err
