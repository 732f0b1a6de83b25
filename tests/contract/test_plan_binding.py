"""A plan is bound to its graph; plan, run and elastic selection resolve a job the same way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tensoropt import cli
from tensoropt.capture.fingerprint import fingerprint
from tensoropt.config import Job, format_size
from tensoropt.executor.job.plan import ExecPlan, PlanGraphMismatch, check_plan_graph
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.planner import capture_job, plan_job, resolve_job
from tensoropt.plans import plan_file_text

MODEL = {"factory": "contract_models:build_classifier", "kwargs": {"width": 8},
         "inputs": {"pixel_values": {"shape": [6]}},
         "targets": {"shape": [], "dtype": "int64", "high": 4}, "loss": "cross_entropy"}


def job_dict(width: int = 8) -> dict:
    return {"model": {**MODEL, "kwargs": {"width": width}}, "cluster": "cpu-local", "devices": [1, 2],
            "training": {"global_batch_size": 8, "steps": 2}}


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """The classifier planned at 1 and 2 devices: (folder, job path, frontier.json document)."""
    root = tmp_path_factory.mktemp("bound")
    job_path = root / "job.yaml"
    job_path.write_text(yaml.safe_dump(job_dict()))
    ff = plan_job(Job.from_dict(job_dict()))
    ff.write(root / "frontier.json")
    return root, job_path, ff.to_json()


def plan_doc(frontier: dict, plan_id: str = "d2-p1") -> dict:
    return json.loads(plan_file_text(frontier, plan_id))


def run_cli(root: Path, job: dict, plan: dict, capsys) -> tuple[int, str]:
    job_path, plan_path = root / "run-job.yaml", root / "run-plan.json"
    job_path.write_text(yaml.safe_dump(job))
    plan_path.write_text(json.dumps(plan))
    rc = cli.main(["run", str(job_path), "--plan", str(plan_path), "--nproc", "2", "--steps", "1"])
    return rc, capsys.readouterr().err


def test_plan_and_frontier_carry_the_graph_fingerprint(planned):
    _, _, frontier = planned
    graph = frontier["graph"]
    nodes = {row[0]: row for row in graph["nodes"]}
    assert nodes["linear"] == ["linear", "aten.linear.default", [8, 8], "float32",
                               {"model.fc1.weight": [8, 6], "model.fc1.bias": [8]}]
    assert nodes["targets"][2:4] == [[8], "int64"]
    assert graph["job"]["model"]["kwargs"] == {"width": 8}
    assert graph["job"]["training"]["global_batch_size"] == 8
    assert plan_doc(frontier)["graph"] == graph
    # the fingerprint is of the graph: another width gives another digest, the same job the same one
    again = fingerprint(capture_job(resolve_job(Job.from_dict(job_dict()))), graph["job"])
    assert again["digest"] == graph["digest"]
    other = fingerprint(capture_job(resolve_job(Job.from_dict(job_dict(16)))), graph["job"])
    assert other["digest"] != graph["digest"]


def test_run_refuses_a_plan_made_for_another_graph(planned, capsys):
    root, _, frontier = planned
    rc, err = run_cli(root, job_dict(width=16), plan_doc(frontier), capsys)
    assert rc == 1
    assert "was made for another graph: node 'linear'" in err and "[8, 16]" in err
    assert "re-plan with `tensoropt plan" in err and "run-job.yaml" in err


def test_a_graph_node_missing_from_the_plan_is_an_error(planned, capsys):
    root, _, frontier = planned
    plan = plan_doc(frontier)
    del plan["placements"]["relu"]
    rc, err = run_cli(root, job_dict(), plan, capsys)
    assert rc == 1 and "has no placement for node 'relu'" in err and "re-plan" in err


def test_the_worker_checks_the_graph_it_exported(planned):
    # what each worker runs (Trainer calls it on its own export) against the plan it was given
    _, _, frontier = planned
    plan = ExecPlan.from_json(plan_doc(frontier))
    spec = TrainSpec.from_job(Job.from_dict(job_dict(width=16)))
    graph = capture_job(Job.from_dict(spec.job))
    with pytest.raises(PlanGraphMismatch, match=r"another graph: node 'linear'.*re-plan"):
        check_plan_graph(plan, graph, spec.job)
    same = TrainSpec.from_job(Job.from_dict(job_dict()))
    assert check_plan_graph(plan, capture_job(Job.from_dict(same.job)), same.job) == []


def test_a_plan_without_fingerprint_is_checked_by_node_names(planned):
    _, _, frontier = planned
    graph = capture_job(resolve_job(Job.from_dict(job_dict())))
    legacy = plan_doc(frontier)
    del legacy["graph"]
    assert check_plan_graph(ExecPlan.from_json(legacy), graph) == []
    del legacy["placements"]["relu"]
    warnings = check_plan_graph(ExecPlan.from_json(legacy), graph)
    assert len(warnings) == 1 and "without a graph fingerprint" in warnings[0] and "'relu'" in warnings[0]
    legacy["placements"]["conv"] = legacy["placements"]["linear"]
    with pytest.raises(PlanGraphMismatch, match="places node 'conv'"):
        check_plan_graph(ExecPlan.from_json(legacy), graph)


def test_the_same_graph_with_other_job_fields_warns(planned):
    base = resolve_job(Job.from_dict(job_dict()))
    graph = capture_job(base)
    plan = plan_doc(planned[2])
    changed = base.to_dict()
    changed["model"]["kwargs"] = {"width": 8, "init": "other"}  # a kwarg that leaves the graph as it is
    warnings = check_plan_graph(ExecPlan.from_json(plan), graph, changed)
    assert len(warnings) == 1 and "model.kwargs differ" in warnings[0] and "the plan runs" in warnings[0]
    changed["model"]["kwargs"] = {"width": 8}
    changed["model"]["loss"] = "contract_models:squared_error"  # another loss: another graph
    changed["model"]["targets"] = {"shape": [4], "dtype": "float32"}
    with pytest.raises(PlanGraphMismatch, match=r"node 'targets': the plan has input \[8\] int64"):
        check_plan_graph(ExecPlan.from_json(plan), capture_job(Job.from_dict(changed)), changed)


def test_run_and_elastic_resolve_the_job_as_plan_does(planned):
    root, _, frontier = planned
    job = Job.from_dict(job_dict())
    spec = TrainSpec.from_job(job)
    assert spec.job == frontier["job"]  # the same resolved job: defaults, batch, budget
    from tensoropt.elastic import select_for_world_size

    _, line = select_for_world_size(2, root / "frontier.json", job.to_dict())
    assert f"budget {format_size(frontier['job']['memory_budget'])}" in line


def test_a_float64_check_compares_a_float32_plan_without_dtypes():
    from tensoropt.capture.fingerprint import mismatch

    row = ["images", "input", [4, 3], "float32", {}]
    planned = {"version": 1, "digest": "a", "nodes": [row]}
    running = {"version": 1, "digest": "b", "nodes": [[*row[:3], "float64", {}]]}
    assert "node 'images'" in mismatch(planned, running)
    assert mismatch(planned, running, dtypes=False) is None
    running["nodes"][0][2] = [8, 3]  # a shape still differs
    assert "node 'images'" in mismatch(planned, running, dtypes=False)


def test_a_trainer_refuses_a_plan_for_another_graph(planned):
    # the worker's own check, in process: the 1-device plan of width 8 given a width-16 model
    from tensoropt.training.trainer import Trainer

    plan = ExecPlan.from_json(plan_doc(planned[2], "d1-p0"))
    with pytest.raises(PlanGraphMismatch, match=r"another graph: node 'linear'"):
        Trainer(TrainSpec.from_job(Job.from_dict(job_dict(width=16))), plan)
    trainer = Trainer(TrainSpec.from_job(Job.from_dict(job_dict())), plan)
    assert len(trainer.train(1).steps) == 1
