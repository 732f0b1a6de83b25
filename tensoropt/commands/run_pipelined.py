"""``tensoropt run`` of a plan whose ``"pipeline"`` is set: the workers of :mod:`tensoropt.pipeline_runtime`.

``tensoropt run`` hands a pipelined plan here (``commands/run.py`` dispatches on
``plan["pipeline"]``). Each stage's forward and backward replay programs traced once
(:mod:`tensoropt.pipeline_runtime.replay`; ``--compile inductor`` or the job's ``executor.compile``
compiles them with Inductor), data parallel inside each stage; the plan's intra-stage
layouts (tensor splits, memory options) are not run yet. The job's trainer keys (optimizer groups,
learning-rate schedule, clipping, metrics, validation, export) run through
:class:`tensoropt.training.pipelined.StageTrainer`. ``--checkpoint-dir DIR`` resumes from DIR's
newest checkpoint (any stage count, or a plan without stages, wrote it) up to the job's steps, and
writes one there every ``--checkpoint-every`` steps and after the last. ``--elastic`` (and
``--checkpoint-dir`` without ``--plan``) does not come here: each start selects its count's plan,
pipelined or not, in the trainer's loop (``commands/run.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

from tensoropt.commands import CommandError

UNSUPPORTED_FLAGS: tuple[tuple[str, str], ...] = ()
"""``tensoropt run`` options a pipelined plan does not take yet (attribute, flag): none since
``--elastic`` runs them (an elastic or resumed start without ``--plan`` trains through the trainer's
loop, which hands a pipelined plan to :func:`tensoropt.training.pipelined.train_pipelined`)."""


PIPELINED_COMPILE_BACKENDS: tuple[str, ...] = ("none", "inductor")
"""``executor.compile`` backends the pipelined runtime compiles its stages with (``--compile``); any
other is refused before a worker starts."""


def pipelined_problems(args, trainer_keys: list[str], executor: dict, selected: bool = False) -> list[str]:
    """What of this command line a pipelined run cannot honour yet (empty: it runs), each problem
    naming the option (or the job's key) and the way out. ``selected``: the plan is selected at each
    start (``--elastic``, or ``--checkpoint-dir`` without ``--plan``) rather than fixed by ``--plan``.

    Example:
        >>> import argparse
        >>> pipelined_problems(argparse.Namespace(elastic=False, compile="inductor"),
        ...     ["validation", "lr_scheduler"], {"mode": "replay", "compile": "inductor"})
        []
        >>> problems = pipelined_problems(argparse.Namespace(elastic=False, compile=None),
        ...     [], {"mode": "replay", "compile": "tvm"})
        >>> [p.split(" is refused")[0] for p in problems]
        ["the job's executor.compile: tvm"]
    """
    from tensoropt.training.pipelined import UNSUPPORTED_KEYS

    problems = [f"{flag}: not run with a pipelined plan yet" for attr, flag in UNSUPPORTED_FLAGS
                if getattr(args, attr, None)]
    backend = executor.get("compile", "none")
    if backend not in PIPELINED_COMPILE_BACKENDS:
        source = (f"--compile {backend}" if getattr(args, "compile", None) else
                  f"the job's executor.compile: {backend}")
        way_out = ("keep pipelined plans out of the selection: plan the job with planner.pipeline: off, so "
                   "its frontier file lists none" if selected else
                   "select a plan without a pipeline (`tensoropt select`) for --plan")
        problems.append(f"{source} is refused: the pipelined runtime does not compile its stages with "
                        f"{backend} (executor.compile: {' | '.join(PIPELINED_COMPILE_BACKENDS)} with a "
                        f"pipelined plan). Pass --compile none to train with the stages' traced programs "
                        f"replayed uncompiled, or {way_out}")
    for key in (k for k in trainer_keys if k in UNSUPPORTED_KEYS):
        problems.append(f"trainer key {key}: not run with a pipelined plan yet (drop it, or select a plan "
                        "without a pipeline)")
    return problems


def check_stages(job_path: str, spec, plan: dict) -> None:
    """Cut the job's model (on meta) as the plan says before any worker starts: a plan for other
    blocks, bad ranges, a batch the replicas and micro-batches do not divide, or weights shared by
    two stages are one-line errors here rather than a traceback on every rank.

    Example:
        >>> # not run here: exports the job's model
        >>> check_stages("job.yaml", spec, plan)  # doctest: +SKIP
    """
    from tensoropt.pipeline.schedules import PipelineError, check_pipeline
    from tensoropt.pipeline_runtime.stage_modules import build_stages

    pipe, devices = plan["pipeline"], int(plan.get("devices") or 1)
    try:
        check_pipeline(pipe["schedule"], int(pipe["stages"]), int(pipe["micro_batches"]), devices,
                       spec.global_batch_size)
        slices = devices // int(pipe["stages"]) * int(pipe["micro_batches"])
        if spec.global_batch_size % slices:
            raise PipelineError(f"training.global_batch_size {spec.global_batch_size} does not divide into "
                                f"{slices} slices (replicas x micro-batches)")
        build_stages(spec, pipe, spec.global_batch_size // slices,
                     block_names=(plan.get("pipeline_detail") or {}).get("block_names"))
    except PipelineError as e:
        raise CommandError(f"{job_path}: plan {plan.get('id')}: {e}") from None


def run_pipelined(args, spec, plan: dict, nproc: int, trainer_keys: list[str], executor: dict) -> int:
    """Launch the pipelined plan's workers; print the losses and the predicted vs measured step.

    Example:
        >>> # not run here: starts torchrun workers
        >>> run_pipelined(args, spec, plan, 2, [], {"mode": "replay", "compile": "none"})  # doctest: +SKIP
        0
    """
    from tensoropt.commands.run import launch_run

    problems = pipelined_problems(args, trainer_keys, executor)
    if problems:
        raise CommandError(f"plan {plan.get('id')} is pipelined: " + "; ".join(problems))
    pipe = plan["pipeline"]
    check_stages(args.job, spec, plan)
    entry = {"spec": spec.to_json(), "plan": plan, "total_steps": spec.steps, "steps": spec.steps,
             "compile": executor.get("compile", "none")}
    if args.metrics:
        entry["metrics"] = str(Path(args.metrics).resolve())
    if trainer_keys:
        out_dir = Path(args.metrics).resolve().parent if args.metrics else Path("out") / Path(args.job).stem
        out_dir.mkdir(parents=True, exist_ok=True)
        entry.update(job=spec.job, out_dir=str(out_dir.resolve()))
    if args.checkpoint_dir:
        from tensoropt.pipeline_runtime.checkpoint import latest_pipelined_checkpoint

        ckpt = Path(args.checkpoint_dir).resolve()
        entry["checkpoint_dir"] = str(ckpt)
        entry["checkpoint_every"] = int(getattr(args, "checkpoint_every", 0) or 0)
        entry["keep_checkpoints"] = int(getattr(args, "keep_checkpoints", 2))
        if latest_pipelined_checkpoint(ckpt) is not None:
            entry["resume_from"] = str(ckpt)
    print(f"tensoropt run: {spec.model} for {spec.steps} steps on {nproc} process(es), "
          f"plan {plan.get('id')}: "
          f"{pipe['stages']} stages, {pipe['schedule']}, {pipe['micro_batches']} micro-batches, blocks "
          f"{pipe['blocks']} (replayed stages"
          + (f", compiled by {entry['compile']}" if entry["compile"] != "none" else "")
          + ", data parallel inside each stage)"
          + (f"; trainer keys: {', '.join(trainer_keys)}" if trainer_keys else ""), flush=True)
    config = {"runs": [entry]}
    if args.timeout_s:
        config["timeout_s"] = args.timeout_s
    rc = launch_run("tensoropt.training.pipelined", config, args, nproc, spec)
    if rc != 0:
        return rc
    if args.metrics and Path(args.metrics).is_file():
        metrics = json.loads(Path(args.metrics).read_text())
        predicted, measured = metrics["predicted"].get("time_s"), metrics["measured"].get("time_s")
        line = (f"plan {metrics['plan_id']} on {metrics['devices']} devices: "
                f"step time measured {1e3 * measured:.1f} ms")
        if predicted:
            line += f", predicted {1e3 * predicted:.1f} ms ({(measured - predicted) / predicted:+.0%})"
        print(line)
    return 0
