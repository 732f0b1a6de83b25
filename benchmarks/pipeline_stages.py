"""The pipeline search's stage frontiers (issue 27): one FT solve per stage graph, the same with the
combines shared across solves, and the transfer-table sweep (tensoropt/pipeline/chain_stages.py) with
one set of three-objective tables for all in-flight counts (``chain``) or a set per count
(``chain-per-k``).

Captures a :mod:`scale` case at ``auto``'s micro-batch size, prices it on one stage mesh
(``devices / stages``), then runs :func:`tensoropt.pipeline.search.pipelined_frontier` for each stage
count in ``--stages`` with each way of building the stage frontiers, interleaved in one process
(the machine is shared: CPU seconds of this process are printed beside wall seconds). Prints one
table: per way, per stage count, CPU and wall seconds, stage solves or block eliminations and sweep
steps, pipelined plans found and the stage frontiers' bound.

Usage::

    .venv/bin/python benchmarks/pipeline_stages.py --case 70b --devices 512 --stages 2
    .venv/bin/python benchmarks/pipeline_stages.py --case 70b --devices 64 --stages 8 --ways chain,chain-per-k
    .venv/bin/python benchmarks/pipeline_stages.py --case 8b-small --devices 16 --stages 2,4
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import scale  # noqa: E402  (the cases)


def stage_graph(case: str, devices: int, stages: int):
    """(OpGraph, blocks, cost graph on ``devices / stages`` devices, micro-batches) of ``case``."""
    from tensoropt.config import Job
    from tensoropt.pipeline.stages import find_blocks
    from tensoropt.planner import (
        auto_micro_batches,
        build_job_model,
        capture_job,
        job_cost_graph,
        load_job_cluster,
        micro_batch_job,
        resolve_job,
    )

    kwargs, _ = scale.CASES[case]
    job = Job.from_dict({**scale.job_dict(kwargs, [devices]), "planner": {"pipeline": "auto"}})
    cluster = load_job_cluster(job)
    model, spec = build_job_model(job, "meta")
    job = resolve_job(job, spec, cluster)
    m = auto_micro_batches(8, job.training.global_batch_size)
    job_m = micro_batch_job(job, m)
    graph = capture_job(job_m)
    return graph, find_blocks(graph), job_cost_graph(graph, job_m, cluster, devices // stages), m


def run(way: str, graph, blocks, G, m: int, stage_counts: list[int]) -> list[dict]:
    """Rows of the table for one way (``solve``, ``solve+memo``, ``chain``: three-objective tables
    shared by the in-flight counts, ``chain-per-k``: two-objective tables per count)."""
    import frontier as ft
    from tensoropt.pipeline.search import StageSolver, pipelined_frontier
    from tensoropt.planner import (
        AUTO_BOX_MIN_CANDIDATES,
        AUTO_STEP_EPSILON,
        PIPELINE_STAGE_PLANS,
        in_flight_range,
        pipeline_chain_settings,
        thin_to_count,
    )

    memo = {} if way == "solve+memo" else None
    bound = [0.0]

    def solve(H):
        report = ft.SolveReport()
        points = ft.solve(H, report=report, step_epsilon=AUTO_STEP_EPSILON,
                          box_min_candidates=AUTO_BOX_MIN_CANDIDATES, memo=memo)
        points, thin = thin_to_count(points, PIPELINE_STAGE_PLANS)
        bound[0] = max(bound[0], (1 + thin) * (1 + report.bound) - 1)
        return points

    chain = None
    if way == "chain":  # one set of three-objective tables for every in-flight count of the counts
        chain = pipeline_chain_settings(in_flight_range([(p, "1F1B", m) for p in stage_counts], m))
    elif way == "chain-per-k":  # a set of two-objective tables per in-flight count (before)
        chain = pipeline_chain_settings()
    solver = StageSolver(G, graph, blocks, m, solve, chain=chain)
    rows = []
    for p in stage_counts:
        cpu, wall = time.process_time(), time.perf_counter()
        found, _ = pipelined_frontier(solver, p, "1F1B")
        chain = solver.chain
        rows.append({"way": way, "stages": p, "cpu_s": time.process_time() - cpu,
                     "wall_s": time.perf_counter() - wall, "solves": solver.solves,
                     "eliminations": chain.eliminations if chain else 0, "steps": chain.steps if chain else 0,
                     "plans": len(found), "bound": chain.bound if chain else bound[0],
                     "fastest_s": min(q.point.time_s for q in found),
                     "leanest_gib": min(q.point.memory_bytes for q in found) / 2**30})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", default="8b-small", choices=sorted(scale.CASES))
    parser.add_argument("--devices", type=int, default=16)
    parser.add_argument("--stages", default="2", help="comma-separated stage counts on one stage mesh")
    parser.add_argument("--ways", default="chain,chain-per-k,solve+memo,solve")
    args = parser.parse_args()
    counts = [int(x) for x in args.stages.split(",")]
    graph, blocks, G, m = stage_graph(args.case, args.devices, counts[0])
    print(f"{args.case}: {blocks.count} blocks, stage mesh {args.devices // counts[0]} devices, "
          f"{m} micro-batches, {G.number_of_nodes()} nodes")
    print("| way | stages | CPU s | wall s | stage solves | block eliminations | sweep steps | plans | "
          "fastest s | leanest GiB | bound |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for way in args.ways.split(","):
        for r in run(way, graph, blocks, G, m, counts):
            print(f"| {r['way']} | {r['stages']} | {r['cpu_s']:.1f} | {r['wall_s']:.1f} | {r['solves']} | "
                  f"{r['eliminations']} | {r['steps']} | {r['plans']} | {r['fastest_s']:.4f} | "
                  f"{r['leanest_gib']:.2f} | {100 * r['bound']:.2g} % |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
