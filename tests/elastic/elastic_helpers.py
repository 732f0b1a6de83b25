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
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from tensoropt.checkpoint import CheckpointWarning, latest_checkpoint
from tensoropt.executor.job.plan import ExecPlan
from tensoropt.executor.job.spec import TrainSpec

MODEL_KWARGS = {"in_features": 64, "hidden": [256, 256], "num_classes": 16}
BATCH = 1024  # large enough that the planner prefers sharded plans at 2 and 4 devices on cpu-local
TOTAL_STEPS = 8


def mlp_job(devices: list[int], lr: float = 0.05) -> dict:
    """The job: the zoo MLP, SGD with momentum (its state is resharded too), synthetic data per step."""
    from tensoropt.config import Job

    return Job(model={"name": "mlp", "kwargs": dict(MODEL_KWARGS), "task": "classification",
                      "input_shape": [64], "num_classes": 16},
               cluster="cpu-local", devices=devices, memory_budget="16MiB", select="fastest",
               training={"global_batch_size": BATCH, "optimizer": "momentum", "learning_rate": lr,
                         "seed": 0, "steps": TOTAL_STEPS}).to_dict()


def mlp_spec(lr: float = 0.05) -> TrainSpec:
    """The training run of the job, as `tensoropt run` makes it."""
    from tensoropt.config import Job

    return TrainSpec.from_job(Job.from_dict(mlp_job([1, 2], lr)))


def job_yaml(tmp: Path) -> Path:
    """The job as a YAML file (for `tensoropt run`)."""
    from tensoropt.config import Job

    path = tmp / "job.yaml"
    path.write_text(Job.from_dict(mlp_job([1, 2])).to_yaml())
    return path


def run_cli(*args) -> list[str]:
    """The command line of ``tensoropt run ARGS``."""
    return [sys.executable, "-m", "tensoropt.cli", "run", *map(str, args)]


RDZV_CONF = "last_call_timeout=1,join_timeout=120"
"""The agents' c10d rendezvous: a round closes 1 s after its last arrival; an agent waits 120 s at
most for a round to complete."""


def elastic_cli(job: Path, frontier: Path, ckpt: Path, steps: int, port: int, *more,
                per_agent: int = 1) -> list[str]:
    """One agent's command line in the elastic tests: ``tensoropt run --elastic`` on 1 to 2 machines
    of ``per_agent`` processes, the rendezvous on loopback ``port`` (:data:`RDZV_CONF`), plans from
    ``frontier``, ``steps`` steps in all, a checkpoint in ``ckpt`` after every step; ``more``: further
    options (``--max-restarts``, ``--timeout-s``, ...)."""
    return run_cli(job, "--elastic", "--nnodes", "1:2", "--nproc-per-node", per_agent,
                   "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf", RDZV_CONF, "--frontier", frontier,
                   "--steps", steps, "--checkpoint-dir", ckpt, "--checkpoint-every", 1, *more)


def trainer_state(ckpt: Path, step: int) -> dict | None:
    """``trainer.json`` of the loop's (or the pipelined runtime's) checkpoint of ``step``, once complete."""
    path = ckpt / f"step-{step}" / "trainer.json"
    return json.loads(path.read_text()) if path.is_file() else None


def listening(port: int) -> bool:
    """Whether something accepts connections on loopback ``port`` (an agent's rendezvous store)."""
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="session")
def frontier_file(tmp_path_factory) -> Path:
    """frontier.json of the MLP job planned for 1 and 2 devices (4 is planned on the spot)."""
    from tensoropt.config import Job
    from tensoropt.planner import plan_job

    path = tmp_path_factory.mktemp("plan") / "frontier.json"
    plan_job(Job.from_dict(mlp_job([1, 2]))).write(path)
    return path


ONE_DEVICE = ExecPlan.from_json({"id": "d1-p0", "mesh": {"shape": [], "levels": []}, "placements": {}})


@pytest.fixture(scope="session")
def reference_params() -> dict[str, torch.Tensor]:
    """Final parameters of an uninterrupted 1-process run of TOTAL_STEPS steps (in this process)."""
    from tensoropt.training.trainer import Trainer

    trainer = Trainer(mlp_spec(), ONE_DEVICE)
    trainer.train(TOTAL_STEPS)
    return trainer.full_params()


def checkpoint_params(ckpt: Path, step: int) -> dict[str, torch.Tensor]:
    """The parameters of the newest checkpoint (which must be at ``step``), loaded in this process."""
    from tensoropt.checkpoint import job_hash, resume
    from tensoropt.training.trainer import Trainer

    trainer = Trainer(mlp_spec(), ONE_DEVICE)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled")
        manifest = resume(trainer, ckpt, job_hash(mlp_spec().to_json()))
    assert manifest is not None and manifest.step == step, manifest
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


class Agents:
    """torchrun processes started by a test, each in its own process group, with logs."""

    def __init__(self, tmp: Path):
        self.tmp, self.procs, self.logs = tmp, {}, {}

    def start(self, name: str, cmd: list[str], env: dict | None = None):
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
        """SIGKILL a command, its torchrun agent and the workers (each in a session of its own)."""
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
