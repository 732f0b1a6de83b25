"""Measured step time and peak memory per stage of a frontier's pipelined plans against the prediction.

    python benchmarks/pipeline_step.py JOB.yaml FRONTIER.json [--nproc 2] [--steps 8] [--eager] [--memory]
        [--compute] [--compiled]
    python benchmarks/pipeline_step.py JOB.yaml --stages 2 --schedules 1F1B --micro-batches 2 4 8 ...

Without FRONTIER.json, the fastest plan of each (``--stages``, schedule, m) pipelined frontier is
planned here (:func:`tensoropt.pipeline_candidate.candidate_plans`: every m, not only those on the
merged frontier).

Every plan of FRONTIER.json whose ``"pipeline"`` is set, for ``--nproc`` devices, is trained by the
pipelined runtime (tensoropt.pipeline_runtime: each stage's forward and backward replayed as traced
programs) in one launch, the plans built together and stepped in turn (step 0 of each plan, then
step 1...: the ratios under the same load); with ``--eager`` each plan also runs with eager stages
in the same rotation. The time table gives each plan's schedule, micro-batches, predicted bubble,
predicted step and the median measured step (the first step, which traces the stages, left out),
their ratio, and the per-micro-batch schedule overhead that would close the gap,
``(measured - predicted) / (m + p - 1)`` plus the device's ``pipeline_microbatch_s`` the plans
were priced with (:func:`estimators.pipeline.schedule_overhead_s`; the median of the column is what
``configs/devices/<device>.yaml`` takes).

``--compiled``: each plan also runs with its stages' programs compiled by Inductor
(``executor.compile: inductor``) in the same rotation; the table adds its median step, its ratio to
the uncompiled replay, the stages' compile time (the slowest rank's Inductor seconds, paid on the
first step) and both runs' median CPU seconds per step (the slowest rank's, every thread of the
process). Inductor's cache is this process's ``TORCHINDUCTOR_CACHE_DIR`` (a fresh one gives the cold
compile time).

``--compute``: after each timed step every rank also runs its stage's forward and backward of the
step's micro-batches back to back, without the schedule (the worker's ``compute_reference``), timed
under the same load. The second table then checks the step formula with those measured stage times
``c_s`` (per micro-batch) in place of the predicted ones: ``(m - 1) max c_s + sum c_s`` against the
measured step (the residual per micro-batch slot ``(measured - formula) / (m + p - 1)`` is what the
schedule itself adds: its exchanges and bookkeeping), and gives the load factor (measured over
predicted stage compute) and the prediction scaled by it, with and without the
``pipeline_microbatch_s`` term (``o``).

``--memory``: one more launch per plan (peak memory mixes when runs share a process), 3 steps each;
the table gives each stage's predicted memory (``pipeline_detail.stages[s].memory_bytes``) against
the measured peak of its first rank (the resident set's high-water mark above its level before the
stage was built, :class:`tensoropt.executor.state.peak_memory.PeakMemory`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path


def _launch(runs: list[dict], nproc: int, tmp: Path, name: str, interleave: bool) -> list[dict]:
    from tensoropt.launch import LaunchOptions, launch_module

    path = tmp / f"{name}.json"
    path.write_text(json.dumps({"runs": runs, "timeout_s": 300, "interleave": interleave}))
    rc = launch_module("tensoropt.pipeline_runtime.worker", [str(path)], LaunchOptions(nproc, timeout_s=1500))
    if rc != 0:
        raise SystemExit(f"the workers failed (exit code {rc})")
    return [json.loads(Path(r["metrics"]).read_text()) for r in runs]


def main() -> None:
    from estimators.profiles import load_cluster
    from tensoropt.config import load_job
    from tensoropt.executor.job.spec import TrainSpec
    from tensoropt.plans import plan_file_text

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job")
    parser.add_argument("frontier", nargs="?")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--schedules", nargs="+", default=["1F1B"])
    parser.add_argument("--micro-batches", nargs="+", type=int, default=[2, 4, 8])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--eager", action="store_true", help="also run each plan with eager stages")
    parser.add_argument("--memory", action="store_true", help="measure each stage's peak (a launch per plan)")
    parser.add_argument("--compiled", action="store_true",
                        help="also run each plan with its stages compiled by Inductor")
    parser.add_argument("--compute", action="store_true",
                        help="also time each stage's compute without the schedule, under the same load")
    args = parser.parse_args()
    job = load_job(args.job)
    spec = TrainSpec.from_job(job, steps=args.steps)
    cluster = load_cluster(job.cluster)
    overhead_s = cluster.device.pipeline_microbatch_s
    if args.frontier:
        frontier = json.loads(Path(args.frontier).read_text())
        plans = [json.loads(plan_file_text(frontier, p["id"])) for f in frontier["frontiers"]
                 if f["devices"] == args.nproc for p in f["plans"] if p.get("pipeline")]
    else:
        from tensoropt.pipeline_candidate import candidate_plans

        plans = [candidate_plans(job, args.nproc, args.stages, s, m)[0].to_json()
                 for s in args.schedules for m in args.micro_batches
                 if not (s == "1F1B" and m < args.stages)]
    if not plans:
        raise SystemExit(f"{args.frontier}: no pipelined plan for {args.nproc} devices")
    modes = ["replay"] + (["inductor"] if args.compiled else []) + (["eager"] if args.eager else [])
    with tempfile.TemporaryDirectory(prefix="pipeline-step-") as tmp:
        tmp = Path(tmp)
        runs = [{"spec": spec.to_json(), "plan": p, "steps": args.steps, "replay": mode != "eager",
                 "compile": "inductor" if mode == "inductor" else "none",
                 "compute_reference": args.compute and mode == "replay",
                 "metrics": str(tmp / f"{p['id']}-{mode}.json")}
                for p in plans for mode in modes]
        timed = _launch(runs, args.nproc, tmp, "time", interleave=True)
        memory = []
        if args.memory:
            for p in plans:
                run = {"spec": spec.to_json(), "plan": p, "steps": 3,
                       "metrics": str(tmp / f"{p['id']}-mem.json")}
                memory += _launch([run], args.nproc, tmp, f"mem-{p['id']}", interleave=False)
    print(f"device {cluster.device.name}: pipeline_microbatch_s {1e3 * overhead_s:.3f} ms "
          "(what the plans were priced with)")
    header = (f"{'plan':8} {'schedule':8} {'m':>3} {'bubble':>7} {'predicted':>10} {'replayed':>10} "
              f"{'ratio':>6}")
    compiled_header = (f" {'compiled':>10} {'/replay':>7} {'compile s':>9} {'CPU replay':>10} "
                       f"{'CPU compiled':>12}")
    print(header + (compiled_header if args.compiled else "")
          + (f" {'eager':>10} {'ratio':>6}" if args.eager else "") + f" {'fit o (ms)':>10}")
    fits = []
    for i, p in enumerate(plans):
        pipe, detail = p["pipeline"], p.get("pipeline_detail") or {}
        predicted = p["time_s"]
        by_mode = dict(zip(modes, timed[i * len(modes):(i + 1) * len(modes)]))
        replayed = by_mode["replay"]["measured"]["time_s"]
        line = (f"{p['id']:8} {pipe['schedule']:8} {pipe['micro_batches']:>3} "
                f"{100 * detail.get('bubble_fraction', 0):>6.0f}% {1e3 * predicted:>8.2f}ms "
                f"{1e3 * replayed:>8.2f}ms {replayed / predicted:>6.2f}")
        if args.compiled:
            compiled = by_mode["inductor"]["measured"]["time_s"]
            compile_s = max(r["compile_s"] for r in by_mode["inductor"]["measured"]["ranks"])
            line += (f" {1e3 * compiled:>8.2f}ms {compiled / replayed:>7.2f} {compile_s:>9.1f} "
                     f"{1e3 * _cpu_per_step(by_mode['replay']):>8.2f}ms "
                     f"{1e3 * _cpu_per_step(by_mode['inductor']):>10.2f}ms")
        if args.eager:
            eager = by_mode["eager"]["measured"]["time_s"]
            line += f" {1e3 * eager:>8.2f}ms {eager / predicted:>6.2f}"
        slots = pipe["micro_batches"] + pipe["stages"] - 1
        fit = (replayed - predicted) / slots + overhead_s
        fits.append(fit)
        print(line + f" {1e3 * fit:>10.3f}")
    print(f"median fit of pipeline_microbatch_s: {1e3 * statistics.median(fits):.3f} ms")
    if args.compute:
        print()
        _compute_table(plans, [timed[i * len(modes)] for i in range(len(plans))], overhead_s)
    if memory:
        print()
        print(f"{'plan':8} {'stage':>5} {'in flight':>9} {'predicted':>12} {'measured':>12} {'ratio':>6}")
        for p, m in zip(plans, memory):
            stages = (p.get("pipeline_detail") or {}).get("stages", [])
            ranks = {r["stage"]: r for r in sorted(m["measured"]["ranks"], key=lambda r: -r["rank"])}
            for st in stages:
                measured = ranks[st["stage"]]["peak_bytes"]
                print(f"{p['id']:8} {st['stage']:>5} {st['in_flight']:>9} "
                      f"{st['memory_bytes'] / 2**20:>10.2f}Mi {measured / 2**20:>10.2f}Mi "
                      f"{measured / st['memory_bytes']:>6.2f}")


def _cpu_per_step(metrics: dict) -> float:
    """The slowest rank's median CPU seconds per timed step (the first, which traces, left out)."""
    return max(statistics.median(r["step_cpu_times_s"][1:] or r["step_cpu_times_s"])
               for r in metrics["measured"]["ranks"])


def _compute_table(plans: list[dict], timed: list[dict], overhead_s: float) -> None:
    """The step formula with each stage's measured compute (see ``--compute``)."""
    print(f"{'plan':8} {'m':>3} {'c_s pred (ms)':>16} {'c_s meas (ms)':>16} {'load':>5} "
          f"{'formula(c meas)':>15} {'measured':>9} {'residual/slot':>13} {'pred x load':>11} {'ratio':>6} "
          f"{'o=0 x load':>10} {'ratio':>6}")
    for p, t in zip(plans, timed):
        pipe, detail = p["pipeline"], p.get("pipeline_detail") or {}
        m, stages = pipe["micro_batches"], pipe["stages"]
        ranks = {}
        for r in sorted(t["measured"]["ranks"], key=lambda r: -r["rank"]):
            ranks[r["stage"]] = r
        pred = [st["time_s"] - overhead_s for st in detail["stages"]]
        meas = [statistics.median(ranks[st["stage"]]["compute_times_s"][1:]) / m for st in detail["stages"]]
        load = sum(meas) / sum(pred)
        delta = max(st["step_s"] for st in detail["stages"])
        formula = (m - 1) * max(meas) + sum(meas) + delta * load
        measured = t["measured"]["time_s"]
        residual = (measured - formula) / (m + stages - 1)
        scaled = p["time_s"] * load
        bare = (p["time_s"] - (m + stages - 1) * overhead_s) * load  # the prediction without the o term
        print(f"{p['id']:8} {m:>3} {'/'.join(f'{1e3 * c:.1f}' for c in pred):>16} "
              f"{'/'.join(f'{1e3 * c:.1f}' for c in meas):>16} {load:>5.2f} {1e3 * formula:>13.1f}ms "
              f"{1e3 * measured:>7.1f}ms {1e3 * residual:>11.2f}ms {1e3 * scaled:>9.1f}ms "
              f"{measured / scaled:>6.2f} {1e3 * bare:>8.1f}ms {measured / bare:>6.2f}")


if __name__ == "__main__":
    main()
