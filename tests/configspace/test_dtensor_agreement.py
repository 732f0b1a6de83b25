"""Configurations agree with DTensor: on 4 gloo ranks (a 2x2 mesh) every configuration of the ops
DTensor runs directly produces the output placement the configuration claims, and the values of the
single-process run. See dtensor_check.py (the worker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.distributed
@pytest.mark.slow
def test_configurations_agree_with_dtensor_on_a_2x2_mesh(tmp_path):
    out = tmp_path / "agreement.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parents[1])}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "4",
        str(HERE / "dtensor_check.py"),
        str(out),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["problems"] == []
    assert result["checked"] > 150  # linear, matmul, embedding, layer norm, softmax, elementwise...
