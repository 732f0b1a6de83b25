"""The CPU all-gather rewrite (``tensoropt.executor.ops.gloo_gathers``) on 2 gloo processes.

70 all-gathers in flight at once, 100 times, every output checked: the rewritten program neither
aborts nor gathers a wrong value (torch's functional all-gather aborted one launch in two at this
depth: ``gloo_gathers_worker.py functional 70 100`` reproduces it). A shallow functional program
gives the same values, so the rewrite is the op it replaces.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parallel"))
from torchrun import torchrun  # noqa: E402

WORKER = Path(__file__).resolve().parent / "gloo_gathers_worker.py"
pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]


@pytest.mark.parametrize(("mode", "in_flight", "iterations"), [("plain", 70, 100), ("functional", 4, 5)])
def test_all_gathers_in_flight_give_every_rank_every_shard(mode, in_flight, iterations):
    proc = torchrun(WORKER, [mode, str(in_flight), str(iterations)], timeout_s=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"ok {mode} {in_flight}x{iterations}" in proc.stdout
