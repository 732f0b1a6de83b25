"""Only shards in memory, measured where memory is spent (issue 16 items 3 and 4).

* A model-parallel plan of a 25M-parameter MLP (AdamW) at 2 processes must peak, per process,
  at most 0.6 x the 1-process run's ``measured.peak_bytes`` (resident-set high-water mark of
  the training loop above the level before the model was built): a full copy of the model on a
  rank (400 MB of parameters, gradients and AdamW moments) would show.
* A job with ``model.checkpoint`` starts every rank from the file's values, tensor-parallel
  shards included, and the 1-process reference from the same values.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from hand_plans import all_plans
from launch_helpers import outputs, run_plans

from tensoropt.config import Job
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.planner import plan_job
from tensoropt.plans import plan_file_text
from tensoropt.training.trainer import Trainer

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

BIG_MLP = {"model": {"name": "mlp", "input_shape": [1024], "num_classes": 1024,
                     "kwargs": {"in_features": 1024, "hidden": [4096, 4096], "num_classes": 1024}},
           "training": {"global_batch_size": 16, "optimizer": "adamw", "learning_rate": 0.001, "steps": 2},
           "cluster": "cpu-local", "devices": [1, 2]}
"""25.2M parameters: 101 MB of float32 parameters, 404 MB with gradients and AdamW's moments."""
PARAMS = 1024 * 4096 + 4096 + 4096 * 4096 + 4096 + 4096 * 1024 + 1024

TOY_MLP = {"model": {"factory": "toy_models:MLP", "task": "classification", "input_shape": [8],
                     "num_classes": 4},
           "training": {"global_batch_size": 8, "optimizer": "sgd", "learning_rate": 0.1, "steps": 1},
           "cluster": "cpu-local", "devices": [2]}


def _plan(frontier_json: dict, plan_id: str) -> dict:
    return json.loads(plan_file_text(frontier_json, plan_id))


@pytest.fixture(scope="module")
def big_mlp_runs(tmp_path_factory):
    """(1-process metrics, the leanest 2-process plan's metrics) of the big MLP, 2 steps each."""
    job = Job.from_dict(BIG_MLP)
    frontier_json = plan_job(job).to_json()
    by_devices = {f["devices"]: f["plans"] for f in frontier_json["frontiers"]}
    single = by_devices[1][0]["id"]
    leanest = min(by_devices[2], key=lambda p: p["memory_bytes"])["id"]
    spec = TrainSpec.from_job(job)
    out = tmp_path_factory.mktemp("peak")
    rc1, _ = run_plans([("big", spec, _plan(frontier_json, single))], 1, out, steps=2)
    rc2, _ = run_plans([("big", spec, _plan(frontier_json, leanest))], 2, out, steps=2)
    assert rc1 == 0 and rc2 == 0, f"launch failed: 1 process exit {rc1}, 2 processes exit {rc2}"
    return outputs(out, "big", single)[0], outputs(out, "big", leanest)[0]


def test_model_parallel_peak_is_below_the_single_process_run(big_mlp_runs):
    one, two = big_mlp_runs
    state_bytes = 4 * PARAMS * 4  # parameters, gradients, AdamW's two moments
    # the 1-process peak sees the whole training state: it can see a full copy
    assert one["measured"]["peak_bytes"] >= 0.95 * state_bytes, one["measured"]
    ratio = two["measured"]["peak_bytes"] / one["measured"]["peak_bytes"]
    assert ratio <= 0.6, (f"2-process peak {two['measured']} is {ratio:.2f} x the 1-process run's "
                          f"{one['measured']}")


def test_the_tensor_peak_is_predicted_within_2_percent_at_1_and_2_processes(big_mlp_runs):
    """measured.peak_tensor_bytes (live tensor bytes, no allocator in it: issue 29 item 5) against the
    memory model without its runtime terms, under glibc's default settings."""
    for metrics in big_mlp_runs:
        measured = metrics["measured"]["peak_tensor_bytes"]
        predicted = metrics["predicted"]["peak_tensor_bytes"]
        assert abs(measured - predicted) <= 0.02 * predicted, (metrics["plan_id"], measured, predicted)
    one, two = (m["measured"]["peak_tensor_bytes"] for m in big_mlp_runs)
    assert two <= 0.6 * one  # the leanest 2-process plan holds its shards only


TRIMMED_MALLOC = {"MALLOC_ARENA_MAX": "1", "MALLOC_TRIM_THRESHOLD_": "0"}
"""glibc returns freed memory at once: the resident set then follows the live bytes the model prices."""


def test_predicted_peak_is_within_5_percent_of_the_measured_one(tmp_path):
    """big-fc's leanest 2-process plan, glibc trimming (docs/results.md: with its defaults the
    peak also holds freed memory glibc keeps). Before the trace dropped its gradients and the
    baseline was read with the model's code loaded, the error was -11 %."""
    job = Job.from_dict(BIG_MLP)
    frontier_json = plan_job(job).to_json()
    plans = next(f["plans"] for f in frontier_json["frontiers"] if f["devices"] == 2)
    leanest = min(plans, key=lambda p: p["memory_bytes"])["id"]
    rc, _ = run_plans([("big", TrainSpec.from_job(job), _plan(frontier_json, leanest))], 2, tmp_path,
                      steps=3, env=TRIMMED_MALLOC)
    assert rc == 0
    metrics = outputs(tmp_path, "big", leanest)[0]
    peak, predicted = metrics["measured"]["peak_bytes"], metrics["predicted"]["peak_bytes"]
    assert abs(predicted - peak) <= 0.05 * peak, (predicted, peak, (predicted - peak) / peak)


def test_checkpoint_job_starts_from_the_file(tmp_path):
    values = {"fc1.weight": torch.randn(16, 8), "fc1.bias": torch.randn(16),
              "fc2.weight": torch.randn(4, 16), "fc2.bias": torch.randn(4)}
    path = tmp_path / "weights.pt"
    torch.save(values, path)
    job = json.loads(json.dumps(TOY_MLP))
    job["model"]["checkpoint"] = str(path)
    spec = TrainSpec.from_job(Job.from_dict(job))
    tensor_parallel = next(p for name, p in all_plans(2) if name == "mlp" and p["id"] == "mlp-tp")
    rc, _ = run_plans([("ckpt", spec, tensor_parallel)], 2, tmp_path, steps=0)
    assert rc == 0
    _, params = outputs(tmp_path, "ckpt", "mlp-tp")
    reference = Trainer(spec, _single_plan()).full_params()
    for key, value in values.items():
        torch.testing.assert_close(params[key], value, rtol=0, atol=0)
        torch.testing.assert_close(reference[key], value, rtol=0, atol=0)


def _single_plan():
    from tensoropt.executor.job.plan import ExecPlan

    return ExecPlan.from_json({"id": "single", "mesh": {"shape": [], "levels": []}, "placements": {}})


def test_calibrate_memory_measures_the_runtime_constants():
    from estimators.profiles import Device
    from tensoropt.commands.calibrate import runtime_memory

    constants, why = runtime_memory(steps=2)
    overhead, per_node = constants["runtime_overhead_bytes"], constants["bytes_per_program_node"]
    # a worker's own memory: more than nothing, far less than this test's big MLP state
    assert 1 << 20 < overhead < 400 << 20, constants
    # the Python objects of one traced node: kilobytes (not bytes, not megabytes)
    assert 1 << 10 <= per_node <= 100 << 10, constants
    assert "tensoropt calibrate --memory" in why
    sources = {"peak_tflops": "a", "memory_bandwidth_gbps": "b", "memory_bytes": "c",
               "runtime_overhead_bytes": why, "bytes_per_program_node": why}
    device = Device.from_dict({"name": "x", "kind": "cpu", "peak_tflops": {"float32": 1}, "memory_bytes": 1,
                               "memory_bandwidth_gbps": 1, "runtime_overhead_bytes": overhead,
                               "bytes_per_program_node": per_node, "sources": sources})
    assert (device.runtime_overhead_bytes, device.bytes_per_program_node) == (overhead, per_node)


def test_tiny_hf_llama_predicted_peak_is_near_its_measured_peak(tmp_path):
    """The tiny HF Llama holds 4.4 MiB of tensors and peaks near 21 MiB: the runtime's own memory
    (the kernels' code, the traced program's Python objects) is most of it. With the per-node term
    (cpu.yaml's bytes_per_program_node, calibrated on another model) the prediction is within a few
    percent at 1 process (docs/results.md); without it (2.9 MiB for its 596 traced nodes) it is 10-23 %
    below, and with the trace's per-node fake modes back (tensoropt/executor/program/lowering.py:
    shared_fake_mode) the peak grows by ~7 MiB, 25-40 % above the prediction."""
    pytest.importorskip("transformers", reason="the HuggingFace tests need the dev extra (transformers 5.x)")
    import yaml

    root = Path(__file__).resolve().parents[2]
    body = yaml.safe_load((root / "configs/jobs/hf-llama.yaml").read_text())
    job = Job.from_dict({"model": body["model"], "training": body["training"], "cluster": "cpu-local",
                         "devices": [1]})
    frontier_json = plan_job(job).to_json()
    plan_id = frontier_json["frontiers"][0]["plans"][0]["id"]
    rc, _ = run_plans([("llama", TrainSpec.from_job(job), _plan(frontier_json, plan_id))], 1, tmp_path,
                      steps=3, env=TRIMMED_MALLOC)
    assert rc == 0
    metrics = outputs(tmp_path, "llama", plan_id)[0]
    peak, predicted = metrics["measured"]["peak_bytes"], metrics["predicted"]["peak_bytes"]
    assert metrics["executor"]["traced_nodes"] > 100, metrics["executor"]
    # the peak of this 21 MiB process moved between 19.0 and 22.1 MiB over five runs of unchanged code
    # (2026-11-27, benchmarks/memory_peak.py): 12 % holds that spread and still fails without the term
    assert abs(predicted - peak) <= 0.12 * peak, (predicted, peak, (predicted - peak) / peak)


def test_the_peak_allocator_setting_reaches_the_workers_and_is_opt_in(tmp_path):
    """``TENSOROPT_WORKER_MALLOC=peak`` gives every worker tensoropt.launch.WORKER_MALLOC (what a
    user sets stays); without it the workers keep glibc's defaults (benchmarks/allocator.py:
    the setting costs gpt 3-8 % CPU per step)."""
    from launch_helpers import HERE

    from tensoropt.launch import WORKER_MALLOC, LaunchOptions, launch_module

    seen = {}
    for name, env in (("peak", {"TENSOROPT_WORKER_MALLOC": "peak"}),
                      ("mine", {"TENSOROPT_WORKER_MALLOC": "peak", "MALLOC_TOP_PAD_": "4096"}),
                      ("glibc", {"TENSOROPT_WORKER_MALLOC": "glibc"})):
        out = tmp_path / name
        out.mkdir()
        rc = launch_module("launch_probe", [str(out)], LaunchOptions(1, timeout_s=240),
                           env={"PYTHONPATH": str(HERE), **env})
        assert rc == 0
        seen[name] = json.loads((out / "rank0.json").read_text())["malloc"]
    assert seen["peak"] == WORKER_MALLOC
    assert seen["mine"] == {**WORKER_MALLOC, "MALLOC_TOP_PAD_": "4096"}
    assert seen["glibc"] == {k: os.environ.get(k) for k in WORKER_MALLOC}  # this process's, untouched
