"""The replayed data-parallel plan against DDP, with the runtime's speed features on and off, in one launch.

For each model of ``benchmarks/runtime.py`` (``--models``), one torchrun launch of 2 gloo
processes (one thread each) builds the data-parallel plan (every node ``batch=2``) once per
variant and plain ``DistributedDataParallel`` (AdamW, same global batch), and runs them step by
step, interleaved (the order reversed every other step), ``--steps`` steps each after 2 warm-up
steps. Variants (issue 16, engineer A's changes; each switched off by patching the runtime back
for the duration of that trainer's trace and steps, nothing else differs):

* ``new``: the runtime as it is (fused AdamW, in-place bucket all-reduce, collectives hoisted/sunk);
* ``old``: all three off (foreach AdamW, functional all-reduce copying each bucket, the HF loss's
  (sum, count) all-reduced together and waited at the loss);
* ``fused`` / ``reinplace`` / ``hoist``: only that feature on;
* ``unsimplified``: all but ``simplify`` (engineer S: the traced program's constants folded and
  re-labelling nodes dropped, :mod:`tensoropt.executor.program.graph_simplify`);
* ``main``: the runtime before branch ``cnnfast`` (the four above on, its three off); ``direct`` /
  ``unread`` / ``lossread``: ``main`` plus that one of them: aten operators called through their
  Python bindings (:mod:`tensoropt.executor.program.direct_calls`), unread pure nodes dropped
  (``graph_simplify.drop_unread``), a partial loss summed inside the program
  (``lowering.reported_loss``) instead of by a blocking all-reduce after the step.

Printed per model and system: the median wall step time (what ``runtime.py`` reports) and the
median main-thread CPU time of a step (``time.thread_time``: forward, backward and optimizer on
this thread, no time spent waiting for the other rank or descheduled). On a loaded machine the
wall time of 2 single-thread ranks on 2 shared cores is mostly waiting; the CPU time still
compares the work. Also the largest difference of losses and final parameters against the first
variant (0.0: the same values bit for bit). ``--batch-norm local``: the CNN's plans with per-rank
statistics, as plain DDP's batch norm (``benchmarks/runtime.py``'s option).

Usage (one command): ``TENSOROPT_CACHE=/tmp/cache .venv/bin/python benchmarks/runtime_ab.py
[--models gpt,hf-gpt2,hf-bert,hf-llama] [--steps 12] [--variants old,new,fused,reinplace,hoist]
[--batch-norm local]``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
FEATURES = ("fused", "reinplace", "hoist", "simplify", "direct", "unread", "lossread")
MAIN = ("fused", "reinplace", "hoist", "simplify")
VARIANTS = {"old": (), "new": FEATURES, "fused": ("fused",), "reinplace": ("reinplace",), "hoist": ("hoist",),
            "unsimplified": ("fused", "reinplace", "hoist"), "main": MAIN, "direct": (*MAIN, "direct"),
            "unread": (*MAIN, "unread"), "lossread": (*MAIN, "lossread")}
"""Variant -> the features it keeps on."""


def _stacked_global_mean(ctx, local_sum, count, groups):
    """``local_ops._GlobalMean.forward`` before the change: (sum, count) in one all-reduce."""
    import torch.distributed._functional_collectives as funcol

    buf = torch.stack([local_sum.detach().to(torch.float64), count.to(torch.float64)])
    for group in groups:
        buf = funcol.all_reduce(buf, "sum", group)
    ctx.count = buf[1].to(local_sum.dtype)
    return (buf[0] / buf[1]).to(local_sum.dtype)


def _loss_as_traced(loss):
    """``lowering.reported_loss`` before branch ``cnnfast``: the loss's local value and its own spec (a
    partial sum is read after the step, by ``parallel.runtime.read_loss``'s blocking all-reduce)."""
    from torch.distributed.tensor import DTensor

    if isinstance(loss, DTensor):
        return loss._local_tensor.detach(), loss._spec
    return loss.detach(), None


@contextlib.contextmanager
def features(on: tuple[str, ...]):
    """Run the block with only the features ``on`` of the runtime (the others patched back).

    Example:
        >>> with features(FEATURES):
        ...     pass
    """
    import tensoropt.executor.ops.local_ops as local_ops
    import tensoropt.executor.program.graph_simplify as graph_simplify
    import tensoropt.executor.program.lowering as lowering
    import tensoropt.executor.program.replay as replay
    import tensoropt.executor.state.local_optim as local_optim

    saved = (lowering.hoist_collectives, lowering.sink_waits, lowering.reinplace_collectives,
             local_optim.fusable, local_ops._GlobalMean.forward, replay.simplify)
    saved_cnnfast = (replay.direct_calls, graph_simplify.drop_unread, lowering.reported_loss)
    if "hoist" not in on:
        lowering.hoist_collectives = lowering.sink_waits = lambda gm: 0
        local_ops._GlobalMean.forward = staticmethod(_stacked_global_mean)
    if "reinplace" not in on:
        lowering.reinplace_collectives = lambda gm: 0
    if "fused" not in on:
        local_optim.fusable = lambda *args: False
    if "simplify" not in on:
        replay.simplify = lambda gm: {}
    if "direct" not in on:
        replay.direct_calls = lambda gm: gm
    if "unread" not in on:
        graph_simplify.drop_unread = lambda gm: 0
    if "lossread" not in on:
        lowering.reported_loss = _loss_as_traced
    try:
        yield
    finally:
        replay.direct_calls, graph_simplify.drop_unread, lowering.reported_loss = saved_cnnfast
        (lowering.hoist_collectives, lowering.sink_waits, lowering.reinplace_collectives,
         local_optim.fusable, forward, replay.simplify) = saved
        local_ops._GlobalMean.forward = staticmethod(forward)


def worker(options: dict) -> None:
    """torchrun entry: every variant of every model's DP plan and DDP, step by step; rank 0 writes JSON."""
    import torch.distributed as dist
    from executor_vs_ddp import _ddp_step
    from runtime import spec_of
    from torch.nn.parallel import DistributedDataParallel

    from tensoropt.executor.job.data import synthetic_batch
    from tensoropt.executor.job.plan import ExecPlan
    from tensoropt.executor.state.worker import end_process_group, init_process_group
    from tensoropt.training.trainer import Trainer

    torch.set_num_threads(1)
    init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    variants = options["variants"]
    out = {}
    for name, plan in options["plans"].items():
        spec = dataclasses.replace(spec_of(name, options["steps"]),
                                   batch_norm=options.get("batch_norm", "synchronized"))
        trainers = {}
        for v in variants:
            with features(VARIANTS[v]):
                trainers[v] = Trainer(spec, ExecPlan.from_json(plan), mode="replay")
                trainers[v].train(2, start_step=0)
        model = DistributedDataParallel(spec.build_model())
        opt = spec.make_optimizer(list(model.parameters()))
        for step in range(2):
            _ddp_step(model, opt, synthetic_batch(list(spec.inputs), spec.global_batch_size, spec.seed, step),
                      rank, world)
        wall = {k: [] for k in [*variants, "ddp"]}
        cpu = {k: [] for k in [*variants, "ddp"]}
        losses = {k: [] for k in variants}
        systems = [*variants, "ddp"]
        for i in range(options["steps"]):
            for system in (systems if i % 2 == 0 else systems[::-1]):
                step = 2 + i
                if system == "ddp":
                    batch = synthetic_batch(list(spec.inputs), spec.global_batch_size, spec.seed, step)
                    dist.barrier()
                    start = time.thread_time()
                    wall["ddp"].append(_ddp_step(model, opt, batch, rank, world))
                else:
                    dist.barrier()
                    with features(VARIANTS[system]):
                        start = time.thread_time()  # includes this rank's batch rows (~0.5 ms)
                        loss, time_s, _ = trainers[system].step(step, measure_memory=False)
                    wall[system].append(time_s)
                    losses[system].append(loss)
                cpu[system].append(time.thread_time() - start)
        row = {"wall_ms": {k: statistics.median(v) * 1e3 for k, v in wall.items()},
               "cpu_ms": {k: statistics.median(v) * 1e3 for k, v in cpu.items()},
               "nodes": trainers[variants[-1]].runtime_info().get("nodes")}
        first = variants[0]
        ref = trainers[first].full_params()
        row["reference"] = first
        row["param_diff_vs_old"] = {}
        row["loss_diff_vs_old"] = {}
        for v, trainer in trainers.items():
            params = trainer.full_params()
            row["param_diff_vs_old"][v] = max(float((params[k] - ref[k]).abs().max()) for k in ref)
            row["loss_diff_vs_old"][v] = max(abs(a - b) for a, b in zip(losses[v], losses[first]))
        out[name] = row
        trainers.clear()
        del model, opt
    if rank == 0:
        Path(options["out"]).write_text(json.dumps(out))
    dist.barrier()
    end_process_group()


def main(argv: list[str] | None = None) -> int:
    """Plan each model's DP plan, run the launch, print wall and CPU ms per system and the ratios."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt,hf-gpt2,hf-bert,hf-llama")
    parser.add_argument("--steps", type=int, default=12, help="measured steps per system")
    parser.add_argument("--variants", default="old,new,fused,reinplace,hoist",
                        help=f"of {', '.join(VARIANTS)}")
    parser.add_argument("--batch-norm", choices=("synchronized", "local"), default="synchronized",
                        help="training.batch_norm of the plans (the CNN's; 'local': as plain DDP)")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from runtime import MODELS, plan_model
    from worker_launch import launch_workers

    names = [m for m in args.models.split(",") if m]
    variants = [v for v in args.variants.split(",") if v]
    bad = sorted(set(names) - set(MODELS)) + sorted(set(variants) - set(VARIANTS))
    if bad:
        parser.error(f"unknown model or variant {bad}; models: {', '.join(MODELS)}; "
                     f"variants: {', '.join(VARIANTS)}")
    plans = {n: plan_model(n, "cpu-local", "roofline")["dp"] for n in names}  # DP: the same for any compute
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        got = launch_workers(__file__, {"plans": plans, "steps": args.steps, "variants": variants,
                                        "batch_norm": args.batch_norm}, Path(tmp),
                             env={"OMP_NUM_THREADS": "1"})
    load_after = os.getloadavg()
    systems = [*variants, "ddp"]
    print(f"\n{'model':9} {'time':5} " + " ".join(f"{s:>9}" for s in systems) + "   " +
          " ".join(f"{s + '/ddp':>13}" for s in variants))
    for name, row in got.items():
        for kind in ("wall_ms", "cpu_ms"):
            ms = row[kind]
            print(f"{name:9} {kind[:-3]:5} " + " ".join(f"{ms[s]:9.2f}" for s in systems) + "   " +
                  " ".join(f"{ms[s] / ms['ddp']:13.3f}" for s in variants))
        if "param_diff_vs_old" in row:
            params = ", ".join(f"{v} {d:.1e}" for v, d in row["param_diff_vs_old"].items())
            losses = ", ".join(f"{v} {d:.1e}" for v, d in row["loss_diff_vs_old"].items())
            reference = row.get("reference", "old")
            print(f"{'':15} vs {reference}: max |param diff| {params}; max |loss diff| {losses}")
    print(f"load average (1, 5, 15 min) before {' '.join(f'{x:.2f}' for x in load_before)}, after "
          f"{' '.join(f'{x:.2f}' for x in load_after)}; medians of {args.steps} steps per system")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": got, "load_before": load_before,
                                               "load_after": load_after, "steps": args.steps}, indent=2))
    return 0


if __name__ == "__main__":
    from worker_launch import run_worker_if_asked

    run_worker_if_asked(worker)
    sys.exit(main())
