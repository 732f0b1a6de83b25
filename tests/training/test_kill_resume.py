"""Issue 25's resume target with a real kill: a 60-step run of the trainer's loop on 2 processes
(a model-parallel plan, 2 planned micro-batches, AdamW, warmup + cosine, clipping) is killed
(SIGKILL of torchrun and its workers) at step 30, and resumed from its newest DCP checkpoint on 1
process: the losses and learning rates of every step, 1-30 from the killed run and 31-60 from the
resumed one, equal an uninterrupted run's within 1e-5. Also: fp16-mixed's dynamic loss scale is
part of what a resume restores (a kill and a resume against an uninterrupted run on 1 process).

The kill lands at a known step because the killed run holds after step 30's checkpoint
(``hold_after``, the loop's test hook) until the test kills its process group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tensoropt.config import Job
from tensoropt.planner import plan_job
from tensoropt.plans import plan_file_text

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainer_reference import reference  # noqa: E402

STEPS, KILL, MICRO, TOL = 60, 30, 2, 1e-5
ENV = {**os.environ, "TENSOROPT_COLLECTIVE_TIMEOUT_S": "60",
       "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def _job(tmp_path: Path, precision: str = "fp32", steps: int = STEPS) -> Job:
    return Job.from_dict({
        "model": {"name": "mlp", "kwargs": {"in_features": 16, "hidden": [32, 32], "num_classes": 8},
                  "task": "classification", "input_shape": [16], "num_classes": 8},
        "cluster": "cpu-local", "devices": [1, 2], "planner": {"epsilon": 0},
        "optimizer": {"name": "adamw", "lr": 1e-2, "weight_decay": 0.1, "no_decay": ["bias"]},
        "lr_scheduler": {"warmup_steps": 5, "decay": "cosine", "min_lr_ratio": 0.1},
        "metrics": {"log_every": 1, "jsonl": str(tmp_path / "metrics.jsonl")},
        "training": {"global_batch_size": 16, "steps": steps, "micro_batches": MICRO, "max_grad_norm": 0.5,
                     "seed": 0, "precision": precision}})


def _plans(job: Job) -> dict[int, dict]:
    """Device count -> plan.json content: at 2 devices a model-parallel plan (its parameters are
    sharded, so the resume reshards them), at 1 the only plan."""
    frontier = plan_job(job).to_json()
    plans = {}
    for f in frontier["frontiers"]:
        docs = [json.loads(plan_file_text(frontier, p["id"])) for p in f["plans"]]
        split = [d for d in docs if any(not c["label"].startswith(("batch", "replicate"))
                                        for c in d["placements"].values())]
        plans[f["devices"]] = (split or docs)[0]
    return plans


def _run_file(tmp_path: Path, name: str, job: Job, plan: dict, **options) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"job": job.to_dict(), "plan": plan, "out_dir": str(tmp_path),
                                "checkpoint_dir": str(tmp_path / "ck"), **options}))
    return path


def _command(nproc: int, run: Path) -> list[str]:
    if nproc == 1:  # one process needs no torchrun
        return [sys.executable, "-m", "tensoropt.training.loop", str(run)]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "-m", "tensoropt.training.loop", str(run)]


def _run_killed_at(tmp_path: Path, nproc: int, run: Path, step: int) -> None:
    """Start the run, wait until it holds after ``step``'s checkpoint, SIGKILL its process group."""
    done = tmp_path / "ck" / f"step-{step}" / "trainer.json"
    log = (tmp_path / "killed.log").open("w")
    proc = subprocess.Popen(_command(nproc, run), env=ENV, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not done.is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        text = (tmp_path / "killed.log").read_text()
        assert done.is_file(), f"no checkpoint at step {step}: {text[-3000:]}"
        assert proc.poll() is None, "the run ended before it was killed"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and every worker, mid-run
        proc.wait(30)
        log.close()
    assert proc.returncode == -signal.SIGKILL


def _run(nproc: int, run: Path) -> None:
    proc = subprocess.run(_command(nproc, run), env=ENV, timeout=240, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_killed_at_30_of_60_on_2_processes_resumed_on_1_continues_exactly(tmp_path):
    job = _job(tmp_path)
    plans = _plans(job)
    assert plans[2]["micro_batches"] == plans[1]["micro_batches"] == MICRO
    _run_killed_at(tmp_path, 2, _run_file(tmp_path, "first", job, plans[2], checkpoint_every=10,
                                          hold_after=KILL), KILL)
    killed = _rows(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in killed] == list(range(1, KILL + 1))
    _run(1, _run_file(tmp_path, "rest", job, plans[1], checkpoint_every=10))
    rows = _rows(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # resumed at 30: no step run twice
    want = reference(job, MICRO, STEPS)
    for got, w in zip(rows, want, strict=True):
        for key in ("loss", "lr", "grad_norm"):
            assert got[key] == pytest.approx(w[key], abs=TOL, rel=TOL), (got["step"], key, got[key], w[key])
    assert len({round(r["lr"], 12) for r in rows[KILL:]}) == STEPS - KILL  # the schedule moves after the kill
    assert any(r["grad_norm"] > 0.5 for r in rows[KILL:])  # and the clipping clips


def test_the_loss_scale_is_restored_by_a_resume(tmp_path):
    """fp16-mixed on 1 process: killed after step 4 of 8 and resumed, against an uninterrupted run:
    the same losses, and the same loss scaler state at the end (its finite-step count included,
    which a resume without the scaler's state would restart from 0)."""
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    whole.mkdir(), parts.mkdir()
    plan = _plans(_job(whole, "fp16-mixed", 8))[1]
    _run(1, _run_file(whole, "whole", _job(whole, "fp16-mixed", 8), plan))
    job = _job(parts, "fp16-mixed", 8)
    _run_killed_at(parts, 1, _run_file(parts, "first", job, plan, checkpoint_every=2, hold_after=4), 4)
    saved = json.loads((parts / "ck" / "step-4" / "trainer.json").read_text())["loss_scale"]
    assert saved is not None and saved["good_steps"] + saved["skipped"] >= 1, saved
    _run(1, _run_file(parts, "rest", job, plan))
    end = {d.name: json.loads((d / "ck" / "step-8" / "trainer.json").read_text()) for d in (whole, parts)}
    assert end["parts"]["loss_scale"] == end["whole"]["loss_scale"]
    got, want = _rows(parts / "metrics.jsonl"), _rows(whole / "metrics.jsonl")
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(1, 9))
    for g, w in zip(got, want):
        assert g["loss"] == pytest.approx(w["loss"], rel=1e-6, abs=1e-6), g["step"]
