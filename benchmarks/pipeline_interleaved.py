"""Interleaved1F1B against 1F1B in the pipeline search, and the interleaved runtime's parity (issue 27).

``--frontier``: captures a :mod:`scale` case at ``auto``'s micro-batch size, prices it on one stage
mesh (``devices / stages``) and runs :func:`tensoropt.pipeline.search.pipelined_frontier` for 1F1B
and Interleaved1F1B per stage count, interleaved in one process. One table: per (stages,
schedule), the plans found, the fastest plan's step time, bubble and memory per device, the
leanest plan's memory, the search's wall seconds, and how many of its plans the merged frontier
of both schedules keeps (with their time and memory range).

``--parity``: one launch of 2 gloo processes trains HF Llama (4 layers) with Interleaved1F1B on 4
virtual stages at m = 2 and m = 4 (3 steps, fp32), beside the 1-process reference on the same
slices; prints the largest relative loss and parameter differences.

Usage::

    .venv/bin/python benchmarks/pipeline_interleaved.py --frontier --case 8b-small --devices 16 --stages 2,4
    .venv/bin/python benchmarks/pipeline_interleaved.py --parity
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def frontier_rows(case: str, devices: int, stage_counts: list[int]) -> list[dict]:
    """Rows of the frontier table: per stage count, 1F1B then Interleaved1F1B on one solver."""
    from pipeline_stages import stage_graph

    import frontier as ft
    from frontier.pareto import pareto_select
    from tensoropt.pipeline.search import StageSolver, pipelined_frontier
    from tensoropt.planner import (
        AUTO_BOX_MIN_CANDIDATES,
        AUTO_STEP_EPSILON,
        PIPELINE_STAGE_PLANS,
        pipeline_chain_settings,
        thin_to_count,
    )

    rows = []
    for p in stage_counts:
        graph, blocks, G, m = stage_graph(case, devices, p)

        def solve(H, memo={}):  # noqa: B006  (one memo per stage count: the cost graph's combines)
            points = ft.solve(H, step_epsilon=AUTO_STEP_EPSILON, box_min_candidates=AUTO_BOX_MIN_CANDIDATES,
                              memo=memo)
            return thin_to_count(points, PIPELINE_STAGE_PLANS)[0]

        solver = StageSolver(G, graph, blocks, m, solve, chain=pipeline_chain_settings())
        both = []
        for schedule in ("1F1B", "Interleaved1F1B"):
            wall = time.perf_counter()
            found, bound = pipelined_frontier(solver, p, schedule)
            wall = time.perf_counter() - wall
            fastest = min(found, key=lambda q: q.point.time_s)
            rows.append({"stages": p, "schedule": schedule, "m": m, "blocks": blocks.count,
                         "plans": len(found),
                         "fastest_s": fastest.point.time_s, "bubble": fastest.bubble,
                         "fastest_gib": fastest.point.memory_bytes / 2**30,
                         "leanest_gib": min(q.point.memory_bytes for q in found) / 2**30,
                         "wall_s": wall, "cuts": [list(b) for b in fastest.point.blocks]})
            both += [(schedule, q) for q in found]
        keep = pareto_select([[q.point.time_s, q.point.memory_bytes] for _, q in both])
        for r in rows[-2:]:  # how many of each schedule's plans the merged frontier keeps, and where
            mine = sorted((both[i][1].point for i in keep if both[i][0] == r["schedule"]),
                          key=lambda q: q.time_s)
            r["merged"] = len(mine)
            r["merged_range"] = (f"{mine[0].time_s:.4f}-{mine[-1].time_s:.4f} s, "
                                 f"{mine[-1].memory_bytes / 2**30:.2f}-{mine[0].memory_bytes / 2**30:.2f} GiB"
                                 ) if mine else "-"
    return rows


def parity() -> list[tuple[str, float, float]]:
    """(run, largest relative loss difference, largest parameter difference over its scale)."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "pipeline_runtime"))
    from pipeline_jobs import llama_spec, plan

    from tensoropt.launch import LaunchOptions, launch_module
    from tensoropt.pipeline_runtime.reference import reference_run

    blocks = [[0, 1], [2, 2], [3, 3], [4, 5]]
    out = Path(tempfile.mkdtemp(prefix="interleaved-"))
    runs = []
    for m in (2, 4):
        entry = plan(f"llama-il-m{m}", 2, "Interleaved1F1B", blocks, m)
        entry["pipeline"]["stages"] = 2
        runs.append({"spec": llama_spec().to_json(), "plan": entry, "steps": 3,
                     "metrics": str(out / f"m{m}.json"), "params_dir": str(out / f"m{m}")})
    (out / "run.json").write_text(json.dumps({"runs": runs, "timeout_s": 120}))
    options = LaunchOptions(2, timeout_s=600)
    if launch_module("tensoropt.pipeline_runtime.worker", [str(out / "run.json")], options):
        raise SystemExit("the workers failed")
    rows = []
    for m, run in zip((2, 4), runs):
        losses, params = reference_run(llama_spec(), 3, m)
        got = json.loads(Path(run["metrics"]).read_text())["losses"]
        mine = {}
        for f in Path(run["params_dir"]).glob("stage-*.pt"):
            mine.update(torch.load(f))
        loss_diff = max(abs(a - b) / abs(b) for a, b in zip(got, losses))
        param_diff = max(float((mine[k] - v).abs().max()) / max(float(v.abs().max()), 1e-30)
                         for k, v in params.items())
        rows.append((f"Interleaved1F1B pp=2 (4 virtual stages), m={m}", loss_diff, param_diff))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frontier", action="store_true")
    parser.add_argument("--parity", action="store_true")
    parser.add_argument("--case", default="8b-small")
    parser.add_argument("--devices", type=int, default=16)
    parser.add_argument("--stages", default="2")
    args = parser.parse_args()
    if args.frontier:
        rows = frontier_rows(args.case, args.devices, [int(x) for x in args.stages.split(",")])
        print(f"{args.case} on {args.devices} devices ({rows[0]['blocks']} blocks, m = {rows[0]['m']})")
        print("| stages | schedule | plans | fastest step s | its bubble | its memory GiB | leanest GiB | "
              "search wall s | fastest's cuts | on the merged frontier | their range |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['stages']} | {r['schedule']} | {r['plans']} | {r['fastest_s']:.4f} | "
                  f"{100 * r['bubble']:.1f} % | {r['fastest_gib']:.2f} | {r['leanest_gib']:.2f} | "
                  f"{r['wall_s']:.1f} | {r['cuts']} | {r['merged']} | {r['merged_range']} |", flush=True)
    if args.parity:
        print("| run | largest loss difference (relative) | largest parameter difference (of its scale) |")
        print("|---|---|---|")
        for name, loss, param in parity():
            print(f"| {name} | {loss:.2e} | {param:.2e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
