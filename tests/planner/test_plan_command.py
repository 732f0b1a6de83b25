"""`tensoropt plan` end to end on small models (real capture, cost graph and solver)."""

from __future__ import annotations

import json
import textwrap

import pytest

from tensoropt import cli
from tensoropt.config import load_job
from tensoropt.planner import plan_job
from tensoropt.plans import load_frontier_file, plan_file_text
from tensoropt.selector import select

MLP_JOB = textwrap.dedent("""\
    model:
      name: mlp
      kwargs: {in_features: 64, hidden: [256, 128], num_classes: 10}
    training: {global_batch_size: 16, optimizer: adamw}
    cluster: cpu-local
    devices: [1, 2, 4]
    memory_budget: BUDGET
""")

GPT_JOB = textwrap.dedent("""\
    model:
      name: gpt
      kwargs: {layers: 1, width: 32, heads: 2}
      seq_len: 16
      vocab_size: 64
    training: {global_batch_size: 4, optimizer: sgd}
    cluster: cpu-local
    devices: [1, 2]
""")


def write_job(tmp_path, text, name="job.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def mlp_frontier(tmp_path_factory):
    """The tiny MLP planned once for the module (the real pipeline)."""
    path = write_job(tmp_path_factory.mktemp("mlp"), MLP_JOB.replace("BUDGET", "1GiB"))
    return plan_job(load_job(path))


def test_frontiers_are_sorted_non_dominated_and_complete(mlp_frontier):
    ff = mlp_frontier
    assert [f.devices for f in ff.frontiers] == [1, 2, 4]
    assert ff.job["training"]["global_batch_size"] == 16 and ff.job["model"]["task"] == "classification"
    for f in ff.frontiers:
        assert f.mesh.num_devices == f.devices and f.plans
        times = [p.time_s for p in f.plans]
        assert times == sorted(times)
        for a in f.plans:
            for b in f.plans:
                assert a is b or not (
                    b.time_s <= a.time_s
                    and b.memory_bytes <= a.memory_bytes
                    and (b.time_s, b.memory_bytes) != (a.time_s, a.memory_bytes)
                )
        nodes = set(f.plans[0].ops)
        for p in f.plans:
            assert set(p.ops) == nodes and p.summary.startswith("fc: ")
            for node, label in p.ops.items():
                assert f.configuration(node, label).label == label


def test_breakdown_adds_up_to_the_plan_cost(mlp_frontier):
    for f in mlp_frontier.frontiers:
        for p in f.plans:
            time_s = sum(x.compute_s + x.comm_s for x in p.layers) + sum(r.time_s for r in p.redistributions)
            memory = sum(x.memory_bytes for x in p.layers)
            assert time_s == pytest.approx(p.time_s, rel=1e-9)
            assert memory == pytest.approx(p.memory_bytes, rel=1e-9, abs=1)
            assert {x.node for x in p.layers} <= set(p.ops)
            assert all(x.op.startswith("aten.") for x in p.layers)
            for r in p.redistributions:
                assert r.time_s > 0 or r.from_layout != r.to_layout


def test_more_devices_never_need_more_memory_for_the_smallest_plan(mlp_frontier):
    smallest = [min(p.memory_bytes for p in f.plans) for f in mlp_frontier.frontiers]
    assert smallest == sorted(smallest, reverse=True) and smallest[-1] < smallest[0]


def test_plan_command_writes_files_and_selects_the_fastest_under_budget(tmp_path, capsys):
    job = write_job(tmp_path, MLP_JOB.replace("BUDGET", "1GiB"))
    out = tmp_path / "out"
    assert cli.main(["plan", str(job), "--out", str(out), "--quiet"]) == 0
    ff = load_frontier_file(out / "frontier.json")
    expected = select(ff, memory_budget_bytes=2**30)
    assert ff.selected == expected.plan.id
    assert (out / "plan.json").read_text() == plan_file_text(
        json.loads((out / "frontier.json").read_text()), ff.selected
    )
    html = (out / "pareto.html").read_text()
    assert "<html" in html.lower() and ff.selected in html
    text = capsys.readouterr().out
    assert "4 devices (mesh 2x2)" in text and f"selected {ff.selected}" in text


def test_plan_command_budget_override_infeasible_exit_2(tmp_path, capsys):
    job = write_job(tmp_path, MLP_JOB.replace("BUDGET", "1GiB"))
    out = tmp_path / "out"
    (out).mkdir()
    (out / "plan.json").write_text("{stale}")
    rc = cli.main(["plan", str(job), "--out", str(out), "--quiet", "--no-plot", "--memory-budget", "1KiB"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "no plan fits 1.0 KiB per device" in err and "No planned device count fits" in err
    assert load_frontier_file(out / "frontier.json").selected is None
    assert not (out / "plan.json").exists() and not (out / "pareto.html").exists()


@pytest.mark.parametrize(
    "edit, message",
    [
        (("cluster: cpu-local", "cluster: no-such-cluster"), "unknown cluster profile 'no-such-cluster'"),
        (
            ("devices: [1, 2, 4]", "devices: [1, 16]"),
            "devices: [16] exceed the 8 devices of cluster 'cpu-local'",
        ),
        (("name: mlp", "name: no-such-model"), "model: cannot build 'no-such-model'"),
        (("BUDGET", "BUDGET\nselect: slowest"), "select: got 'slowest'"),
    ],
)
def test_plan_command_errors_name_the_problem_and_write_nothing(tmp_path, capsys, edit, message):
    job = write_job(tmp_path, MLP_JOB.replace(*edit).replace("BUDGET", "1GiB"))
    out = tmp_path / "out"
    assert cli.main(["plan", str(job), "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert message in err and str(job) in err
    assert not out.exists()


def test_transformer_plan_summary_and_explain(tmp_path, capsys):
    job = write_job(tmp_path, GPT_JOB)
    out = tmp_path / "out"
    assert cli.main(["plan", str(job), "--out", str(out), "--quiet", "--no-plot"]) == 0
    ff = load_frontier_file(out / "frontier.json")
    summaries = " ".join(p.summary for f in ff.frontiers for p in f.plans)
    assert "attention" in summaries and "fc" in summaries and "embedding" in summaries
    capsys.readouterr()
    assert cli.main(["explain", str(out / "plan.json")]) == 0
    text = capsys.readouterr().out
    _, plan = ff.find(ff.selected)
    assert f"plan {plan.id}" in text and all(x.node in text for x in plan.layers)


def test_epsilon_frontier_covers_the_exact_one(tmp_path, mlp_frontier):
    path = write_job(tmp_path, MLP_JOB.replace("BUDGET", "1GiB") + "planner: {epsilon: 0.2}\n")
    approx = plan_job(load_job(path))
    for exact, thin in zip(mlp_frontier.frontiers, approx.frontiers):
        assert len(thin.plans) <= len(exact.plans)
        for p in exact.plans:
            assert any(
                q.time_s <= p.time_s * 1.2 * (1 + 1e-9) and q.memory_bytes <= p.memory_bytes * 1.2 + 1
                for q in thin.plans
            )
    assert sum(len(f.plans) for f in approx.frontiers) < sum(len(f.plans) for f in mlp_frontier.frontiers)


def test_a_solve_past_the_memory_limit_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TENSOROPT_SOLVER_MEMORY_GIB", "1e-7")  # ~100 bytes: every solve outgrows it
    job = write_job(tmp_path, MLP_JOB.replace("BUDGET", "1GiB"))
    out = tmp_path / "out"
    assert cli.main(["plan", str(job), "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    # refused up front (the cost tables alone) or by the solve: either names the limit and the fix
    assert ("solving the frontier for" in err or "cost graph for" in err) and "past the solver limit" in err
    assert "planner.space: hierarchical" in err and not (out / "frontier.json").exists()
