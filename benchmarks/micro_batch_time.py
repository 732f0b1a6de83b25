"""Planned accumulation's step time (issue 25): the m-micro-batch plan's step against the 1-micro-batch
plan's, predicted and measured, term by term.

Per case (a job) and device count, the job is planned once per micro-batch count (``--counts``,
default 1, 2, 4; ``training.micro_batches`` set to each); of each count's frontier the plan of one
split (the leanest 1-micro-batch plan's placements, :func:`micro_batch_peak.choose`) is priced term by
term on its count's cost graph (:func:`priced_terms`: kernels, the executor's host overhead per
operator, the communication inside operators and the redistributions, all per micro-batch; the
optimizer step and the deferred gradient synchronisation, once per step) and run. One launch of
``--nproc`` processes (one thread each) trains every plan of every case in interleaved rounds
(rotated order, reversed every other round; ``--steps`` steps per plan per round after two warm-up
steps); each step's wall time (``time.perf_counter``) and the process's CPU time
(``time.process_time``) are recorded, the medians over all rounds are the measured step. On one
process nothing communicates, so the CPU time is the step's work whatever the machine's load;
on two the wall time also holds the waits at collectives (both are printed, with the load).

``--ops``: also, per plan, ``torch.profiler``'s self CPU time per operator class of 3 steps on rank 0
(forward, backward and optimizer; :func:`fidelity.op_class`) and the number of aten calls per step,
beside the priced classes.

Cases:

* ``gpt``: the zoo GPT of ``benchmarks/micro_batch_peak.py`` (2 layers x 128, 4 heads, sequence 128,
  vocabulary 512, global batch 32, AdamW, cpu-local);
* ``hf-gpt2``: HF ``GPT2LMHeadModel`` from a small config (2 layers x 256, 4 heads, sequence 128,
  vocabulary 2048, global batch 16, AdamW, cpu-local; ``benchmarks/fidelity.py``'s decoder).

Usage::

    .venv/bin/python benchmarks/micro_batch_time.py [--case gpt --case hf-gpt2] [--nproc 1|2]
        [--counts 1,2,4] [--steps 3] [--rounds 4] [--compute roofline|profiled] [--ops] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from micro_batch_peak import JOBS, choose  # noqa: E402
from micro_batch_peak import _labels as split_of  # noqa: E402
from worker_launch import run_worker_if_asked  # noqa: E402

CASES = {
    "gpt": JOBS["gpt"],
    "hf-gpt2": {"model": {"factory": "tensoropt.models.hf:gpt2",
                          "kwargs": {"n_layer": 2, "n_embd": 256, "n_head": 4, "n_positions": 128,
                                     "vocab_size": 2048, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
                                     "attn_pdrop": 0.0},
                          "inputs": {"input_ids": {"shape": [128], "dtype": "int64", "high": 2048},
                                     "labels": {"shape": [128], "dtype": "int64", "high": 2048}},
                          "loss": "model"},
                "training": {"global_batch_size": 16, "optimizer": "adamw", "learning_rate": 1e-3,
                             "steps": 4},
                "cluster": "cpu-local", "devices": [2], "planner": {"epsilon": 0}},
}
"""The jobs (``devices`` and ``training.micro_batches`` are set per run)."""


def job_of(case: str, micro_batches: int, devices: int, compute: str):
    """The :class:`~tensoropt.config.Job` of ``case`` for one count and device count.

    Example:
        >>> job_of("gpt", 4, 2, "roofline").training.micro_batches
        4
    """
    from tensoropt.config import Job

    data = json.loads(json.dumps(CASES[case]))
    data["training"]["micro_batches"] = micro_batches
    data["devices"] = [devices]
    data.setdefault("planner", {})["compute"] = compute
    return Job.from_dict(data, case)


def planned(case: str, counts: list[int], devices: int, compute: str) -> dict[int, tuple]:
    """Count -> (job, its frontier.json content).

    Example:
        >>> got = planned("gpt", [1, 4], 2, "roofline")  # doctest: +SKIP
        >>> got[4][1]["frontiers"][0]["plans"][0]["micro_batches"]  # doctest: +SKIP
        4
    """
    from tensoropt.planner import plan_job

    out = {}
    for m in counts:
        job = job_of(case, m, devices, compute)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out[m] = (job, plan_job(job).to_json())
    return out


def common_split(frontiers: dict[int, dict]) -> dict[int, dict]:
    """Count -> the plan (plan.json content) of one split on every count's frontier: the leanest
    1-micro-batch plan's split where every frontier has it, else the next leanest that every one has
    (:func:`micro_batch_peak.choose` picks each count's plan of that split).

    Example:
        >>> got = planned("gpt", [1, 4], 2, "roofline")  # doctest: +SKIP
        >>> common_split({m: f for m, (_, f) in got.items()})[4]["id"]  # doctest: +SKIP
        'd2-p10'
    """
    from tensoropt.plans import plan_file_text

    docs = {m: [json.loads(plan_file_text(f, p["id"])) for p in f["frontiers"][0]["plans"]]
            for m, f in frontiers.items()}
    for plan in sorted(docs[1], key=lambda d: d["memory_bytes"]):
        if all(any(split_of(d) == split_of(plan) for d in plans) for plans in docs.values()):
            return choose(frontiers, plan["id"])
    raise SystemExit("no split is on every count's frontier")


def priced_terms(job, micro_batches: int, devices: int, placements: dict) -> dict[str, float]:
    """The predicted step of a plan (``placements``: node -> label) term by term, in seconds per step
    (:func:`tensoropt.accumulation.step_terms` on the count's cost graph).

    Example:
        >>> # not run here: captures and prices a model (see main)
        >>> priced_terms(job, 4, 2, labels)["overhead"]  # doctest: +SKIP
        0.00108
    """
    from estimators.breakdown import configuration_index
    from tensoropt.accumulation import step_terms
    from tensoropt.planner import (
        build_job_model,
        capture_job,
        job_cost_graph,
        load_job_cluster,
        micro_batch_job,
        resolve_job,
    )

    cluster = load_job_cluster(job)
    model, spec = build_job_model(job, "meta")
    job = resolve_job(job, spec, cluster)
    sub = micro_batch_job(job, micro_batches)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = capture_job(sub, (model, spec))
        G = job_cost_graph(graph, sub, cluster, devices)
    a = {n: configuration_index(G, n, placements[n]) for n in G.nodes}
    return step_terms(G, graph.nx, a, micro_batches, cluster.device)


def run_delay_s() -> float:
    """Seconds the calling thread has waited runnable for a core (``/proc/thread-self/schedstat``'s
    second field: the time the machine's load took from it); 0 where the kernel does not say.

    Example:
        >>> run_delay_s() >= 0.0
        True
    """
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def worker(options: dict) -> None:
    """torchrun entry: every plan in interleaved rounds; rank 0 writes per-step wall and CPU times."""
    import torch
    import torch.distributed as dist

    from tensoropt.executor.job.plan import ExecPlan
    from tensoropt.executor.job.spec import TrainSpec
    from tensoropt.executor.state.worker import end_process_group, init_process_group
    from tensoropt.training.trainer import Trainer

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        init_process_group()
    rank = dist.get_rank() if distributed else 0
    barrier = dist.barrier if distributed else (lambda: None)
    torch.set_num_threads(1)
    systems = []
    for key, run in options["runs"].items():
        trainer = Trainer(TrainSpec.from_json(run["spec"]), ExecPlan.from_json(run["plan"]),
                          micro_batches=int(run["plan"].get("micro_batches", 1)))
        trainer.train(2, start_step=0)  # warm-up: traces the program(s), creates the optimizer state
        systems.append((key, trainer))
    wall: dict[str, list] = {k: [] for k, _ in systems}
    cpu: dict[str, list] = {k: [] for k, _ in systems}
    delay: dict[str, list] = {k: [] for k, _ in systems}
    thread: dict[str, list] = {k: [] for k, _ in systems}
    steps, step_no = options["steps"], 100
    for r in range(options["rounds"]):
        order = systems[r % len(systems):] + systems[:r % len(systems)]
        for key, trainer in (order[::-1] if r % 2 else order):
            barrier()
            for _ in range(steps):
                d0, t0, c0 = run_delay_s(), time.thread_time(), time.process_time()
                w0 = time.perf_counter()
                trainer.step(step_no, measure_memory=False)
                wall[key].append(time.perf_counter() - w0)
                cpu[key].append(time.process_time() - c0)
                thread[key].append(time.thread_time() - t0)
                delay[key].append(run_delay_s() - d0)
                step_no += 1
    ops = {}
    if options.get("ops"):
        from fidelity import op_class
        from torch.profiler import ProfilerActivity, profile

        for key, trainer in systems:
            barrier()
            n = 3
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for i in range(n):
                    trainer.step(1000 + i, measure_memory=False)
            table: dict[str, float] = {"aten calls": 0.0}
            for e in prof.key_averages():
                if e.key.startswith(("aten::", "c10d::", "_c10d_functional::", "gloo:")):
                    cls = op_class(e.key)
                    table[cls] = table.get(cls, 0.0) + e.self_cpu_time_total / 1e6 / n
                    if e.key.startswith("aten::"):
                        table["aten calls"] += e.count / n
                    elif cls == "collective":
                        table["collective calls"] = table.get("collective calls", 0.0) + e.count / n
            ops[key] = table
    if rank == 0:
        figures = {"wall": wall, "cpu": cpu, "thread": thread, "delay": delay, "ops": ops}
        Path(options["out"]).write_text(json.dumps(figures))
    barrier()
    if distributed:
        end_process_group()


def _launch(options: dict, nproc: int) -> dict:
    from worker_launch import launch_workers

    with tempfile.TemporaryDirectory(prefix="micro-batch-time-") as tmp:
        return launch_workers(__file__, options, Path(tmp), nproc=nproc, timeout_s=3000)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES))
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--counts", default="1,2,4")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--compute", choices=("roofline", "profiled"), default="roofline")
    parser.add_argument("--split-compute", choices=("roofline", "profiled"), default=None,
                        help="the compute mode whose frontiers pick the split (default: --compute)")
    parser.add_argument("--ops", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from tensoropt.executor.job.spec import TrainSpec

    counts = [int(c) for c in args.counts.split(",")]
    runs, rows = {}, []
    for case in args.case or ["gpt"]:
        got = planned(case, counts, args.nproc, args.split_compute or args.compute)
        chosen = common_split({m: f for m, (_, f) in got.items()})
        for m in counts:
            job, plan = job_of(case, m, args.nproc, args.compute), chosen[m]
            labels = {k: v["label"] for k, v in plan["placements"].items()}
            terms = priced_terms(job, m, args.nproc, labels)
            key = f"{case}/m={m}"
            runs[key] = {"spec": TrainSpec.from_job(job).to_json(), "plan": plan}
            rows.append({"key": key, "case": case, "m": m, "plan": plan["id"], "predicted_s": terms["total"],
                         "terms": terms, "summary": plan.get("summary")})
            if args.compute != "roofline":  # the roofline's figure beside it
                rows[-1]["roofline_s"] = priced_terms(job_of(case, m, args.nproc, "roofline"), m, args.nproc,
                                                      labels)["total"]
                print(f"{key}: roofline {rows[-1]['roofline_s'] * 1e3:.1f} ms")
            print(f"{key}: plan {plan['id']} ({plan.get('summary')}) predicted "
                  f"{terms['total'] * 1e3:.1f} ms: "
                  + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in terms.items() if k != "total"), flush=True)
    load_before = os.getloadavg()
    res = _launch({"runs": runs, "steps": args.steps, "rounds": args.rounds, "ops": args.ops}, args.nproc)
    load_after = os.getloadavg()
    from tensoropt.tables import format_table

    table = []
    for r in rows:
        for k in ("wall", "cpu", "thread", "delay"):
            r[f"{k}_s"] = statistics.median(res[k][r["key"]])
        r["blocked_s"] = statistics.median(w - t - d for w, t, d in zip(
            res["wall"][r["key"]], res["thread"][r["key"]], res["delay"][r["key"]]))
        r["ops"] = res["ops"].get(r["key"])
    columns = ("predicted_s", "wall_s", "cpu_s", "thread_s", "delay_s", "blocked_s")
    for r in rows:
        one = next(x for x in rows if x["case"] == r["case"] and x["m"] == counts[0])
        r["ratios"] = {k: r[k] / one[k] if one[k] else None for k in columns}
        comm = r["terms"]["comm"] + r["terms"]["redistribution"] + r["terms"]["grad_sync"]
        table.append([r["key"], r["plan"], *(f"{r[k] * 1e3:.1f}" for k in columns), f"{comm * 1e3:.1f}",
                      *(f"{r['ratios'][k]:.2f}" for k in ("predicted_s", "wall_s", "cpu_s"))])
    one = f"m={counts[0]}"
    print(format_table(["plan", "id", "predicted ms", "wall ms", "process CPU ms", "main thread CPU ms",
                        "main run delay ms", "main blocked ms", "predicted comm ms", f"predicted / {one}",
                        f"wall / {one}", f"CPU / {one}"], table, right=list(range(2, 12))))
    if args.ops:
        for r in rows:
            if r["ops"]:
                print(f"{r['key']}: profiled ms per step (rank 0, self CPU): "
                      + ", ".join(f"{k} {v * 1e3:.1f}" if "calls" not in k else f"{k} {v:.0f}"
                                  for k, v in sorted(r["ops"].items(), key=lambda kv: -kv[1])))
    print(f"{args.nproc} process(es), {args.rounds} rounds x {args.steps} steps, compute {args.compute}; "
          f"load average before {' '.join(f'{x:.2f}' for x in load_before)}, "
          f"after {' '.join(f'{x:.2f}' for x in load_after)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "load_before": load_before,
                                               "load_after": load_after, "nproc": args.nproc,
                                               "compute": args.compute}, indent=1))
    return 0


if __name__ == "__main__":
    run_worker_if_asked(worker)
    raise SystemExit(main())
