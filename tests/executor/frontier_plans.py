"""Frontier plans of the toy models, made by the real planner (capture -> costs -> FT solve)."""

from __future__ import annotations

import json

from tensoropt.config import Job
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.planner import plan_job
from tensoropt.plans import plan_file_text

JOBS = {
    "mlp": {"model": {"factory": "toy_models:MLP", "task": "classification", "input_shape": [8],
                      "num_classes": 4},
            "training": {"global_batch_size": 8, "optimizer": "adamw", "learning_rate": 0.01, "steps": 3}},
    "cnn": {"model": {"factory": "toy_models:CNN", "task": "classification", "input_shape": [3, 8, 8],
                      "num_classes": 4},
            "training": {"global_batch_size": 8, "optimizer": "momentum", "learning_rate": 0.05, "steps": 3}},
    "gpt": {"model": {"factory": "toy_models:GPT", "task": "language_model", "seq_len": 4, "vocab_size": 16},
            "training": {"global_batch_size": 4, "optimizer": "momentum", "learning_rate": 0.1, "steps": 3}},
}
"""Toy jobs (the GPT trains with momentum: AdamW turns the exactly-zero gradient of the key bias
into noise-driven steps, which no parity tolerance can hold)."""


def job(name: str, devices: list[int]) -> Job:
    """The toy job ``name`` planned for ``devices`` on the cpu-local cluster."""
    return Job.from_dict({**JOBS[name], "cluster": "cpu-local", "devices": devices})


def spread(ids: list[str], k: int) -> list[str]:
    """At most ``k`` ids spread evenly along the list, both ends included."""
    if len(ids) <= k:
        return list(ids)
    picks = sorted({round(i * (len(ids) - 1) / (k - 1)) for i in range(k)})
    return [ids[i] for i in picks]


def frontier_runs(devices: int, per_model: int = 10) -> list[tuple[str, TrainSpec, dict]]:
    """(model, spec, plan.json dict) for the plans spread along each toy model's frontier."""
    out = []
    for name in JOBS:
        j = job(name, [devices])
        frontier_json = plan_job(j).to_json()
        spec = TrainSpec.from_job(j)
        ids = [p["id"] for f in frontier_json["frontiers"] for p in f["plans"]]
        for plan_id in spread(ids, per_model):
            out.append((name, spec, json.loads(plan_file_text(frontier_json, plan_id))))
    return out
