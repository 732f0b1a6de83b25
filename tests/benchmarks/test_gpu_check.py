"""benchmarks/gpu_check.py's CPU form (issue 28): the one-GPU script runs end to end on tiny models,
calibrates the device it finds, and records every way it trains next to the predictions; and the
measured device profile it writes is one the planner loads and prices with."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)
def test_gpu_check_tiny_runs_calibrates_and_records_plain_and_replayed_steps(tmp_path):
    out = tmp_path / "gc"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--tiny", "--out-dir", str(out),
         "--models", "gpt2-tiny", "--ways", "plain,replay", "--steps", "3", "--budget-s", "800"],
        cwd=ROOT, capture_output=True, text=True, timeout=880)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    doc = json.loads((out / "gpu_check.json").read_text())
    assert doc["errors"] == [], doc["errors"]
    assert doc["device"]["kind"] == "cpu" and doc["cluster"] == "cpu-local"
    row = doc["models"]["gpt2-tiny"]
    for way in ("plain", "replay"):
        assert row["ways"][way]["time_s"] > 0, row["ways"][way]
        assert row["ways"][way]["tokens_per_s"] == pytest.approx(4 * 32 / row["ways"][way]["time_s"])
    replay = row["ways"]["replay"]
    assert replay["predicted_peak_bytes"] > 0 and replay["peak_tensor_bytes"] > 0
    # the same plan priced three ways; the measured profile changes the roofline's figure
    predicted = row["predicted"]
    assert set(predicted) == {"roofline (datasheet)", "profiled", "roofline (measured profile)"}
    assert predicted["roofline (measured profile)"]["time_s"] != predicted["roofline (datasheet)"]["time_s"]
    assert predicted["roofline (datasheet)"]["time_s"] == pytest.approx(row["plan_time_s"], rel=1e-6)
    # the measured profile: loadable, cited, its constants measured (not the datasheet's assumptions)
    from estimators.profiles import load_device

    measured_file = out / "cpu-measured.yaml"
    device = load_device(str(measured_file))
    raw = yaml.safe_load(measured_file.read_text())
    assert device.name == "cpu-measured" and 0 < device.matmul_efficiency <= 1
    assert set(device.matmul_efficiency_by_dtype) == {"bfloat16", "float32"}
    for key in ("matmul_efficiency", "memory_efficiency", "kernel_launch_s"):
        assert "tensoropt calibrate --device" in raw["sources"][key]
    assert "gpt2-tiny" in proc.stdout and "x plain" in proc.stdout  # the printed table


def test_a_dtype_s_own_matmul_efficiency_prices_its_operators():
    import dataclasses

    from estimators.compute import LocalOp, roofline_time_s
    from estimators.profiles import Device, ProfileError, load_device

    base = load_device("h200-sxm-141gb")
    op = LocalOp("linear", "float32", 2 * 4096**3, ((4096, 4096),), ("float32",), ((4096, 4096),),
                 (4096, 4096), True, (True,))
    slow_fp32 = dataclasses.replace(base, matmul_efficiency_by_dtype={"float32": base.matmul_efficiency / 2})
    fwd, _ = roofline_time_s(base, op)
    fwd_slow, _ = roofline_time_s(slow_fp32, op)
    assert fwd_slow == pytest.approx(2 * fwd, rel=0.01)  # compute-bound: half the efficiency, twice the time
    bf16 = dataclasses.replace(op, dtype="bfloat16", in_dtypes=("bfloat16",))
    assert roofline_time_s(slow_fp32, bf16) == roofline_time_s(base, bf16)  # other dtypes unchanged
    data = {"name": "x", "kind": "gpu", "peak_tflops": {"float32": 1}, "memory_bandwidth_gbps": 1,
            "memory_bytes": 1, "matmul_efficiency_by_dtype": {"float32": 0.5},
            "sources": {"peak_tflops": "a", "memory_bandwidth_gbps": "b", "memory_bytes": "c"}}
    with pytest.raises(ProfileError, match="matmul_efficiency_by_dtype' has no citation"):
        Device.from_dict(data)
    data["sources"]["matmul_efficiency_by_dtype"] = "measured"
    data["matmul_efficiency_by_dtype"] = {"float32": 1.5}
    with pytest.raises(ProfileError, match="matmul_efficiency_by_dtype.float32' is a fraction"):
        Device.from_dict(data)
