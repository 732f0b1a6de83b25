"""The ``tensoropt run`` side of elastic and resumable runs: its command-line options, the
torchrun options they make, and the worker's RUN.json entry.

What every worker then does on each (re)start (select or plan for the world size, resume from the
newest checkpoint, train with checkpoints) is :mod:`tensoropt.executor.state.restart`; its names are
re-exported here. Layers: this module sits above the executor (it imports
``tensoropt.executor.state.restart``); the executor's worker imports the restart module, never this one.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from tensoropt.checkpoint.manifest import job_hash

_RESTART_NAMES = ("EVENT_LOG", "HOLD_DIR_ENV", "HOLD_MAX_S", "ElasticPlanError", "read_events",
                  "resolve_plan", "select_for_world_size", "train_with_checkpoints", "world")
"""Re-exported from :mod:`tensoropt.executor.state.restart` (the worker side of elastic runs), imported
when first used: ``tensoropt --help`` adds this module's options without importing torch."""


def __getattr__(name: str):
    if name in _RESTART_NAMES:
        return getattr(importlib.import_module("tensoropt.executor.state.restart"), name)
    raise AttributeError(f"module 'tensoropt.elastic' has no attribute {name!r}")


def add_run_arguments(parser) -> None:
    """Add the elastic and checkpoint options of ``tensoropt run`` (those not defined yet).

    Example:
        >>> import argparse
        >>> p = argparse.ArgumentParser(); add_run_arguments(p)
        >>> p.parse_args(["--elastic", "--nnodes", "1:2", "--rdzv-endpoint", "h:1"]).nnodes
        '1:2'
    """
    group = parser.add_argument_group("elastic training and checkpoints")
    options = [
        ("--elastic", dict(action="store_true", help="run under torchrun's elastic agent (c10d rendezvous): "
                           "workers restart with the plan for the new device count when machines "
                           "leave or join (needs --nnodes MIN:MAX and --rdzv-endpoint)")),
        ("--nnodes", dict(default="1", help="machines: N, or MIN:MAX with --elastic")),
        ("--nproc-per-node", dict(type=int, default=None, help="worker processes on this machine")),
        ("--rdzv-endpoint", dict(default=None, help="HOST:PORT of the rendezvous (several machines)")),
        ("--rdzv-conf", dict(default=None, help="torchrun --rdzv-conf, e.g. last_call_timeout=5")),
        ("--max-restarts", dict(type=int, default=3, help="worker-group restarts tolerated (elastic)")),
        ("--checkpoint-dir", dict(default=None, help="save checkpoints here and resume from the newest "
                                  "complete one of this job")),
        ("--checkpoint-every", dict(type=int, default=0, help="save every N steps (and after the last)")),
        ("--keep-checkpoints", dict(type=int, default=2, help="complete checkpoints kept (0: all)")),
    ]
    for flag, kwargs in options:
        if flag not in parser._option_string_actions:
            group.add_argument(flag, **kwargs)


def check_run_arguments(args) -> str | None:
    """What is wrong with the elastic/checkpoint options of ``args``, or None.

    Example:
        >>> import argparse
        >>> check_run_arguments(argparse.Namespace(elastic=True, nnodes="1:2", rdzv_endpoint=None,
        ...     checkpoint_dir=None, checkpoint_every=0, plan=None))
        '--elastic needs --rdzv-endpoint HOST:PORT (the same on every machine)'
    """
    if args.checkpoint_every < 0:
        return f"--checkpoint-every must be >= 0, got {args.checkpoint_every}"
    if args.checkpoint_every and not args.checkpoint_dir:
        return "--checkpoint-every needs --checkpoint-dir DIR"
    if not getattr(args, "elastic", False):
        return None
    if not args.rdzv_endpoint:
        return "--elastic needs --rdzv-endpoint HOST:PORT (the same on every machine)"
    if not args.checkpoint_dir:
        return "--elastic needs --checkpoint-dir DIR (restarted workers resume from its checkpoints)"
    if getattr(args, "plan", None):
        return ("--elastic selects the plan for each world size from frontier.json; "
                "drop --plan (it fixes the device count)")
    return None


def launch_options(args, nproc: int, spec_json: dict, timeout_s: float | None = None):
    """The :class:`tensoropt.launch.LaunchOptions` of a ``tensoropt run`` command line.

    Elastic runs get torchrun's c10d rendezvous with ``--nnodes MIN:MAX``, ``--max-restarts``,
    ``--rdzv-conf`` and an ``--rdzv-id`` derived from the job (the same on every machine).

    Example:
        >>> import argparse
        >>> a = argparse.Namespace(elastic=True, nnodes="1:2", rdzv_endpoint="h:1", rdzv_conf=None,
        ...                        max_restarts=3, nproc_per_node=None, node_rank=None)
        >>> launch_options(a, 1, {"model": "mlp"}).rdzv_id
        'tensoropt-df1104714da65e0b'
    """
    from tensoropt.launch import LaunchOptions

    per_node = args.nproc_per_node or nproc
    if not getattr(args, "elastic", False):
        return LaunchOptions(per_node, nnodes=str(args.nnodes), node_rank=getattr(args, "node_rank", None),
                             rdzv_endpoint=args.rdzv_endpoint, timeout_s=timeout_s)
    return LaunchOptions(per_node, nnodes=str(args.nnodes), rdzv_endpoint=args.rdzv_endpoint,
                         timeout_s=timeout_s, max_restarts=args.max_restarts, rdzv_conf=args.rdzv_conf,
                         rdzv_id=f"tensoropt-{job_hash(spec_json)}")


def may_select_pipelined(frontier: str | Path | None, job) -> bool:
    """Whether a start that selects its plan (elastic, or resumed without ``--plan``) may select a
    pipelined plan: the frontier file lists one, or the job plans pipelines (``planner.pipeline``
    not off: a count the file lacks is planned on the spot with them). ``tensoropt run`` then
    trains through the trainer's loop, which runs pipelined plans and plans without stages alike.

    Example:
        >>> from tensoropt.config import Job
        >>> job = Job(model={"name": "mlp"}, cluster="cpu-local", devices=[2])
        >>> may_select_pipelined(None, job), may_select_pipelined(None, Job(model={"name": "mlp"},
        ...     cluster="cpu-local", devices=[2], planner={"pipeline": {"stages": [2]}}))
        (False, True)
    """
    if job.planner.pipeline != "off":
        return True
    if frontier is None or not Path(frontier).is_file():
        return False
    from tensoropt.plans import load_frontier_file

    return any(p.pipeline for f in load_frontier_file(frontier).frontiers for p in f.plans)


def run_entry(args, frontier: str | Path | None, job: dict | None) -> dict:
    """The keys of a worker RUN.json run entry for these options.

    ``select`` (choose the plan per world size at every start) when the run is elastic or
    resumes without a fixed ``--plan``; ``checkpoint`` with ``--checkpoint-dir``.

    Example:
        >>> import argparse
        >>> a = argparse.Namespace(elastic=False, plan=None, checkpoint_dir="ck", checkpoint_every=5,
        ...                        keep_checkpoints=2)
        >>> sorted(run_entry(a, "out/frontier.json", None))
        ['checkpoint', 'select']
    """
    entry: dict = {}
    if getattr(args, "elastic", False) or (args.checkpoint_dir and not getattr(args, "plan", None)):
        entry["select"] = {"frontier": str(frontier) if frontier is not None else None, "job": job}
    if args.checkpoint_dir:
        entry["checkpoint"] = {"dir": str(Path(args.checkpoint_dir).resolve()),
                               "every": args.checkpoint_every, "keep": args.keep_checkpoints}
    return entry
