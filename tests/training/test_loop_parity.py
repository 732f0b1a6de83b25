"""Issue 25's schedule-and-clipping targets: the trainer's loop (tensoropt.training.loop over
tensoropt.parallelize), on 2 processes with a model-parallel plan of HF Llama, AdamW with no_decay
groups, warmup + cosine, clipping that really clips and 4 planned micro-batches, logs every step's
loss, learning rate and gradient norm equal to the plain 1-process loop's within 1e-5, the rate
equal to the schedule's formula, and metrics.jsonl with exactly the contract's keys."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the HuggingFace tests need the dev extra (transformers 5.x)")
pytestmark = [pytest.mark.distributed, pytest.mark.timeout(1200)]

from trainer_reference import reference  # noqa: E402

from tensoropt.config import Job, load_job  # noqa: E402
from tensoropt.planner import plan_job  # noqa: E402
from tensoropt.plans import plan_file_text  # noqa: E402
from tensoropt.training.metrics import METRIC_KEYS  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
STEPS, MICRO, TOL = 6, 4, 1e-5


def _job(tmp_path: Path) -> Job:
    data = load_job(REPO / "configs" / "jobs" / "hf-llama.yaml").to_dict()
    data.update(devices=[2],
                optimizer={"name": "adamw", "lr": 3e-3, "weight_decay": 0.1, "no_decay": ["norm"]},
                lr_scheduler={"warmup_steps": 2, "decay": "cosine", "min_lr_ratio": 0.1},
                metrics={"log_every": 1, "jsonl": str(tmp_path / "metrics.jsonl")})
    data["training"] = {**data["training"], "global_batch_size": 8, "steps": STEPS, "micro_batches": MICRO,
                        "max_grad_norm": 0.5, "optimizer": "adamw", "learning_rate": 3e-3}
    return Job.from_dict(data)


def _model_parallel_plan(job: Job) -> dict:
    frontier = plan_job(job).to_json()
    for p in sorted(frontier["frontiers"][0]["plans"], key=lambda p: p["memory_bytes"]):
        plan = json.loads(plan_file_text(frontier, p["id"]))
        if any(not c["label"].startswith(("batch", "replicate")) for c in plan["placements"].values()):
            return plan
    raise AssertionError("no model-parallel plan on the 2-device frontier")


def test_two_process_llama_loop_equals_the_one_process_loop(tmp_path):
    job = _job(tmp_path)
    plan = _model_parallel_plan(job)
    assert plan["micro_batches"] == MICRO
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"job": job.to_dict(), "plan": plan, "out_dir": str(tmp_path),
                               "records": str(tmp_path / "records.json")}))
    env = {**os.environ, "TENSOROPT_COLLECTIVE_TIMEOUT_S": "60",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "tensoropt.training.loop", str(run)]
    proc = subprocess.run(command, env=env, timeout=600, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads((tmp_path / "records.json").read_text())
    want = reference(job, MICRO, STEPS)
    for g, w in zip(got, want, strict=True):
        for key in ("loss", "lr", "grad_norm"):
            assert g[key] == pytest.approx(w[key], abs=TOL, rel=TOL), (g["step"], key)
    assert max(w["grad_norm"] for w in want) > 0.5  # the clipping really clips
    for g in got:  # the rate each update used is the schedule's formula
        s, decay_steps = g["step"] - 1, STEPS - 2
        f = (s + 1) / 3 if s < 2 else 0.1 + 0.9 * (1 + math.cos(math.pi * min(1, (s - 2) / decay_steps))) / 2
        assert g["lr"] == pytest.approx(3e-3 * f, rel=1e-12)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [list(r) for r in rows] == [list(METRIC_KEYS)] * STEPS
    assert all(r["tokens_per_s"] == pytest.approx(r["samples_per_s"] * 32) for r in rows)
