"""Batch norm under a batch split: the executor's two ``training.batch_norm`` modes against DDP's two.

For each model with batch norm (default: the CNN of ``benchmarks/runtime.py``: conv + BN + relu +
pool twice, then fc; 16 x 16 images, batch 32, AdamW) the planner prices the configurations at 2
devices of ``--cluster`` twice, once per mode, and one torchrun launch (2 gloo processes, one
thread each) runs in interleaved rounds (rotated order, the first step of each round left out):

* ``sync-dp`` / ``sync-fast``: the data-parallel / fastest plan with ``training.batch_norm:
  synchronized`` (statistics over the global batch: the model one process trains);
* ``local-dp`` / ``local-fast``: the same with ``local`` (per-rank statistics);
* ``ddp-syncbn``: ``DistributedDataParallel`` with synchronised batch norm. ``torch.nn.SyncBatchNorm``
  refuses CPU tensors (it runs on GPUs only), so on a CPU each BatchNorm runs
  :func:`tensoropt.executor.ops.batch_norm.synchronized_batch_norm` eagerly over the world group: the
  two collectives per layer of torch's SyncBatchNorm (its forward all-gathers [mean, invstd,
  count], ours all-reduces [sum, sum of squares]; both all-reduce [sum dy, sum dy*xhat] backward);
  on a GPU it is torch's SyncBatchNorm;
* ``ddp``: plain DDP (per-rank batch norm).

Printed: each system's median step time, the two ratios (synchronized DP / DDP with sync BN, local
DP / plain DDP), the predicted step times and their error, the load average before and after.

Usage (one command): ``TENSOROPT_CACHE=/tmp/cache .venv/bin/python benchmarks/batch_norm_runtime.py
[--models cnn] [--steps 6] [--rounds 4] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
MODES = ("synchronized", "local")


class CpuSyncBatchNorm(torch.nn.Module):
    """A BatchNorm module whose training statistics span the process group (SyncBatchNorm's semantics,
    on any device): :func:`tensoropt.executor.ops.batch_norm.synchronized_batch_norm` over the world group.

    Example:
        >>> bn = CpuSyncBatchNorm(torch.nn.BatchNorm2d(3)).eval()  # eval: the module's own path
        >>> tuple(bn(torch.randn(2, 3, 4, 4)).shape)
        (2, 3, 4, 4)
    """

    def __init__(self, bn: torch.nn.modules.batchnorm._BatchNorm):
        super().__init__()
        self.bn = bn

    def forward(self, x):
        import torch.distributed as dist

        from tensoropt.executor.ops.batch_norm import synchronized_batch_norm

        bn = self.bn
        if not self.training or not dist.is_initialized():
            return bn(x)
        if bn.num_batches_tracked is not None:
            bn.num_batches_tracked.add_(1)
        momentum = bn.momentum if bn.momentum is not None else 1.0 / float(bn.num_batches_tracked)
        count = x.numel() // x.shape[1] * dist.get_world_size()  # equal rows per rank
        return synchronized_batch_norm(x, bn.weight, bn.bias, bn.running_mean, bn.running_var, momentum,
                                       bn.eps, count, [dist.group.WORLD])


def with_sync_batch_norm(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` with every BatchNorm synchronised: torch's SyncBatchNorm on a GPU, else
    :class:`CpuSyncBatchNorm`.

    Example:
        >>> m = with_sync_batch_norm(torch.nn.Sequential(torch.nn.BatchNorm2d(3)))
        >>> type(m[0]).__name__
        'CpuSyncBatchNorm'
    """
    if torch.cuda.is_available():
        return torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)
    for name, child in module.named_children():
        if isinstance(child, torch.nn.modules.batchnorm._BatchNorm):
            setattr(module, name, CpuSyncBatchNorm(child))
        else:
            with_sync_batch_norm(child)
    return module


def worker(options: dict) -> None:
    """torchrun entry: every system of every model, interleaved rounds; rank 0 writes the step times."""
    import torch.distributed as dist
    from executor_vs_ddp import ddp_round_s
    from runtime import spec_of
    from torch.nn.parallel import DistributedDataParallel

    from tensoropt.executor.job.plan import ExecPlan
    from tensoropt.executor.state.worker import end_process_group, init_process_group
    from tensoropt.training.trainer import Trainer

    init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    steps, rounds = options["steps"], options["rounds"]
    systems, kept, errors, holders = [], {}, {}, []
    for name, by_mode in options["plans"].items():
        for mode in MODES:
            spec = dataclasses.replace(spec_of(name, steps), batch_norm=mode)
            for label in ("dp", "fast"):
                key = f"{name}/{mode[:5] if mode == 'local' else 'sync'}-{label}"
                try:
                    trainer = Trainer(spec, ExecPlan.from_json(by_mode[mode][label]))
                    trainer.train(2, start_step=0)  # warm-up: traces the program
                except Exception as err:  # noqa: BLE001 - reported; the other systems still run
                    errors[key] = f"{type(err).__name__}: {str(err)[:300]}"
                    continue

                def one_round(r, key=key, trainer=trainer):
                    res = trainer.train(steps, start_step=2 + r * steps)
                    kept.setdefault(key, []).extend(s["time_s"] for s in res.steps[1:])
                systems.append(one_round)
        spec = spec_of(name, steps)
        synced = lambda spec=spec: with_sync_batch_norm(spec.build_model())  # noqa: E731
        for key, build in ((f"{name}/ddp", spec.build_model), (f"{name}/ddp-syncbn", synced)):
            model = DistributedDataParallel(build())
            opt = spec.make_optimizer(list(model.parameters()))
            holders.append((model, opt))

            def ddp_round(r, key=key, spec=spec, model=model, opt=opt):
                times = ddp_round_s(spec, model, opt, 2 + r * steps, steps, rank, world)
                kept.setdefault(key, []).extend(times[1:])
            ddp_round_s(spec, model, opt, 2 - steps, steps, rank, world)  # warm-up (round -1)
            systems.append(ddp_round)
    for r in range(rounds):
        order = systems[r % len(systems):] + systems[:r % len(systems)]
        for one_round in (order[::-1] if r % 2 else order):
            dist.barrier()
            one_round(r)
    if rank == 0:
        Path(options["out"]).write_text(json.dumps({"times": kept, "errors": errors}))
    systems.clear()
    holders.clear()
    dist.barrier()
    end_process_group()


def main(argv: list[str] | None = None) -> int:
    """Plan each model in both modes, run the interleaved launch, print and optionally write the figures."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="cnn", help="comma-separated models of benchmarks/runtime.py")
    parser.add_argument("--steps", type=int, default=6, help="steps per system per round")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds")
    parser.add_argument("--cluster", default="cpu-local", help="cluster profile the plans are priced with")
    parser.add_argument("--compute", choices=("roofline", "profiled"), default="profiled")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    torch.set_num_threads(1)
    from runtime import _median_ms, plan_model
    from worker_launch import launch_workers

    start = time.perf_counter()
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    plans = {name: {mode: plan_model(name, args.cluster, args.compute, batch_norm=mode) for mode in MODES}
             for name in names}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        options = {"plans": plans, "steps": args.steps, "rounds": args.rounds}
        got = launch_workers(__file__, options, Path(tmp))
    load_after = os.getloadavg()
    t = {k: _median_ms(v) for k, v in got["times"].items()}
    rows = []
    for name in names:
        row = {"model": name,
               **{k.split("/", 1)[1] + "_ms": v for k, v in t.items() if k.startswith(name + "/")}}
        for mode, short in (("synchronized", "sync"), ("local", "local")):
            for label in ("dp", "fast"):
                row[f"{short}-{label}_predicted_ms"] = plans[name][mode][label]["time_s"] * 1e3
        nan = float("nan")
        row["sync_dp_over_ddp_syncbn"] = row.get("sync-dp_ms", nan) / row.get("ddp-syncbn_ms", nan)
        row["local_dp_over_ddp"] = row.get("local-dp_ms", nan) / row.get("ddp_ms", nan)
        rows.append(row)
        print(f"\n{name}: median step ms (predicted)")
        for system in ("ddp", "ddp-syncbn", "sync-dp", "sync-fast", "local-dp", "local-fast"):
            pred = row.get(f"{system}_predicted_ms")
            extra = f"  (predicted {pred:.1f}, error {abs(row[system + '_ms'] - pred) / pred:.0%})" \
                if pred and system + "_ms" in row else ""
            print(f"  {system:11} {row.get(system + '_ms', float('nan')):8.1f}{extra}")
        print(f"  synchronized DP / DDP+SyncBN {row['sync_dp_over_ddp_syncbn']:.2f}; local DP / plain DDP "
              f"{row['local_dp_over_ddp']:.2f}")
    for key, err in got["errors"].items():
        print(f"FAILED {key}: {err}")
    print(f"load average before {' '.join(f'{x:.2f}' for x in load_before)}, after "
          f"{' '.join(f'{x:.2f}' for x in load_after)}; {args.rounds} rounds x {args.steps} steps; "
          f"{time.perf_counter() - start:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "errors": got["errors"],
                                               "load_before": load_before, "load_after": load_after,
                                               "steps": args.steps,
                                               "rounds": args.rounds, "cluster": args.cluster,
                                               "compute": args.compute}, indent=2))
    return 0


if __name__ == "__main__":
    from worker_launch import run_worker_if_asked

    run_worker_if_asked(worker)
    sys.exit(main())
