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


def test_the_cpu_demo_job_selects_a_plan_for_the_2_processes_it_runs_on(tmp_path):
    """README and `make demo` run `tensoropt run ... --plan out/cpu-demo/plan.json --nproc 2`."""
    import json

    from tensoropt import cli

    assert cli.main(["plan", str(demo.CPU_JOB), "--out", str(tmp_path), "--quiet"]) == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["devices"] == 2
    assert load_job(demo.CPU_JOB).memory_budget < plan["memory_bytes"] * 2  # one process would not fit


def test_demo_run_selects_for_its_process_count_when_the_rule_chose_another(tmp_path, monkeypatch):
    import json

    from tensoropt import cli

    job = tmp_path / "tiny.yaml"
    job.write_text(TINY.replace("devices: [1, 2]", "devices: [1, 2]\nselect: fewest_devices"))
    assert cli.main(["plan", str(job), "--out", str(tmp_path), "--quiet"]) == 0
    assert json.loads((tmp_path / "plan.json").read_text())["devices"] == 1
    ran = []
    real_main = cli.main
    monkeypatch.setattr(demo.cli, "main", lambda argv: ran.append(argv) or (
        0 if argv[0] == "run" else real_main(argv)))
    assert demo.run_selected_plan(job, tmp_path) == 0
    assert [a[0] for a in ran] == ["select", "run"]
    assert json.loads((tmp_path / "plan.json").read_text())["devices"] == 2
