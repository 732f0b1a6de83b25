"""The example jobs load and resolve; the demo plans and hands over to the executor's run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensoropt import demo
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


def test_demo_plans_both_jobs_and_hands_over_to_run(tmp_path, monkeypatch, capsys):
    job = tmp_path / "tiny.yaml"
    job.write_text(TINY)
    monkeypatch.setattr(demo, "GPU_JOB", job)
    monkeypatch.setattr(demo, "GPU_DEVICES", "1,2")
    monkeypatch.setattr(demo, "CPU_JOB", job)
    calls = []
    monkeypatch.setattr(demo, "run_selected_plan", lambda job, out: calls.append((job, out)) or 0)
    assert demo.main(["--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "tiny" / "frontier.json").exists()
    assert (tmp_path / "out" / "tiny" / "plan.json").exists()
    assert calls == [(job, tmp_path / "out" / "tiny")]
    assert "pareto.html" in capsys.readouterr().out


def test_run_hook_without_the_run_command(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(demo.cli, "command_available", lambda name: False)
    assert demo.run_selected_plan(tmp_path / "job.yaml", tmp_path) == 0
    assert "not available" in capsys.readouterr().out
