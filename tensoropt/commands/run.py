"""``tensoropt run JOB.yaml --plan DIR/plan.json --nproc N [--steps S] [--metrics FILE]``: train a plan.

Launches N workers with torchrun (standalone on this machine; ``--nnodes``, ``--node-rank`` and
``--rdzv-endpoint`` for several machines). Each worker builds the job's model with the job's
seed, lays its parameters out as the plan says, and trains S steps on synthetic data (the same
global batch per step at every world size) or on the job's dataset factory.

Without ``--plan`` the plan for N devices is selected from ``--frontier`` (default
``out/frontier.json``) under the job's budget and rule, or planned on the spot when that file
has no frontier for N. ``--metrics FILE`` receives the measured step times and memory beside
the planner's predictions.

Each worker traces the plan's training step once into a local program and replays it
(:mod:`tensoropt.executor.program.replay`); ``--executor interpret`` runs the DTensor interpreter every
step instead (the reference), ``--compile inductor`` compiles the replayed program (both override
the job's ``executor:`` section). A compile backend that cannot run here is an error before any
worker starts.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from tensoropt.commands import CommandError, command_parser


def add_parser(subparsers) -> None:
    """Add the ``run`` subcommand."""
    from tensoropt.elastic import add_run_arguments

    p = command_parser(subparsers, "run", __doc__, help="train a selected plan on N processes (torchrun)")
    p.add_argument("job", help="the job YAML file (the model, optimizer and seed to train)")
    p.add_argument("--plan", default=None, help="plan.json written by `tensoropt select`")
    p.add_argument("--frontier", default=None,
                   help="frontier.json (or its folder) to select from without --plan (default: out/)")
    p.add_argument("--nproc", type=int, default=None,
                   help="worker processes (default: the plan's device count)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default: the job's)")
    p.add_argument("--metrics", default=None, help="write the metrics JSON here (rank 0)")
    p.add_argument("--dataset", default=None,
                   help='dataset factory "package.module:function", called as '
                        "f(step, global_batch_size, seed)")
    p.add_argument("--node-rank", type=int, default=None, help="this machine's rank (several machines)")
    p.add_argument("--timeout-s", type=float, default=None, help="stop the workers after this many seconds")
    p.add_argument("--compile", choices=("none", "inductor"), default=None,
                   help="compile the replayed local program (default: the job's executor.compile, none)")
    p.add_argument("--executor", choices=("replay", "interpret"), default=None,
                   help="replay: the traced local program; interpret: the DTensor interpreter every step "
                        "(default: the job's executor.mode, replay)")
    add_run_arguments(p)


def run(args) -> int:
    """Run the ``run`` subcommand; returns the exit code."""
    from tensoropt import elastic
    from tensoropt.config import ConfigError, load_job
    from tensoropt.executor.job.spec import TrainSpec
    from tensoropt.planner import PlanningError
    from tensoropt.training.checks import trainer_keys

    problem = elastic.check_run_arguments(args)
    if problem:
        raise CommandError(problem)
    if args.steps is not None and args.steps < 0:
        raise CommandError(f"--steps must be >= 0, got {args.steps}")
    try:
        job = load_job(args.job)
    except ConfigError as e:
        raise CommandError(str(e)) from None
    try:  # the job resolved as `plan` resolves it (same defaults, batch size and budget)
        spec = TrainSpec.from_job(job, steps=args.steps, dataset=args.dataset)
    except (ValueError, PlanningError) as e:
        raise CommandError(f"{args.job}: {e}") from None
    nnodes = _fixed_nodes(args.nnodes)
    entry = elastic.run_entry(args, _frontier_path(args), job.to_dict())
    plan = None
    if "select" not in entry:
        plan = _load_plan(args) if args.plan else _select(args, job, nnodes)
        if plan.get("pipeline"):  # issue 27: stages on torch.distributed.pipelining
            from tensoropt.commands.run_pipelined import run_pipelined

            # the plan's micro-batches are the schedule's, not the trainer's accumulation
            _check_training_keys(args, spec, None)  # no_decay words, the TensorBoard directory
            return run_pipelined(args, spec, plan, _nproc(args, plan, nnodes),
                                 trainer_keys(job, {"micro_batches": 1}), _executor(args, job))
        entry["plan"] = plan
        _check_plan_graph(args, spec, plan)
    _check_training_keys(args, spec, plan)
    nproc = _nproc(args, plan, nnodes)
    executor = _executor(args, job)
    trainer = trainer_keys(job, plan)
    staged = "select" in entry and elastic.may_select_pipelined(entry["select"]["frontier"], job)
    if staged:  # a start may select a pipelined plan: the trainer's loop runs either kind
        from tensoropt.commands.run_pipelined import pipelined_problems

        problems = pipelined_problems(args, trainer, executor, selected=True)
        if problems:
            raise CommandError("a start may select a pipelined plan (the frontier file lists some, or the "
                               "job plans them): " + "; ".join(problems))
    if trainer or staged:
        if "select" in entry:  # the loop hands a selected pipelined plan to the pipelined runtime
            entry["select"]["pipelined"] = True
        return _run_trainer(args, job, spec, plan, nproc, executor, trainer, entry)
    if args.metrics:
        entry["metrics"] = str(Path(args.metrics).resolve())
    config = {"spec": spec.to_json(), "steps": spec.steps, "runs": [entry], "executor": executor}
    print(f"tensoropt run: {spec.model} for {spec.steps} steps on {nproc * nnodes} process(es)"
          + (f", plan {plan['id']} ({plan.get('summary') or 'no summary'})" if plan else ""), flush=True)
    rc = launch_run("tensoropt.training.worker", config, args, nproc, spec)
    if rc != 0:
        return rc
    if args.metrics and Path(args.metrics).is_file():
        print(format_metrics(json.loads(Path(args.metrics).read_text())))
    return 0


def launch_run(module: str, run_config: dict, args, nproc: int, spec) -> int:
    """Start ``module``'s workers on ``run_config`` (their RUN.json, written to a temporary file) under
    torchrun with the command line's launch options; a failure is reported in one line. Every
    ``tensoropt run`` launch goes through here (the measuring worker, the trainer's loop, the
    pipelined runtime). Returns torchrun's exit code.

    Example:
        >>> # not run here: starts torchrun workers
        >>> launch_run("tensoropt.training.worker", config, args, 2, spec)  # doctest: +SKIP
        0
    """
    from tensoropt import elastic
    from tensoropt.launch import launch_module

    with tempfile.TemporaryDirectory(prefix="tensoropt-run-") as tmp:
        path = Path(tmp) / "run.json"
        path.write_text(json.dumps(run_config))
        opts = elastic.launch_options(args, nproc, spec.to_json(), args.timeout_s)
        rc = launch_module(module, [str(path)], opts)
    if rc != 0:
        print(f"tensoropt run: the workers failed (exit code {rc}); see the messages above", file=sys.stderr)
    return rc


def format_metrics(metrics: dict) -> str:
    """Predicted vs measured step time and memory, one line each.

    Example:
        >>> print(format_metrics({"plan_id": "d2-p0", "devices": 2, "steps": [],
        ...     "predicted": {"time_s": 0.010, "memory_bytes": 2**20},
        ...     "measured": {"time_s": 0.012, "memory_bytes": 2**20}}))
        plan d2-p0 on 2 devices: step time predicted 10.0 ms, measured 12.0 ms (+20%)
        memory per device predicted 1.00 MiB, measured 1.00 MiB (+0%)

        The measured peak (``measured.peak_bytes``: the allocator's peak on CUDA, the resident set's
        high-water mark above its level before the model was built on CPU) is printed beside the
        prediction when the workers recorded it:

        >>> lines = format_metrics({"plan_id": "d2-p0", "devices": 2, "steps": [],
        ...     "predicted": {"time_s": 0.01, "memory_bytes": 2**20, "peak_bytes": 2**21},
        ...     "measured": {"time_s": 0.01, "memory_bytes": 2**20, "peak_bytes": 2**21 * 1.1}})
        >>> print(lines.splitlines()[-1])
        peak per process predicted 2.00 MiB, measured 2.20 MiB (+10%)

        and the high-water mark of live tensor bytes (``measured.peak_tensor_bytes``), which no
        allocator setting changes, beside the memory model's figure without the runtime's own memory:

        >>> print(format_metrics({"plan_id": "d2-p0", "devices": 2, "steps": [],
        ...     "predicted": {"time_s": 0.01, "memory_bytes": 2**20, "peak_tensor_bytes": 2**21},
        ...     "measured": {"time_s": 0.01, "memory_bytes": 2**20, "peak_tensor_bytes": 2**21 * 0.95}}
        ...     ).splitlines()[-1])
        peak tensor bytes predicted 2.00 MiB, measured 1.90 MiB (-5%)
    """
    pred, meas = metrics.get("predicted", {}), metrics.get("measured", {})

    def rel(m, p):
        return f" ({(m - p) / p:+.0%})" if p else ""

    lines = [f"plan {metrics.get('plan_id')} on {metrics.get('devices')} devices: step time predicted "
             + (f"{pred['time_s'] * 1e3:.1f} ms" if pred.get("time_s") is not None else "n/a")
             + f", measured {meas['time_s'] * 1e3:.1f} ms" + rel(meas["time_s"], pred.get("time_s"))]
    predicted_mib = pred.get("memory_bytes")
    lines.append("memory per device predicted "
                 + (f"{predicted_mib / 2**20:.2f} MiB" if predicted_mib is not None else "n/a")
                 + f", measured {meas['memory_bytes'] / 2**20:.2f} MiB"
                 + rel(meas["memory_bytes"], pred.get("memory_bytes")))
    if meas.get("peak_bytes") is not None:  # what the allocator (CUDA) or the process (CPU RSS) held
        predicted_peak = pred.get("peak_bytes")
        lines.append("peak per process predicted "
                     + (f"{predicted_peak / 2**20:.2f} MiB" if predicted_peak is not None else "n/a")
                     + f", measured {meas['peak_bytes'] / 2**20:.2f} MiB"
                     + rel(meas["peak_bytes"], predicted_peak))
    if meas.get("peak_tensor_bytes"):  # live tensor storage at its high-water mark (no allocator in it)
        predicted_tensors = pred.get("peak_tensor_bytes")
        lines.append("peak tensor bytes predicted "
                     + (f"{predicted_tensors / 2**20:.2f} MiB" if predicted_tensors is not None else "n/a")
                     + f", measured {meas['peak_tensor_bytes'] / 2**20:.2f} MiB"
                     + rel(meas["peak_tensor_bytes"], predicted_tensors))
    return "\n".join(lines)


def _executor(args, job) -> dict:
    """The RUN.json ``executor`` entry (``--executor``/``--compile`` over the job's ``executor:``),
    its compile backend checked here, before any worker starts."""
    import torch

    from tensoropt.executor.program.replay import CompileUnavailable, check_compile_backend

    mode = args.executor or job.executor.mode
    backend = args.compile or job.executor.compile
    if backend != "none" and mode != "replay":
        raise CommandError(f"--compile {backend} compiles the replayed program: it needs executor mode "
                           f"replay, not {mode}")
    try:
        check_compile_backend(backend, "cuda" if torch.cuda.is_available() else "cpu")
    except (CompileUnavailable, ValueError) as e:
        raise CommandError(str(e)) from None
    return {"mode": mode, "compile": backend}


def _fixed_nodes(nnodes: str) -> int:
    try:
        return int(str(nnodes).split(":")[-1])
    except ValueError:
        raise CommandError(f"--nnodes must be N or MIN:MAX, got {nnodes!r}") from None


def _frontier_path(args) -> Path | None:
    path = Path(args.frontier) if args.frontier else Path("out")
    if path.is_dir():
        path = path / "frontier.json"
    return path if (args.frontier or path.is_file()) else None


def _load_plan(args) -> dict:
    from tensoropt.executor.job.plan import ExecPlan

    try:
        ExecPlan.load(args.plan)  # validates
    except ValueError as e:
        raise CommandError(str(e)) from None
    return json.loads(Path(args.plan).read_text())


def _select(args, job, nnodes: int) -> dict:
    from tensoropt.elastic import ElasticPlanError, select_for_world_size
    from tensoropt.planner import PlanningError

    devices = args.nproc * nnodes if args.nproc else None
    if devices is None:
        raise CommandError("without --plan, give the device count with --nproc N")
    frontier = _frontier_path(args)
    try:
        plan, line = select_for_world_size(devices, frontier, job.to_dict(), pipelined=True)
    except (ElasticPlanError, PlanningError) as e:
        raise CommandError(str(e)) from None
    print(f"tensoropt run: {line}", flush=True)
    return plan


def _check_plan_graph(args, spec, plan: dict) -> None:
    """Refuse, before any worker starts, a plan made for another graph than the job's model.

    The job's model is captured on meta as ``tensoropt plan`` captures it and compared with the
    plan's graph fingerprint (each worker checks its own export again).
    """
    from tensoropt.config import Job
    from tensoropt.executor.job.plan import ExecPlan, PlanGraphMismatch, check_plan_graph
    from tensoropt.planner import capture_job

    source = args.plan or f"the selected plan {plan.get('id')}"
    try:
        graph = capture_job(Job.from_dict(spec.job, args.job))
        warnings = check_plan_graph(ExecPlan.from_json(plan), graph, spec.job, source)
    except PlanGraphMismatch as e:
        raise CommandError(str(e).replace("JOB.yaml", args.job)) from None
    except (RuntimeError, ValueError) as e:  # PlanningError, capture's TraceError
        raise CommandError(f"{args.job}: capturing the model to check the plan: {e}") from None
    for warning in warnings:
        print(f"tensoropt run: warning: {warning}", file=sys.stderr, flush=True)


def _run_trainer(args, job, spec, plan: dict | None, nproc: int, executor: dict, keys: list[str],
                 entry: dict) -> int:
    """Train with the trainer's loop (:mod:`tensoropt.training.loop`): the job sets trainer keys, or a
    start without a fixed plan may select a pipelined plan. Without a fixed plan (``--elastic``, or
    ``--checkpoint-dir`` without ``--plan``) each start of the workers takes the plan of its device
    count from ``entry["select"]`` (with ``pipelined``: a pipelined plan too, which the loop hands to
    :func:`tensoropt.training.pipelined.train_pipelined`)."""
    out_dir = Path(args.metrics).resolve().parent if args.metrics else Path("out") / Path(args.job).stem
    out_dir.mkdir(parents=True, exist_ok=True)
    run = {"job": spec.job, "plan": plan, "select": entry.get("select"), "out_dir": str(out_dir),
           "steps": spec.steps,
           "mode": executor.get("mode", "replay"), "compile": executor.get("compile", "none"),
           "checkpoint_every": args.checkpoint_every,
           "keep_checkpoints": args.keep_checkpoints,
           "checkpoint_dir": str(Path(args.checkpoint_dir).resolve()) if args.checkpoint_dir else None}
    chosen = (f"plan {plan['id']} ({plan.get('micro_batches', 1)} micro-batches" if plan is not None
              else "the plan of each start's device count (" + ("elastic" if args.elastic else "resumed")
              + (", pipelined or not" if (entry.get("select") or {}).get("pipelined") else ""))
    print(f"tensoropt run: {spec.model} for {spec.steps} steps on {nproc} process(es), {chosen}; "
          f"trainer keys: {', '.join(keys) or 'none'})", flush=True)
    rc = launch_run("tensoropt.training.loop", run, args, nproc, spec)
    if rc != 0:
        return rc
    jsonl = Path(job.metrics.jsonl) if job.metrics.jsonl else out_dir / "metrics.jsonl"
    print(f"tensoropt run: metrics in {jsonl}")
    return 0


def _check_training_keys(args, spec, plan: dict | None) -> None:
    """Refuse, before any worker starts, trainer keys the model or the plan cannot honour
    (:func:`tensoropt.training.checks.launch_problems`: no_decay words, the TensorBoard directory,
    the plan's micro-batches)."""
    from tensoropt.config import Job
    from tensoropt.job_model import build_job_model
    from tensoropt.training.checks import launch_problems

    job = Job.from_dict(spec.job, args.job)
    names = [n for n, _ in build_job_model(job, "meta")[0].named_parameters()] if job.optimizer else []
    problems = launch_problems(job, names, plan)
    if problems:
        raise CommandError(f"{args.job}: " + problems[0])


def _nproc(args, plan: dict | None, nnodes: int) -> int:
    nproc = args.nproc or args.nproc_per_node
    if plan is not None:
        devices = int(plan.get("devices") or 1)
        if nproc is None:
            nproc = max(1, devices // nnodes)
        if nproc * nnodes != devices:
            raise CommandError(f"the plan {plan.get('id')} is for {devices} devices but --nproc {nproc} "
                               f"x --nnodes {nnodes} gives {nproc * nnodes}; select a plan for that count")
    if nproc is None:
        raise CommandError("give the process count with --nproc N")
    return nproc
