"""Measured tensor peak of each pipeline stage against the planner's stage memory.

    python benchmarks/pipeline_memory.py JOB.yaml [--nproc 2] [--stages 2] [--schedules 1F1B GPipe]
        [--micro-batches 2 4 8] [--compile none inductor] [--data-parallel-stages] [--out table.json]
        [--trace DIR]

For every (schedule, m) asked, the pipelined frontier of ``--stages`` stages on ``--nproc``
devices is planned exactly as ``tensoropt plan`` does (:func:`tensoropt.pipeline.search.
pipelined_frontier` on the micro-batch's cost graph), its fastest and its leanest plans are kept,
and each is trained 3 steps by the pipelined runtime (one launch for all, the runs one after the
other; the second step of each measured under :class:`tensoropt.pipeline_runtime.stage_peak.
StepPeak`: every live tensor's storage, the receive buffers torch keeps included). The table gives,
per stage (its first replica), the in-flight micro-batches ``k``, the predicted memory
(``pipeline_detail.stages[s].memory_bytes``) split into state (parameters, gradients, optimizer)
and the rest, what the stage's forward program measured to save for backward per micro-batch
(``saved/mb``, against the predicted ``act/mb``), the measured tensor peak (above what was alive
before the run was built) and the phase of the schedule it was reached in, their ratio, the
tensors resident between steps, and the process's resident-set peak
(:class:`tensoropt.executor.state.peak_memory.PeakMemory`) beside it.

``--compile none inductor``: each plan runs with its stages' programs as traced and compiled by
Inductor (``executor.compile``). A compiled program allocates its buffers in its own code, which the
dispatch-mode peak does not see; the ``alloc`` columns read the same step from the CPU allocator's
events (:class:`tensoropt.pipeline_runtime.stage_peak.AllocationPeak`), the figure to set against
the prediction for compiled stages (and, uncompiled, a check of the two ways against each other).

``--trace DIR``: each rank's live set at its peak (``StepPeak(trace=True)``'s ``peak_live``: the
largest storages made during the measured step, each with its operator, shape, the schedule's
phase and, in backward, its autograd node) written to ``DIR/<plan>-stage<s>-rank<r>.txt`` (and
into ``--out``'s rows as ``peak_live``): what a stage holds at its peak beside the held state.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path


def pipelined_plans(job, nproc: int, stages: int, schedule: str, m: int, dp: bool = False) -> list[dict]:
    """The fastest and the leanest plan of the exact pipelined frontier of one (p, schedule, m)
    (:func:`tensoropt.pipeline_candidate.candidate_plans`), as plan entries."""
    from tensoropt.pipeline_candidate import candidate_plans

    found = candidate_plans(job, nproc, stages, schedule, m, data_parallel_stages=dp)
    return [p.to_json() for p in (found[:1] + found[1:][-1:])]


def main() -> None:
    from tensoropt.config import load_job
    from tensoropt.executor.job.spec import TrainSpec
    from tensoropt.launch import LaunchOptions, launch_module

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--schedules", nargs="+", default=["1F1B", "GPipe"])
    parser.add_argument("--micro-batches", nargs="+", type=int, default=[2, 4, 8])
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--compile", nargs="+", default=["none"], choices=["none", "inductor"],
                        help="run each plan with these executor.compile backends (one row set each)")
    parser.add_argument("--data-parallel-stages", action="store_true",
                        help="each stage's data-parallel plan (what the runtime runs on devices/p > 1)")
    parser.add_argument("--trace", metavar="DIR",
                        help="write each rank's live set at its peak to DIR/<plan>-stage<s>-rank<r>.txt")
    args = parser.parse_args()
    job = load_job(args.job)
    spec = TrainSpec.from_job(job, steps=3)
    plans = [plan for schedule in args.schedules for m in args.micro_batches
             if not (schedule == "1F1B" and m < args.stages)
             for plan in pipelined_plans(job, args.nproc, args.stages, schedule, m,
                                         args.data_parallel_stages)]
    with tempfile.TemporaryDirectory(prefix="pipeline-memory-") as tmp:
        tmp = Path(tmp)
        runs = [{"spec": spec.to_json(), "plan": p, "steps": 3, "tensor_peak": True, "compile": c,
                 "trace_peak": bool(args.trace), "metrics": str(tmp / f"{p['id']}-{c}.json")}
                for p in plans for c in args.compile]
        (tmp / "runs.json").write_text(json.dumps({"runs": runs, "timeout_s": 300}))
        rc = launch_module("tensoropt.pipeline_runtime.worker", [str(tmp / "runs.json")],
                           LaunchOptions(args.nproc, timeout_s=1800))
        if rc != 0:
            raise SystemExit(f"the workers failed (exit code {rc})")
        metrics = [json.loads(Path(r["metrics"]).read_text()) for r in runs]
    mi = 2**20
    print(f"{args.job}: {args.stages} stages on {args.nproc} processes; MiB; measured: tensor peak "
          "of step 2 above the level before the run was built")
    print(f"{'plan':16} {'compile':8} {'blocks':10} {'st':>2} {'k':>2} {'pred':>8} {'state':>7} "
          f"{'act/mb':>7} "
          f"{'bufs':>6} {'trans':>6} "
          f"{'saved/mb':>8} {'meas':>8} {'ratio':>6} {'phase':>8} {'alloc':>8} {'ratio':>6} {'phase':>8} "
          f"{'resid':>7} "
          f"{'recv':>6} {'RSS pk':>7}")
    rows = []
    for run, m in zip(runs, metrics):
        p = run["plan"]
        ranks = {}
        for r in sorted(m["measured"]["ranks"], key=lambda r: -r["rank"]):
            ranks[r["stage"]] = r
        for st in p["pipeline_detail"]["stages"]:
            r = ranks[st["stage"]]
            measured = r["peak_tensor_bytes"] - r["before_bytes"]
            allocated = r["allocated_peak_bytes"] - r["before_bytes"]
            state = st["state_bytes"]
            predicted = st["peak_bytes"]
            row = {"plan": p["id"], "compile": run["compile"], "blocks": st["blocks"], "stage": st["stage"],
                   "in_flight": st["in_flight"],
                   "predicted_bytes": predicted, "held_bytes": st["memory_bytes"], "state_bytes": state,
                   "activation_bytes": st["activation_bytes"], "buffer_bytes": st["buffer_bytes"],
                   "transient_bytes": st["transient_bytes"],
                   "measured_tensor_bytes": measured, "phase": r["phase"],
                   "allocated_tensor_bytes": allocated, "allocated_phase": r["allocated_phase"],
                   "compile_s": r["compile_s"], "saved_bytes": r["saved_bytes"],
                   "resident_tensor_bytes": r["resident_tensor_bytes"] - r["before_bytes"],
                   "resident_parts": r["resident_parts"], "peak_rss_bytes": r["peak_bytes"]}
            rows.append(row)
            print(f"{p['id']:16} {run['compile']:8} {str(st['blocks']):10} {st['stage']:>2} "
                  f"{st['in_flight']:>2} "
                  f"{predicted / mi:>8.2f} {state / mi:>7.2f} {st['activation_bytes'] / mi:>7.2f} "
                  f"{st['buffer_bytes'] / mi:>6.2f} {st['transient_bytes'] / mi:>6.2f} "
                  f"{r['saved_bytes'] / mi:>8.2f} "
                  f"{measured / mi:>8.2f} {measured / predicted:>6.3f} {r['phase']:>8} "
                  f"{allocated / mi:>8.2f} {allocated / predicted:>6.3f} {r['allocated_phase']:>8} "
                  f"{row['resident_tensor_bytes'] / mi:>7.2f} "
                  f"{r['resident_parts']['recv_buffer_bytes'] / mi:>6.2f} "
                  f"{r['peak_bytes'] / mi:>7.2f}")
    if args.trace:
        write_traces(Path(args.trace), runs, metrics, rows)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


def write_traces(out: Path, runs: list[dict], metrics: list[dict], rows: list[dict]) -> None:
    """Each rank's live set at its peak (``peak_live`` of a ``trace_peak`` run) as a text table in
    ``out/<plan>-stage<s>-rank<r>.txt`` (``<plan>-inductor-...`` for a compiled run); each row of the
    stage's first replica gets its ``peak_live``."""
    from tensoropt.executor.state.tensor_peak import live_set_table

    out.mkdir(parents=True, exist_ok=True)
    for run, m in zip(runs, metrics):
        p = run["plan"]
        name = p["id"] if run["compile"] == "none" else f"{p['id']}-{run['compile']}"
        for r in m["measured"]["ranks"]:
            live = r.get("peak_live") or []
            above = (r["peak_tensor_bytes"] - r["before_bytes"]) / 2**20
            resident = (r["resident_tensor_bytes"] - r["before_bytes"]) / 2**20
            head = (f"{p['id']} stage {r['stage']} rank {r['rank']}: peak in {r['phase']}, {above:.2f} MiB "
                    f"above the level before the run ({resident:.2f} MiB of it resident at the step's start)")
            made = (f"made during the step and alive at the peak: {r.get('peak_live_bytes', 0) / 2**20:.2f} "
                    f"MiB in {r.get('peak_live_storages', 0)} storages; the largest {len(live)}:")
            text = "\n".join([head, made, live_set_table([tuple(x) for x in live], top=len(live))])
            (out / f"{name}-stage{r['stage']}-rank{r['rank']}.txt").write_text(text + "\n")
    first = {(run["plan"]["id"], run["compile"], r["stage"]): r.get("peak_live")
             for run, m in zip(runs, metrics)
             for r in sorted(m["measured"]["ranks"], key=lambda r: -r["rank"])}
    for row in rows:
        row["peak_live"] = first.get((row["plan"], row["compile"], row["stage"]))
    print(f"live sets at the peak: {out}/<plan>-stage<s>-rank<r>.txt")


if __name__ == "__main__":
    main()
