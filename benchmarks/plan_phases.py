"""Where ``tensoropt plan`` spends its non-solver time (issue 18): phase timings per device count.

Builds a :mod:`benchmarks.scale` case (HF ``LlamaForCausalLM`` on ``meta``), then times, as
:func:`tensoropt.planner.plan_job` / :func:`~tensoropt.planner.plan_devices` sequence them: building
the model, capture (``torch.export`` + operator graph), the runnability check, and per device
count the configuration space, the solver-size check, the cost graph pricing and the breakdown
of ``--plans`` plans (random assignments, 5 % changed from one to the next, stand for the solver's
points), then the fingerprint and
the files' text. The solver is not run (``benchmarks/scale.py`` times the whole command).
``--profile N`` prints the N costliest functions (cProfile, cumulative) of the whole run.

Usage (one command)::

    TENSOROPT_CACHE=/tmp/F/cache .venv/bin/python benchmarks/plan_phases.py --case 8b [--profile 30]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def phases(case: str, devices: list[int] | None = None, plans: int = 100) -> dict[str, float]:
    """Seconds per non-solver phase of planning ``case`` (keys ``model``, ``capture``, ``<P>:<phase>``).

    Example:
        >>> t = phases("8b-small", [8])  # doctest: +SKIP
        >>> sorted(t)[:2]  # doctest: +SKIP
        ['8:configurations', '8:cost_graph']
    """
    import random
    from types import SimpleNamespace

    from scale import CASES, job_dict

    from frontier.memory_limit import default_limit_bytes
    from tensoropt.capture.fingerprint import fingerprint
    from tensoropt.capture.runnable import check_runnable
    from tensoropt.config import Job
    from tensoropt.configspace import configurations
    from tensoropt.configspace.configuration import Mesh
    from tensoropt.cost_graph import cost_graph
    from tensoropt.planner import (
        build_job_model,
        capture_job,
        frontier_from_points,
        frozen_heap,
        load_job_cluster,
        resolve_job,
    )
    from tensoropt.plans import FrontierFile, frontier_file_text, plan_file_text
    from tensoropt.solver_size import check_table_size, table_size

    kwargs, case_devices = CASES[case]
    job = Job.from_dict(job_dict(kwargs, devices or case_devices))
    t: dict[str, float] = {}
    frontiers = []
    start = time.perf_counter()
    cluster = load_job_cluster(job)
    model, spec = build_job_model(job, "meta")
    job = resolve_job(job, spec, cluster)
    t["model"] = time.perf_counter() - start
    start = time.perf_counter()
    graph = capture_job(job, (model, spec))
    t["capture"] = time.perf_counter() - start
    start = time.perf_counter()
    check_runnable(graph.program, cluster.device.kind)
    t["runnable"] = time.perf_counter() - start
    print(f"model {t['model']:.1f} s, capture {t['capture']:.1f} s ({graph.nx.number_of_nodes()} nodes, "
          f"{graph.nx.number_of_edges()} edges), runnable {t['runnable']:.1f} s", flush=True)
    heap = frozen_heap()  # as plan_job and the plan command do
    heap.__enter__()
    for d in job.devices:
        start = time.perf_counter()
        hierarchical = job.planner.hierarchical_for(d)
        mesh = Mesh.for_cluster(d, cluster.devices_per_node)
        configs = configurations(graph, mesh, whole_levels=hierarchical)
        t[f"{d}:configurations"] = time.perf_counter() - start
        start = time.perf_counter()
        try:
            size = table_size(graph, configs, job.training.memory_options)
            check_table_size(size, d, default_limit_bytes(), hierarchical)
        except MemoryError as e:
            print(f"  {d}: table size check: {e}")
        t[f"{d}:table_size"] = time.perf_counter() - start
        start = time.perf_counter()
        G = cost_graph(graph, cluster, d, batch_size=job.training.global_batch_size,
                       optimizer=job.training.optimizer, compute_mode=job.planner.compute,
                       memory_options=job.training.memory_options, configurations=configs,
                       precision=job.training.precision, batch_norm_stats=job.training.batch_norm)
        t[f"{d}:cost_graph"] = time.perf_counter() - start
        rows = sum(len(G.nodes[n]["configs"]) for n in G.nodes)
        # the solver is not run: ``plans`` random assignments stand for its points, each the
        # previous one with 5 % of the operators changed (neighbouring frontier plans share most)
        rng = random.Random(d)
        assignment = {n: rng.randrange(len(G.nodes[n]["configs"])) for n in G.nodes}
        points = []
        for i in range(plans):
            points.append(SimpleNamespace(cost=(1.0 + i, 1e9 - i), assignment=dict(assignment)))
            for n in rng.sample(sorted(G.nodes), len(G) // 20):
                assignment[n] = rng.randrange(len(G.nodes[n]["configs"]))
        start = time.perf_counter()
        frontiers.append(frontier_from_points(G, graph, points, job.training.global_batch_size))
        t[f"{d}:breakdown"] = time.perf_counter() - start
        print(f"  {d} devices: configurations {t[f'{d}:configurations']:.1f} s, table size "
              f"{t[f'{d}:table_size']:.1f} s, cost graph {t[f'{d}:cost_graph']:.1f} s "
              f"({rows} configuration rows), breakdown of {plans} plans {t[f'{d}:breakdown']:.1f} s",
              flush=True)
    heap.__exit__(None, None, None)
    start = time.perf_counter()
    ff = FrontierFile(job=job.to_dict(), frontiers=frontiers, graph=fingerprint(graph, job))
    t["fingerprint"] = time.perf_counter() - start
    start = time.perf_counter()
    heap = frozen_heap()  # as the plan command's write_outputs does
    heap.__enter__()
    data = ff.to_json()
    text = frontier_file_text(data)
    plan_file_text(data, frontiers[-1].plans[0].id)
    heap.__exit__(None, None, None)
    t["files"] = time.perf_counter() - start
    size_mib = len(text) / 2**20
    print(f"fingerprint {t['fingerprint']:.1f} s, frontier.json and plan.json text {t['files']:.1f} s "
          f"(frontier.json {size_mib:.0f} MiB, not written)")
    return t


def main() -> int:
    """Command line: print the phase timings (and optionally a cProfile summary)."""
    from scale import CASES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="8b", choices=sorted(CASES))
    parser.add_argument("--devices", type=int, action="append", help="default: the case's")
    parser.add_argument("--plans", type=int, default=100, help="plans per device count (random)")
    parser.add_argument("--profile", type=int, default=0, help="print the N costliest functions")
    args = parser.parse_args()
    print(f"load: {os.getloadavg()[0]:.1f}, TENSOROPT_CACHE={os.environ.get('TENSOROPT_CACHE', '')}")
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    start = time.perf_counter()
    phases(args.case, args.devices, args.plans)
    total = time.perf_counter() - start
    if profiler:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(args.profile)
    print(f"total (no solve): {total:.1f} s, load after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
