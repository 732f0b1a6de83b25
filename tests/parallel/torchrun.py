"""Run a script of the parallel-loop tests under torchrun: 2 gloo processes, a free port, timeouts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def torchrun(script: Path, args: list[str], timeout_s: float = 600,
             nproc: int = 2) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node nproc script *args`` (collectives time out after 60 s)."""
    env = {**os.environ, "TENSOROPT_COLLECTIVE_TIMEOUT_S": "60",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               str(script), *args]
    return subprocess.run(command, env=env, timeout=timeout_s, capture_output=True, text=True, cwd=ROOT)
