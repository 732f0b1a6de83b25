"""Shared pieces of the elastic tests: a planned MLP job, reference runs, torchrun agents.

Everything multi-process runs on loopback with free ports, under timeouts, and every agent's
process group is killed in ``finally`` (the ``agents`` fixture), so a failing test never hangs
or leaves workers behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import warnings
from pathlib import Path

import pytest
import torch

from tensoropt.checkpoint import CheckpointWarning, latest_checkpoint
from tensoropt.executor.data import InputSpec
from tensoropt.executor.plan import ExecPlan
from tensoropt.executor.spec import TrainSpec
from tensoropt.launch import LaunchOptions, torchrun_command

MODEL_KWARGS = {"in_features": 64, "hidden": [256, 256], "num_classes": 16}
BATCH = 1024  # large enough that the planner prefers sharded plans at 2 and 4 devices on cpu-local
TOTAL_STEPS = 8


def mlp_spec(lr: float = 0.05) -> TrainSpec:
    """The training run: the zoo MLP (through its class), SGD, synthetic data per step."""
    return TrainSpec("tensoropt.models.mlp:MLP", (InputSpec((64,)), InputSpec((), "int64", 16)), BATCH,
                     dict(MODEL_KWARGS), optimizer="sgd", lr=lr, seed=0, steps=TOTAL_STEPS)


def mlp_job(devices: list[int]) -> dict:
    """The planner job of the same model and training (Job.to_dict() form)."""
    from tensoropt.config import Job

    return Job(model={"name": "mlp", "kwargs": dict(MODEL_KWARGS), "task": "classification",
                      "input_shape": [64], "num_classes": 16},
               cluster="cpu-local", devices=devices, memory_budget="16MiB", select="fastest",
               training={"global_batch_size": BATCH, "optimizer": "sgd", "learning_rate": 0.05,
                         "seed": 0, "steps": TOTAL_STEPS}).to_dict()


@pytest.fixture(scope="session")
def frontier_file(tmp_path_factory) -> Path:
    """frontier.json of the MLP job planned for 1 and 2 devices (4 is planned on the spot)."""
    from tensoropt.config import Job
    from tensoropt.planner import plan_job

    path = tmp_path_factory.mktemp("plan") / "frontier.json"
    plan_job(Job.from_dict(mlp_job([1, 2]))).write(path)
    return path


@pytest.fixture(scope="session")
def reference_params() -> dict[str, torch.Tensor]:
    """Final parameters of an uninterrupted 1-process run of TOTAL_STEPS steps (in this process)."""
    from tensoropt.executor.trainer import Trainer

    plan = ExecPlan.from_json({"id": "reference", "mesh": {"shape": [], "levels": []}, "placements": {}})
    trainer = Trainer(mlp_spec(), plan)
    trainer.train(TOTAL_STEPS)
    return trainer.full_params()


def assert_params_close(got: dict, want: dict, rtol: float = 1e-5) -> None:
    """Every parameter within ``rtol`` relative (to the largest magnitude of the reference)."""
    assert sorted(got) == sorted(want)
    for key in want:
        scale = float(want[key].abs().max()) or 1.0
        err = float((got[key] - want[key]).abs().max()) / scale
        assert err <= rtol, f"{key}: relative error {err:.2e} > {rtol}"


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_config(tmp: Path, ckpt: Path, frontier: Path, steps: int, every: int, name: str = "run") -> Path:
    """Write a worker RUN.json: select per world size from ``frontier``, checkpoint to ``ckpt``."""
    config = {"spec": mlp_spec().to_json(), "steps": steps,
              "runs": [{"select": {"frontier": str(frontier), "job": None},
                        "checkpoint": {"dir": str(ckpt), "every": every, "keep": 3},
                        "metrics": str(tmp / f"{name}-metrics.json"),
                        "params_out": str(tmp / f"{name}-params.pt")}]}
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(config))
    return path


class Agents:
    """torchrun processes started by a test, each in its own process group, with logs."""

    def __init__(self, tmp: Path):
        self.tmp, self.procs, self.logs = tmp, {}, {}

    def start(self, name: str, opts: LaunchOptions, run_json: Path, env: dict | None = None):
        cmd = torchrun_command(opts, "tensoropt.executor.worker", [str(run_json)])
        full_env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                    "TENSOROPT_COLLECTIVE_TIMEOUT_S": "60", **(env or {})}
        log = open(self.tmp / f"{name}.log", "w")
        self.logs[name] = log
        self.procs[name] = subprocess.Popen(cmd, env=full_env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        return self.procs[name]

    def text(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()

    def all_text(self) -> str:
        return "\n".join(f"===== {n} =====\n{self.text(n)[-6000:]}" for n in self.procs)

    def kill(self, name: str) -> None:
        """SIGKILL an agent and its workers (torchrun starts each worker in a session of its own)."""
        proc = self.procs[name]
        for pid in [proc.pid, *descendants(proc.pid)]:
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        proc.wait(timeout=30)

    def wait(self, name: str, timeout_s: float) -> int:
        try:
            return self.procs[name].wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"agent {name} did not finish within {timeout_s} s\n{self.all_text()}")

    def close(self) -> None:
        for name in list(self.procs):
            if self.procs[name].poll() is None:
                self.kill(name)
        for log in self.logs.values():
            log.close()


def descendants(pid: int) -> list[int]:
    """Every live descendant process of ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


@pytest.fixture
def agents(tmp_path):
    """Agents of one test; all killed (process groups) at the end, whatever happened."""
    a = Agents(tmp_path)
    try:
        yield a
    finally:
        a.close()


def wait_until(predicate, timeout_s: float, agents: Agents, what: str, alive: tuple[str, ...] = ()):
    """Poll ``predicate`` until truthy; fail with the logs on timeout or when an ``alive`` agent exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        for name in alive:
            if agents.procs[name].poll() is not None:
                pytest.fail(f"agent {name} exited ({agents.procs[name].returncode}) while waiting for "
                            f"{what}\n{agents.all_text()}")
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}\n{agents.all_text()}")


def newest(ckpt: Path):
    """The newest complete checkpoint (no warnings: saves may be in progress)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        return latest_checkpoint(ckpt, verify_checksums=False)
