"""Your own model runs as it was planned: 2 processes match 1 process, each rank reads only its rows.

One torchrun launch (2 gloo processes) trains every (job, plan) pair; the references are the
plain 1-process runs of the same specs in this process.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from tensoropt.baselines import data_parallel_plan_json
from tensoropt.config import Job
from tensoropt.executor.job.plan import ExecPlan
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.launch import LaunchOptions, launch_workers
from tensoropt.planner import plan_job
from tensoropt.plans import plan_file_text
from tensoropt.training.trainer import Trainer

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

HERE = Path(__file__).resolve().parent
STEPS = 3
BATCH = 8
DATA_SIZE = 20

CLASSIFIER = {"factory": "contract_models:build_classifier", "kwargs": {"width": 8},
              "inputs": {"pixel_values": {"shape": [6]}},
              "targets": {"shape": [], "dtype": "int64", "high": 4}, "loss": "cross_entropy"}
REGRESSION = {"factory": "contract_models:Classifier", "inputs": {"pixel_values": {"shape": [6]}},
              "targets": {"shape": [4]}, "loss": "contract_models:squared_error"}
EXAMPLES = {"factory": "contract_models:ExampleInputsModel"}


def job_dict(model: dict, **extra) -> dict:
    return {"model": model, "cluster": "cpu-local", "devices": [1, 2],
            "training": {"global_batch_size": BATCH, "optimizer": "adamw", "learning_rate": 0.01,
                         "steps": STEPS}, **extra}


def layout(plan: dict, node: str) -> list:
    return plan["placements"][node]["output"]


def model_parallel(plan: dict) -> bool:
    """Whether some parameter of the plan is split (not a pure batch split)."""
    return any(any(p != "R" for p in layout_) for c in plan["placements"].values()
               for layout_ in dict(c.get("params") or {}).values())


def planned(model: dict, **extra) -> tuple[dict, list[dict]]:
    """(frontier.json document, the 2-device plan.json documents) of a job planned at 1 and 2 devices."""
    ff = plan_job(Job.from_dict(job_dict(model, **extra)))
    assert [f.devices for f in ff.frontiers] == [1, 2] and all(f.plans for f in ff.frontiers)
    doc = ff.to_json()
    return doc, [json.loads(plan_file_text(doc, p.id)) for p in ff.frontier(2).plans]


def data_parallel(model: dict) -> dict:
    """The 2-device data-parallel plan.json document of a job, whether or not its frontier lists it
    (a model-parallel plan that is faster and leaner dominates it on a model this small)."""
    return data_parallel_plan_json(Job.from_dict(job_dict(model)), 2)


def reference(spec: TrainSpec) -> tuple[list[float], dict[str, torch.Tensor]]:
    trainer = Trainer(spec, ExecPlan.from_json({"id": "one", "mesh": {"shape": [], "levels": []},
                                                "placements": {}}))
    return [s["loss"] for s in trainer.train(STEPS).steps], trainer.full_params()


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    out = tmp_path_factory.mktemp("contract-run")
    runs = []  # (name, spec, plan)
    _, plans = planned(CLASSIFIER)
    picks = [data_parallel(CLASSIFIER)]  # the batch split
    picks += [p for p in plans if layout(p, "pixel_values") == ["R"] and model_parallel(p)][:1]
    picks += [p for p in plans if layout(p, "pixel_values") != layout(p, "targets")][:1]  # rows differ
    assert len(picks) == 3, [p["summary"] for p in plans]
    spec = TrainSpec.from_job(Job.from_dict(job_dict(CLASSIFIER)))
    runs += [("classifier", spec, p) for p in picks]
    _, plans = planned(REGRESSION)
    spec = TrainSpec.from_job(Job.from_dict(job_dict(REGRESSION)))
    runs += [("regression", spec, p) for p in [plans[0], next(p for p in plans if model_parallel(p))]]
    _, plans = planned(EXAMPLES)
    spec = TrainSpec.from_job(Job.from_dict(job_dict(EXAMPLES)))
    runs += [("examples", spec, next(p for p in plans if model_parallel(p)))]
    # real data: each run records the dataset indices each rank reads
    data_plans = [p for p in picks if layout(p, "targets") == ["S(0)"]]
    for i, p in enumerate(data_plans):
        record = out / f"rows-{i}"
        record.mkdir()
        data = {"factory": "contract_models:recorded_dataset",
                "kwargs": {"size": DATA_SIZE, "record_dir": str(record)}}
        runs.append((f"data{i}", TrainSpec.from_job(Job.from_dict(job_dict(CLASSIFIER, data=data))), p))
    config = {"steps": STEPS, "runs": [
        {"spec": s.to_json(), "plan": p, "metrics": str(out / f"{n}-{p['id']}.json"),
         "params_out": str(out / f"{n}-{p['id']}.pt")} for n, s, p in runs]}
    rc = launch_workers(config, LaunchOptions(2, timeout_s=500),
                        env={"PYTHONPATH": str(HERE), "TENSOROPT_COLLECTIVE_TIMEOUT_S": "60"})
    return out, runs, rc


def test_two_processes_match_one_process(launched, tmp_path):
    out, runs, rc = launched
    assert rc == 0
    errors = []
    for name, spec, plan in runs:
        if name.startswith("data"):  # the reference records its reads elsewhere
            kwargs = {**spec.data["kwargs"], "record_dir": str(tmp_path)}
            spec = dataclasses.replace(spec, data={**spec.data, "kwargs": kwargs})
        ref_losses, ref_params = reference(spec)
        metrics = json.loads((out / f"{name}-{plan['id']}.json").read_text())
        params = torch.load(out / f"{name}-{plan['id']}.pt")
        losses = [s["loss"] for s in metrics["steps"]]
        for step, (a, b) in enumerate(zip(losses, ref_losses, strict=True)):
            if abs(a - b) > 1e-5 * abs(b):
                errors.append(f"{name} {plan['id']} ({plan['summary']}): step {step} loss {a}, 1 process {b}")
        assert set(params) == set(ref_params)
        for key, ref in ref_params.items():
            if float((params[key] - ref).abs().max()) > 1e-5 * float(ref.abs().max()):
                errors.append(f"{name} {plan['id']}: parameter {key} differs")
    assert not errors, "\n".join(errors)


def test_each_rank_reads_only_its_rows_of_the_dataset(launched):
    out, runs, rc = launched
    assert rc == 0
    data_runs = [(spec, plan) for name, spec, plan in runs if name.startswith("data")]
    assert data_runs
    for spec, plan in data_runs:
        record = Path(spec.data["kwargs"]["record_dir"])
        split = layout(plan, "pixel_values") == ["S(0)"]
        for rank in (0, 1):
            read = {int(line) for line in (record / f"rank{rank}.jsonl").read_text().split()}
            # pixel_values split: each rank reads its half of every global batch; replicated
            # pixel_values (targets split): every row of it
            rows = range(rank * BATCH // 2, (rank + 1) * BATCH // 2) if split else range(BATCH)
            want = {(step * BATCH + r) % DATA_SIZE for step in range(STEPS) for r in rows}
            assert read == want, (plan["summary"], rank)
