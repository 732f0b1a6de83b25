"""Plans for the parallel-loop tests: the example HF jobs at 2 devices, planned here."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from tensoropt.config import load_job
from tensoropt.planner import plan_job
from tensoropt.plans import plan_file_text

JOBS_DIR = Path(__file__).resolve().parents[2] / "configs" / "jobs"


def hf_job(model: str, batch: int, options: tuple[str, ...] = (), devices: int = 2):
    """configs/jobs/hf-<model>.yaml at ``devices`` devices with global batch ``batch`` and memory options."""
    job = load_job(JOBS_DIR / f"hf-{model}.yaml")
    training = dataclasses.replace(job.training, global_batch_size=batch, optimizer="adamw",
                                   memory_options=list(options))
    return dataclasses.replace(job, devices=[devices], training=training)


def one_device_plan(model: str, batch: int) -> dict:
    """The fastest 1-device plan.json of hf-<model>."""
    frontier = plan_job(hf_job(model, batch, devices=1)).to_json()
    return json.loads(plan_file_text(frontier, frontier["frontiers"][0]["plans"][0]["id"]))


def pick_plan(model: str, batch: int, kind: str) -> dict:
    """The lowest-memory 2-device plan.json that is ``kind``: ``model_parallel`` (splits something
    other than the batch, no memory option), ``zero1`` / ``zero2`` / ``zero3`` (at least one operator
    with that option) or ``batch`` (a pure batch split)."""
    options = (kind,) if kind.startswith("zero") else ()
    frontier = plan_job(hf_job(model, batch, options)).to_json()
    for p in sorted(frontier["frontiers"][0]["plans"], key=lambda p: p["memory_bytes"]):
        plan = json.loads(plan_file_text(frontier, p["id"]))
        labels = {c["label"] for c in plan["placements"].values()}
        if options and any(kind in label for label in labels):
            return plan
        if kind == "model_parallel" and any(not label.startswith(("batch", "replicate")) for label in labels):
            return plan
        if kind == "batch" and labels <= {"batch=2", "replicate"} and "batch=2" in labels:
            return plan
    raise AssertionError(f"no {kind} plan on the 2-device frontier of hf-{model}")


def model_config(model: str) -> tuple[dict, int, int]:
    """(the job's model kwargs, vocabulary size, sequence length)."""
    job = load_job(JOBS_DIR / f"hf-{model}.yaml")
    tokens = job.model.inputs["input_ids"]
    return dict(job.model.kwargs), int(tokens["high"]), int(tokens["shape"][0])


def model_parallel_plan(job) -> dict:
    """The lowest-memory plan.json of ``job``'s frontier that splits something other than the batch."""
    frontier = plan_job(job).to_json()
    for p in sorted(frontier["frontiers"][0]["plans"], key=lambda p: p["memory_bytes"]):
        plan = json.loads(plan_file_text(frontier, p["id"]))
        if any(not c["label"].startswith(("batch", "replicate")) for c in plan["placements"].values()):
            return plan
    raise AssertionError(f"no model-parallel plan on the frontier of {job.model.name or job.model.factory}")
