"""The example jobs load and resolve; `make demo` plans, runs for real, and fails loudly."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tensoropt import cli, demo
from tensoropt.config import load_job
from tensoropt.planner import load_job_cluster, resolve_job

JOBS = sorted((Path(__file__).resolve().parents[2] / "configs" / "jobs").glob("*.yaml"))
ZOO = {"mlp", "alexnet", "vgg16", "resnet50", "wide-resnet", "gpt2-small", "gpt-1.3b", "bert-base"}


def test_there_is_an_example_job_per_zoo_model():
    names = {load_job(p).model.name for p in JOBS}
    assert ZOO <= names


@pytest.mark.parametrize("path", JOBS, ids=[p.stem for p in JOBS])
def test_example_job_resolves(path):
    job = load_job(path)
    cluster = load_job_cluster(job)  # raises if a device count exceeds the cluster
    assert max(job.devices) <= cluster.max_devices
    resolved = resolve_job(job, cluster=cluster)
    if resolved.model.contract:  # your own model: its inputs and loss come with the job
        assert resolved.model.loss and (resolved.model.inputs or resolved.model.factory)
    else:
        assert resolved.model.task in ("classification", "language_model")
    assert resolved.training.global_batch_size >= 1 and resolved.memory_budget > 0
    if path.stem in ZOO - {"gpt-1.3b"}:
        assert job.devices == [1, 2, 4, 8, 16, 32, 64]
    if path.stem == "gpt-1.3b":
        assert job.devices[-1] == 1024 and cluster.num_nodes > 1


TINY = """\
model:
  name: mlp
  kwargs: {in_features: 16, hidden: [32], num_classes: 4}
training: {global_batch_size: 8, optimizer: sgd}
cluster: cpu-local
devices: [1, 2]
"""


@pytest.mark.distributed
def test_demo_plans_both_jobs_selects_for_2_processes_and_runs_for_real(tmp_path, monkeypatch, capsys):
    """`make demo` on a tiny job: plan, re-select for the 2 processes (the job's rule picks 1
    device), then the real `tensoropt run` on 2 processes (torchrun, gloo)."""
    job = tmp_path / "tiny.yaml"
    job.write_text(TINY.replace("devices: [1, 2]", "devices: [1, 2]\nselect: fewest_devices"))
    monkeypatch.setattr(demo, "GPU_JOB", job)
    monkeypatch.setattr(demo, "GPU_DEVICES", "1,2")
    monkeypatch.setattr(demo, "CPU_JOB", job)
    out = tmp_path / "out" / "tiny"
    assert demo.main(["--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "$ tensoropt select" in printed and "$ tensoropt run" in printed and "pareto.html" in printed
    plan = json.loads((out / "plan.json").read_text())
    assert plan["devices"] == 2, "the demo runs on 2 processes: it must select a 2-device plan"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["plan_id"] == plan["id"] and metrics["devices"] == 2
    losses = [s["loss"] for s in metrics["steps"]]
    assert [s["step"] for s in metrics["steps"]] == list(range(20)) and all(map(math.isfinite, losses))
    assert f"plan {plan['id']} on 2 devices: step time predicted" in printed  # run's summary


def test_demo_fails_loudly_when_the_run_command_is_missing(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(demo.cli, "command_available", lambda name: name != "run")
    assert demo.run_selected_plan(tmp_path / "job.yaml", tmp_path) != 0
    assert "`tensoropt run` command does not import" in capsys.readouterr().err


def test_demo_fails_loudly_when_the_run_fails(tmp_path, capsys):
    """The real `tensoropt run` refuses a damaged plan.json: the demo exits non-zero and says so."""
    job = tmp_path / "tiny.yaml"
    job.write_text(TINY)
    assert cli.main(["plan", str(job), "--out", str(tmp_path), "--quiet", "--devices", "2"]) == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    del plan["placements"]
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    capsys.readouterr()
    assert demo.run_selected_plan(job, tmp_path, steps=2) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert "placements" in err, "run's own message names what is wrong"
    assert "make demo: `tensoropt run" in err and "failed with exit code 1" in err
    assert not (tmp_path / "metrics.json").exists()


def test_demo_fails_loudly_when_no_plan_fits(tmp_path, monkeypatch, capsys):
    job = tmp_path / "tiny.yaml"
    job.write_text(TINY + "memory_budget: 1KiB\n")
    monkeypatch.setattr(demo, "GPU_JOB", job)
    monkeypatch.setattr(demo, "GPU_DEVICES", "1,2")
    monkeypatch.setattr(demo, "CPU_JOB", job)
    assert demo.main(["--out", str(tmp_path / "out")]) == cli.EXIT_ERROR
    assert "nothing to run" in capsys.readouterr().err


def test_the_cpu_demo_job_selects_a_plan_for_the_2_processes_it_runs_on(tmp_path):
    """README and `make demo` run `tensoropt run ... --plan out/cpu-demo/plan.json --nproc 2`."""
    assert cli.main(["plan", str(demo.CPU_JOB), "--out", str(tmp_path), "--quiet"]) == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["devices"] == 2
    assert load_job(demo.CPU_JOB).memory_budget < plan["memory_bytes"] * 2  # one process would not fit
