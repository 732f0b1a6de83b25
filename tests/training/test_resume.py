"""Issue 25's resume target: a run stopped after step 4 of 8 on 2 processes (model-parallel HF
Llama plan, 4 micro-batches, warmup + cosine, clipping) and resumed from its DCP checkpoint on 1
process continues exactly: losses and learning rates of every step equal an uninterrupted run's
within 1e-5."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the HuggingFace tests need the dev extra (transformers 5.x)")
pytestmark = [pytest.mark.distributed, pytest.mark.timeout(1500)]

from test_loop_parity import MICRO, TOL, _job  # noqa: E402
from trainer_reference import reference  # noqa: E402

from tensoropt.planner import plan_job  # noqa: E402
from tensoropt.plans import plan_file_text  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
STEPS, STOP = 8, 4


def _launch(tmp_path: Path, name: str, nproc: int, run: dict) -> list[dict]:
    path = tmp_path / f"{name}.json"
    run = {**run, "records": str(tmp_path / f"{name}-records.json")}
    path.write_text(json.dumps(run))
    env = {**os.environ, "TENSOROPT_COLLECTIVE_TIMEOUT_S": "60",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               "-m", "tensoropt.training.loop", str(path)]
    proc = subprocess.run(command, env=env, timeout=600, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(Path(run["records"]).read_text())


def test_killed_at_4_of_8_on_2_processes_resumed_on_1_continues_exactly(tmp_path):
    job = _job(tmp_path)
    job.devices = [1, 2]
    job.training.steps = STEPS
    frontier = plan_job(job).to_json()
    plans = {f["devices"]: f["plans"] for f in frontier["frontiers"]}
    two = next(json.loads(plan_file_text(frontier, p["id"])) for p in plans[2]
               if any(not c["label"].startswith(("batch", "replicate"))
                      for c in json.loads(plan_file_text(frontier, p["id"]))["placements"].values()))
    one = json.loads(plan_file_text(frontier, plans[1][0]["id"]))
    assert two["micro_batches"] == one["micro_batches"] == MICRO
    common = {"job": job.to_dict(), "out_dir": str(tmp_path), "checkpoint_dir": str(tmp_path / "ck")}
    first = _launch(tmp_path, "first", 2, {**common, "plan": two, "stop_after": STOP})
    assert [r["step"] for r in first] == list(range(1, STOP + 1))
    assert (tmp_path / "ck" / f"step-{STOP}" / "trainer.json").is_file()
    rest = _launch(tmp_path, "rest", 1, {**common, "plan": one})
    assert [r["step"] for r in rest] == list(range(STOP + 1, STEPS + 1))
    want = reference(job, MICRO, STEPS)
    for g, w in zip(first + rest, want, strict=True):
        for key in ("loss", "lr", "grad_norm"):
            assert g[key] == pytest.approx(w[key], abs=TOL, rel=TOL), (g["step"], key)


def test_resumed_without_a_fixed_plan_takes_each_device_counts_plan(tmp_path, capfd):
    """``tensoropt run`` with trainer keys and ``--checkpoint-dir`` but no ``--plan`` (what ``--elastic``
    does at each restart): every start selects the plan of its device count from frontier.json and
    resumes the loop exactly."""
    import yaml

    from tensoropt import cli

    job = _job(tmp_path)
    job.devices = [1, 2]
    job.training.steps = STEPS
    frontier = tmp_path / "frontier.json"
    frontier.write_text(json.dumps(plan_job(job).to_json()))
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job.to_dict()))
    common = {"job": job.to_dict(), "out_dir": str(tmp_path), "checkpoint_dir": str(tmp_path / "ck"),
              "plan": None, "select": {"frontier": str(frontier), "job": job.to_dict()}}
    first = _launch(tmp_path, "first", 2, {**common, "stop_after": STOP})
    assert [r["step"] for r in first] == list(range(1, STOP + 1))
    rc = cli.main(["run", str(path), "--frontier", str(frontier), "--checkpoint-dir", str(tmp_path / "ck"),
                   "--nproc", "1", "--timeout-s", "600"])
    out = capfd.readouterr()  # the workers' lines: written by other processes
    assert rc == 0, out.err[-3000:]
    assert "elastic: world size 1: plan d1-" in out.out, out.out  # selected for this start's count
    assert f"resumed from {tmp_path / 'ck' / f'step-{STOP}'} at step {STOP} on 1 process" in out.out
    rows = {r["step"]: r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())}
    rest = [rows[s] for s in range(STOP + 1, STEPS + 1)]
    want = reference(job, MICRO, STEPS)
    for g, w in zip(first + rest, want, strict=True):
        for key in ("loss", "lr", "grad_norm"):
            assert g[key] == pytest.approx(w[key], abs=TOL, rel=TOL), (g["step"], key)
