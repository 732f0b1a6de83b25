"""A step through ``tensoropt.parallelize`` against the same plan's step under ``tensoropt run``.

For each (job, plan kind) case, one torchrun launch of 2 gloo processes (one thread each) builds
the plan's :class:`~tensoropt.training.trainer.Trainer` (``tensoropt run``'s runtime: AdamW, the
replayed program) and a parallel model of the same job model built on meta
(``tensoropt.parallelize``, a stock ``torch.optim.AdamW`` over ``pm.parameters()``), and runs them
step by step, interleaved (the order reversed every other step), ``--steps`` steps each after 2
warm-up steps (the traces). One API step is ``pm.train_step(batch)`` (the loss read included),
``opt.step()``, ``opt.zero_grad()``; one run step is the time ``Trainer.step`` reports (the program,
the optimizer step, the gradients dropped; the loss read after its clock stops). Printed: the median
wall time and the median main-thread CPU time (``time.thread_time``: the work on this thread, no
waiting for the other rank) of each, and their ratios (issue 24's target: API <= 1.03 x run).
Since ``tensoropt run``'s loop trains through ``tensoropt.parallelize`` itself, both sides run one
code path; what differs is the batch (the run reads only this rank's region) and the timing wrapper.

Usage: ``.venv/bin/python benchmarks/api_overhead.py [--cases hf-gpt2:model_parallel,...] [--steps 20]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "parallel"))
from worker_launch import launch_workers, run_worker_if_asked  # noqa: E402

CASES = ("hf-gpt2:model_parallel", "hf-llama:model_parallel", "hf-gpt2:batch")
BATCH = 8


def interleaved(doc: dict, steps: int) -> dict:
    """Median wall and CPU seconds per step of the plan ``doc`` under the API and under the Trainer."""
    import torch.distributed as dist

    import tensoropt
    from tensoropt.executor.job.plan import ExecPlan
    from tensoropt.executor.job.spec import TrainSpec
    from tensoropt.models.registry import load_factory
    from tensoropt.training.trainer import Trainer

    spec = TrainSpec.from_job(doc["job"])
    trainer = Trainer(spec, ExecPlan.from_json(doc))
    with torch.device("meta"):
        model = load_factory(doc["job"]["model"]["factory"])(**doc["job"]["model"]["kwargs"])
    pm = tensoropt.parallelize(model, doc)
    opt = torch.optim.AdamW(pm.parameters(), lr=spec.lr)
    source = spec.batch_source()
    whole = [tuple((0, n) for n in (spec.global_batch_size, *s.shape)) for s in spec.inputs]
    batches = [dict(zip(pm.input_names, source.local(step, whole))) for step in range(steps + 2)]

    def api_step(step: int) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.thread_time()
        pm.train_step(batches[step])
        opt.step()
        opt.zero_grad()
        return time.perf_counter() - wall, time.thread_time() - cpu

    def run_step(step: int) -> tuple[float, float]:
        cpu = time.thread_time()
        _, time_s, _ = trainer.step(step, measure_memory=False)
        return time_s, time.thread_time() - cpu  # the cpu time includes making the batch

    times = {"api": [], "run": []}
    for step in range(steps + 2):
        order = (("api", api_step), ("run", run_step))
        for label, fn in (order if step % 2 else tuple(reversed(order))):
            dist.barrier()
            result = fn(step)
            if step >= 2:
                times[label].append(result)
    return {label: {"wall_s": statistics.median(t[0] for t in ts),
                    "cpu_s": statistics.median(t[1] for t in ts)} for label, ts in times.items()}


def worker(options: dict) -> None:
    """Rank side: interleave the two runtimes on each case's plan; rank 0 writes the figures."""
    import torch.distributed as dist

    import tensoropt

    tensoropt.init_distributed()
    out = {name: interleaved(json.loads(Path(path).read_text()), options["steps"])
           for name, path in options["plans"].items()}
    if dist.get_rank() == 0:
        Path(options["out"]).write_text(json.dumps(out))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="job:plan-kind, comma-separated")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    from loop_plans import pick_plan

    tmp = Path(tempfile.mkdtemp(prefix="api-overhead-"))
    plans = {}
    for case in args.cases.split(","):
        job, kind = case.split(":")
        path = tmp / f"{job}-{kind}.json"
        plan = pick_plan(job.removeprefix("hf-"), BATCH, kind)
        path.write_text(json.dumps(plan))
        plans[f"{case} ({plan['id']})"] = str(path)
    result = launch_workers(__file__, {"plans": plans, "steps": args.steps}, tmp, timeout_s=1800)
    print(f"{'case':<36} {'run ms':>8} {'API ms':>8} {'wall x':>7} {'run cpu':>8} {'API cpu':>8} "
          f"{'cpu x':>6}")
    for name, r in result.items():
        run, api = r["run"], r["api"]
        print(f"{name:<36} {run['wall_s'] * 1e3:8.2f} {api['wall_s'] * 1e3:8.2f} "
              f"{api['wall_s'] / run['wall_s']:7.3f} {run['cpu_s'] * 1e3:8.2f} {api['cpu_s'] * 1e3:8.2f} "
              f"{api['cpu_s'] / run['cpu_s']:6.3f}")
    return 0


run_worker_if_asked(worker)
if __name__ == "__main__":
    sys.exit(main())
