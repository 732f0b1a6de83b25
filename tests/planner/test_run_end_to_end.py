"""The README's main path for real: `tensoropt plan`, then `tensoropt run JOB --plan plan.json
--nproc 2 --metrics FILE` as subprocesses (torchrun, gloo), no mocks; `--dataset`; `format_metrics`.

About 2-3 minutes on a loaded 2-core machine: three torchrun launches of cpu-demo's small MLP."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from run_dataset import LOG_DIR_ENV

from tensoropt import cli
from tensoropt.commands.run import format_metrics

HERE = Path(__file__).resolve().parent
DEMO_JOB = HERE.parents[1] / "configs" / "jobs" / "cpu-demo.yaml"
DEMO_STEPS = 5  # cpu-demo.yaml's training.steps
ENV = {"PYTHONPATH": str(HERE), "TENSOROPT_COLLECTIVE_TIMEOUT_S": "120"}


def _tensoropt(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`tensoropt ARGV...` in a fresh interpreter; fails the test with its output if it fails."""
    done = subprocess.run([sys.executable, "-m", "tensoropt.cli", *argv], capture_output=True, text=True,
                          timeout=500, env={**os.environ, **ENV, **(env or {})})
    assert done.returncode == 0, \
        f"tensoropt {' '.join(argv)} -> {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def demo_out(tmp_path_factory) -> Path:
    """`tensoropt plan configs/jobs/cpu-demo.yaml --out DIR` (its plan.json is for 2 processes)."""
    out = tmp_path_factory.mktemp("cpu-demo")
    _tensoropt("plan", str(DEMO_JOB), "--out", str(out), "--quiet")
    return out


def _losses(metrics: dict) -> list[float]:
    return [s["loss"] for s in metrics["steps"]]


@pytest.mark.distributed
def test_run_on_2_processes_matches_1_process_and_halves_memory(demo_out):
    plan = json.loads((demo_out / "plan.json").read_text())
    assert plan["devices"] == 2
    metrics_2 = demo_out / "metrics-2.json"
    done = _tensoropt("run", str(DEMO_JOB), "--plan", str(demo_out / "plan.json"), "--nproc", "2",
                      "--metrics", str(metrics_2))
    m2 = json.loads(metrics_2.read_text())
    assert m2["plan_id"] == plan["id"] and m2["devices"] == 2
    assert [s["step"] for s in m2["steps"]] == list(range(DEMO_STEPS))
    assert all(math.isfinite(x) for x in _losses(m2))
    assert all(s["time_s"] > 0 for s in m2["steps"])
    assert m2["predicted"]["time_s"] == pytest.approx(plan["time_s"])
    assert m2["predicted"]["memory_bytes"] == pytest.approx(plan["memory_bytes"])
    assert m2["measured"]["time_s"] > 0 and m2["measured"]["memory_bytes"] > 0
    assert format_metrics(m2) in done.stdout, "run prints the predicted against the measured figures"

    # the same job on 1 process (its plan is over the job's budget, so select it with a larger one)
    plan_1 = demo_out / "plan-1.json"
    assert cli.main(["select", str(demo_out / "frontier.json"), "--devices", "1", "--memory-budget", "1GiB",
                     "-o", str(plan_1)]) == 0
    metrics_1 = demo_out / "metrics-1.json"
    _tensoropt("run", str(DEMO_JOB), "--plan", str(plan_1), "--nproc", "1", "--metrics", str(metrics_1))
    m1 = json.loads(metrics_1.read_text())
    assert m1["devices"] == 1
    # the same global batches and initial weights: the split plan trains the same model
    assert _losses(m2) == pytest.approx(_losses(m1), rel=1e-4)
    # the 2-process plan splits the training state (the job's budget is below the 1-process need)
    assert m2["measured"]["memory_bytes"] < 0.75 * m1["measured"]["memory_bytes"]


@pytest.mark.distributed
def test_run_feeds_the_dataset_factory(demo_out, tmp_path):
    """`--dataset module:function` is called by the workers as f(step, global_batch_size, seed)."""
    metrics_path = tmp_path / "metrics.json"
    log_dir = tmp_path / "calls"
    log_dir.mkdir()
    steps = 4
    _tensoropt("run", str(DEMO_JOB), "--plan", str(demo_out / "plan.json"), "--nproc", "2",
               "--steps", str(steps), "--dataset", "run_dataset:fixed_batch", "--metrics", str(metrics_path),
               env={LOG_DIR_ENV: str(log_dir)})
    calls = [tuple(int(v) for v in p.name.split("-")) for p in log_dir.iterdir()]
    assert {(step, batch, seed) for _, step, batch, seed in calls} >= {(s, 32, 0) for s in range(steps)}
    assert len({pid for pid, step, *_ in calls if step == steps - 1}) == 2, "each rank reads the global batch"
    losses = _losses(json.loads(metrics_path.read_text()))
    assert len(losses) == steps
    # one fixed batch, plain SGD at a small learning rate: the loss falls at every step
    assert all(b < a for a, b in zip(losses, losses[1:])), losses


def test_format_metrics_by_hand():
    metrics = {"plan_id": "d4-p1", "devices": 4, "steps": [],
               "predicted": {"time_s": 0.020, "memory_bytes": 3 * 2**20},
               "measured": {"time_s": 0.015, "memory_bytes": 1.5 * 2**20}}
    assert format_metrics(metrics).splitlines() == [
        "plan d4-p1 on 4 devices: step time predicted 20.0 ms, measured 15.0 ms (-25%)",
        "memory per device predicted 3.00 MiB, measured 1.50 MiB (-50%)",
    ]


def test_format_metrics_without_predictions():
    """A plan file without the planner's figures: measured only, no percentage."""
    metrics = {"plan_id": "hand", "devices": 2, "steps": [], "predicted": {},
               "measured": {"time_s": 0.0042, "memory_bytes": 2**21}}
    assert format_metrics(metrics).splitlines() == [
        "plan hand on 2 devices: step time predicted n/a, measured 4.2 ms",
        "memory per device predicted n/a, measured 2.00 MiB",
    ]


def test_format_metrics_prints_the_measured_peak_beside_its_prediction():
    """The process's real peak (RSS high-water mark on CPU, allocator peak on CUDA), not only ours."""
    metrics = {"plan_id": "d2-p0", "devices": 2, "steps": [],
               "predicted": {"time_s": 0.01, "memory_bytes": 2**20, "peak_bytes": 8 * 2**20},
               "measured": {"time_s": 0.01, "memory_bytes": 2**20, "peak_bytes": 6 * 2**20}}
    peak_line = format_metrics(metrics).splitlines()[2]
    assert peak_line == "peak per process predicted 8.00 MiB, measured 6.00 MiB (-25%)"
    del metrics["predicted"]["peak_bytes"]
    assert format_metrics(metrics).splitlines()[2] == "peak per process predicted n/a, measured 6.00 MiB"


@pytest.mark.distributed
def test_launch_run_hands_the_workers_their_run_json_and_reports_a_failure(tmp_path, capsys):
    """`launch_run` (every `tensoropt run` launch: the measuring worker, the trainer's loop, the
    pipelined runtime): the run config reaches each worker as a RUN.json path; a failing worker
    gives its exit code and one line on stderr."""
    import argparse

    from tensoropt.commands.run import launch_run

    script = tmp_path / "probe_worker.py"
    script.write_text("import json, os, sys\n"
                      "config = json.loads(open(sys.argv[1]).read())\n"
                      "rank = os.environ['RANK']\n"
                      "open(os.path.join(config['out'], f'rank{rank}.json'), 'w').write(json.dumps(config))\n"
                      "sys.exit(config['exit'])\n")
    args = argparse.Namespace(nproc_per_node=None, elastic=False, nnodes="1", node_rank=None,
                              rdzv_endpoint=None, timeout_s=240)

    class Spec:
        def to_json(self) -> dict:
            return {"model": "probe"}

    config = {"out": str(tmp_path), "exit": 0, "runs": [{"steps": 3}]}
    assert launch_run(str(script), config, args, 2, Spec()) == 0
    assert [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)] == [config, config]
    assert "workers failed" not in capsys.readouterr().err
    assert launch_run(str(script), {**config, "exit": 3}, args, 2, Spec()) != 0
    err = capsys.readouterr().err
    assert "tensoropt run: the workers failed (exit code" in err, err
