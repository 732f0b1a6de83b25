"""Launch executor workers with torchrun (``python -m torch.distributed.run``).

One machine: ``--standalone``. Several machines: ``--nnodes``, ``--node-rank`` and
``--rdzv-endpoint`` are passed through with the c10d rendezvous. torchrun stops every worker as
soon as one exits non-zero. Every multi-process run of the project (``tensoropt run``, elastic
runs, ``tensoropt calibrate``) starts its processes through :func:`launch_module`.

Ports. Standalone, torchrun's c10d rendezvous binds its store to port 0 and keeps the socket, and
the workers' process group joins that same store (torch's store sharing): no port is chosen, let
go and taken again, so two launches at once cannot race for one. Only a launch that may restart
its workers (``max_restarts``, an elastic ``nnodes`` range, or a rendezvous endpoint given for
several machines) sets ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: a restarted round that reuses the
old store fails with "Gloo connectFullMesh failed" (docs/user-guide.md, elastic), so each round
gets a store of its own on a port rank 0's agent picks (torch's ``get_free_port``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

WORKER_MALLOC = {"MALLOC_TOP_PAD_": str(16 << 20), "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
"""glibc malloc settings a worker gets with ``TENSOROPT_WORKER_MALLOC=peak`` (:func:`worker_malloc_env`).
A fixed top pad turns off glibc's dynamic mmap and trim thresholds, which otherwise grow after a
large tensor is freed (up to 32 and 64 MiB), so tensors of up to that size come from the heap and
stay resident after they are freed: under glibc's defaults the CPU peak held 25-28 % more than
the memory model predicts (zoo gpt, 1 process) and 5-8 % more on big-fc. With the pad, tensors
over 128 KiB are mapped and returned when freed, and glibc asks for transparent huge pages
(``hugetlb=1``, glibc >= 2.35, the kernel's ``madvise`` mode) on what it maps, so a re-mapped
tensor faults once per 2 MiB. Not the default: CPU time per replayed step against glibc's
defaults, 1 process, three runs: gpt 1.03-1.08, big-fc 0.74-0.77, tiny HF Llama 0.93-0.96
(``benchmarks/allocator.py --single``); the peak's prediction error, ``benchmarks/memory_peak.py``:
big-fc -0.5..-3.2 %, gpt +1.4 % at 1 process but -10..-11 % at 2 (glibc's defaults: -24..-46 %),
tiny HF Llama -19..-28 % (2 MiB pages on a 22 MiB process; docs/results.md)."""

WORKER_MALLOC_CHOICE = "TENSOROPT_WORKER_MALLOC"
"""Environment variable: ``glibc`` (default) leaves the workers' malloc at glibc's settings,
``peak`` adds :data:`WORKER_MALLOC` (a CPU peak comparable with the memory model's prediction)."""


def worker_malloc_env(env: dict) -> dict:
    """The malloc variables a worker with environment ``env`` gets: with
    ``TENSOROPT_WORKER_MALLOC=peak`` those of :data:`WORKER_MALLOC` that ``env`` does not set itself,
    else none.

    Example:
        >>> worker_malloc_env({})
        {}
        >>> sorted(worker_malloc_env({"TENSOROPT_WORKER_MALLOC": "peak"}))
        ['GLIBC_TUNABLES', 'MALLOC_TOP_PAD_']
        >>> worker_malloc_env({"TENSOROPT_WORKER_MALLOC": "peak", "GLIBC_TUNABLES": "glibc.mem.tagging=0"})
        {'MALLOC_TOP_PAD_': '16777216'}
    """
    choice = env.get(WORKER_MALLOC_CHOICE, "glibc")
    if choice not in ("glibc", "peak"):
        raise ValueError(f"{WORKER_MALLOC_CHOICE}: got {choice!r} (expected glibc | peak)")
    if choice == "glibc":
        return {}
    return {key: value for key, value in WORKER_MALLOC.items() if key not in env}


@dataclass(frozen=True)
class LaunchOptions:
    """How to start the workers.

    Attributes:
        nproc_per_node: worker processes on this machine.
        nnodes: machines (``"2"``, or ``"1:4"`` for elastic); 1 runs standalone.
        node_rank: this machine's rank (multi-node, static).
        rdzv_endpoint: ``HOST:PORT`` of the rendezvous (multi-node).
        timeout_s: wall-clock limit for the whole launch (None: no limit).
        max_restarts: torchrun's ``--max-restarts`` (elastic: worker failures tolerated).
        rdzv_conf: torchrun's ``--rdzv-conf``, e.g. ``"last_call_timeout=1"``.
        rdzv_id: torchrun's ``--rdzv-id`` (the same on every machine of one job).
    """

    nproc_per_node: int
    nnodes: str = "1"
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    timeout_s: float | None = None
    max_restarts: int | None = None
    rdzv_conf: str | None = None
    rdzv_id: str | None = None

    def __post_init__(self):
        if self.nproc_per_node < 1:
            raise ValueError(f"--nproc must be >= 1, got {self.nproc_per_node}")
        if self.nnodes != "1" and not self.rdzv_endpoint:
            raise ValueError(f"--nnodes {self.nnodes} needs --rdzv-endpoint HOST:PORT")


def torchrun_command(opts: LaunchOptions, module: str, args: list[str]) -> list[str]:
    """The torchrun command line that runs ``python -m module args`` on every worker (``module``
    may instead be the path of a ``.py`` script: ``python script.py args``).

    Example:
        >>> torchrun_command(LaunchOptions(2), "tensoropt.training.worker", ["run.json"])[1:6]
        ['-m', 'torch.distributed.run', '--nproc-per-node', '2', '--standalone']
        >>> torchrun_command(LaunchOptions(2), "benchmarks/runtime.py", ["--worker", "c.json"])[-3:]
        ['benchmarks/runtime.py', '--worker', 'c.json']
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(opts.nproc_per_node)]
    if opts.nnodes == "1" and not opts.rdzv_endpoint:
        cmd.append("--standalone")
    else:
        cmd += ["--nnodes", opts.nnodes, "--rdzv-backend", "c10d", "--rdzv-endpoint", opts.rdzv_endpoint]
        if opts.node_rank is not None:
            cmd += ["--node-rank", str(opts.node_rank)]
        for flag, value in (("--max-restarts", opts.max_restarts), ("--rdzv-conf", opts.rdzv_conf),
                            ("--rdzv-id", opts.rdzv_id)):
            if value is not None:
                cmd += [flag, str(value)]
    target = [module] if module.endswith(".py") else ["-m", module]
    cmd += ["--monitor-interval", "0.2", *target, *args]
    return cmd


def launch_workers(run_config: dict, opts: LaunchOptions, env: dict | None = None) -> int:
    """Write ``run_config`` (the worker's RUN.json) to a temp file and run the executor's workers.

    Returns torchrun's exit code (non-zero when any worker failed, 124 when the timeout hit).

    Example:
        >>> # not run here: starts torchrun worker processes
        >>> launch_workers({"spec": spec.to_json(), "runs": [...]}, LaunchOptions(2))  # doctest: +SKIP
    """
    with tempfile.TemporaryDirectory(prefix="tensoropt-run-") as tmp:
        path = Path(tmp) / "run.json"
        path.write_text(json.dumps(run_config))
        return launch_module("tensoropt.training.worker", [str(path)], opts, env)


def restarts_possible(opts: LaunchOptions) -> bool:
    """Whether torchrun may start a second round of workers (then each round needs its own store).

    Example:
        >>> restarts_possible(LaunchOptions(2)), restarts_possible(LaunchOptions(2, max_restarts=3))
        (False, True)
    """
    return bool(opts.max_restarts) or opts.nnodes != "1" or opts.rdzv_endpoint is not None


def launch_module(module: str, args: list[str], opts: LaunchOptions, env: dict | None = None) -> int:
    """Run ``python -m module args`` (or a ``.py`` script) on every worker under torchrun; wait for it
    (or the timeout).

    The workers get ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``
    from torchrun and join with ``dist.init_process_group()`` (``env://``). ``env`` is added to this
    process's environment (with ``TENSOROPT_WORKER_MALLOC=peak`` in it, the malloc settings of
    :data:`WORKER_MALLOC` it does not set: :func:`worker_malloc_env`). On timeout or Ctrl-C the whole
    process group of torchrun is stopped.

    Returns:
        torchrun's exit code: 0, non-zero when any worker failed, 124 when the timeout hit.

    Example:
        >>> opts = LaunchOptions(2, timeout_s=60)
        >>> # not run here: starts torchrun worker processes
        >>> launch_module("tensoropt.commands.calibrate_worker", ["c.json"], opts)  # doctest: +SKIP
        0
    """
    cmd = torchrun_command(opts, module, args)
    full_env = {**os.environ, **(env or {})}
    full_env.update(worker_malloc_env(full_env))
    if restarts_possible(opts):
        full_env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    proc = subprocess.Popen(cmd, env=full_env, start_new_session=True)
    try:
        return proc.wait(timeout=opts.timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        print(f"[tensoropt] workers did not finish within {opts.timeout_s:.0f} s; stopped them",
              file=sys.stderr)
        return 124
    except KeyboardInterrupt:
        _kill_group(proc)
        raise


def _kill_group(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
