"""The one launch of the multi-process benchmarks: a benchmark script's ``worker`` under torchrun,
its options in a JSON file, and what rank 0 wrote back in another (``benchmarks/runtime.py``,
``batch_norm_runtime.py``, ``executor_vs_ddp.py``, ``runtime_ab.py``).

The launching side calls :func:`launch_workers`; the script ends with :func:`run_worker_if_asked`,
which runs its worker when it was started as one (``script.py --worker CONFIG``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
"""The benchmarks folder: on the workers' import path (the scripts import each other)."""


def launch_workers(script: str | Path, options: dict, out: Path, nproc: int = 2, timeout_s: float = 3600.0,
                   env: dict[str, str] | None = None) -> dict:
    """Run ``script --worker CONFIG`` on ``nproc`` processes (:func:`tensoropt.launch.launch_module`)
    and return the JSON its rank 0 wrote.

    Args:
        script: the benchmark file whose worker runs (its ``__file__``).
        options: the worker's options; ``"out"``, the file rank 0 writes its figures to, is added.
        out: a folder for the two files (``config.json``, ``result.json``).
        nproc: processes.
        timeout_s: wall-clock limit of the whole launch.
        env: more environment variables for the workers (the benchmarks folder is put on their
            ``PYTHONPATH``).

    Raises:
        RuntimeError: a worker failed or the launch timed out (torchrun's exit code named).

    Example:
        >>> # not run here: starts torchrun workers
        >>> launch_workers(__file__, {"steps": 5}, Path(tmp), timeout_s=600)  # doctest: +SKIP
        {'times': {...}}
    """
    from tensoropt.launch import LaunchOptions, launch_module

    result, config = out / "result.json", out / "config.json"
    config.write_text(json.dumps({**options, "out": str(result)}))
    env = {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]), **(env or {})}
    opts = LaunchOptions(nproc, timeout_s=timeout_s)
    rc = launch_module(str(script), ["--worker", str(config)], opts, env=env)
    if rc != 0:
        raise RuntimeError(f"{Path(script).name}: benchmark workers failed (torchrun exit code {rc})")
    return json.loads(result.read_text())


def run_worker_if_asked(worker: Callable[[dict], None], argv: list[str] | None = None) -> None:
    """When this process was started by :func:`launch_workers` (``argv`` is ``[script, "--worker",
    CONFIG]``): run ``worker`` on CONFIG's options (one thread per process unless
    ``OMP_NUM_THREADS`` says otherwise) and exit; else return.

    Example:
        >>> run_worker_if_asked(print, ["runtime.py", "--models", "gpt"])  # not a worker: returns
    """
    argv = sys.argv if argv is None else argv
    if len(argv) > 2 and argv[1] == "--worker":
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        sys.path.insert(0, str(HERE))
        worker(json.loads(Path(argv[2]).read_text()))
        sys.exit(0)
