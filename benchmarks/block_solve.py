"""The solve time of the block memory options (issue 26: at most 1.5 x the solve without them).

Captures the Llama-3-8B shape (HF ``LlamaForCausalLM`` on ``meta``, :mod:`scale`'s shape) with
``--layers`` layers at ``--seq`` tokens, global batch ``--batch``, bf16-mixed, AdamW, on ``--devices``
H100 (h100x8), prices one cost graph per set of memory options (recompute, zero1-3; + block_recompute;
+ block_recompute, block_selective) and solves each as ``tensoropt plan`` does (``epsilon: auto``:
the planner's step epsilon and boxing threshold), ``--rounds`` times interleaved. Prints per option
set the configurations, the cost-graph and solve CPU seconds (this process's) and wall seconds, the
ratio to the first set, the plans and the printed bound.

Usage (one command)::

    .venv/bin/python benchmarks/block_solve.py [--layers 4] [--seq 32768] [--batch 8] [--rounds 2]
                                               [--save FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BASE = ["recompute", "zero1", "zero2", "zero3"]
OPTION_SETS = {
    "recompute, zero1-3": BASE,
    "+ block_recompute": [*BASE, "block_recompute"],
    "+ block_recompute, block_selective": [*BASE, "block_recompute", "block_selective"],
}


def solve_once(G) -> tuple[float, float, int, float]:
    """(CPU s, wall s, plans, bound) of one ``epsilon: auto`` solve of the cost graph ``G``.

    Example:
        >>> solve_once(G)  # doctest: +SKIP
        (12.1, 14.0, 63, 0.004)
    """
    import frontier as ft
    from tensoropt.planner import AUTO_BOX_MIN_CANDIDATES, AUTO_STEP_EPSILON

    report = ft.SolveReport()
    cpu, wall = time.process_time(), time.perf_counter()
    points = ft.solve(G, report=report, step_epsilon=AUTO_STEP_EPSILON,
                      box_min_candidates=AUTO_BOX_MIN_CANDIDATES)
    return time.process_time() - cpu, time.perf_counter() - wall, len(points), report.bound


def main() -> int:
    """Command line: print the table."""
    from scale import LLAMA_8B, job_dict

    from tensoropt.config import Job
    from tensoropt.planner import build_job_model, capture_job, job_cost_graph, load_job_cluster, resolve_job

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32768)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--save", help="pickle the cost graphs here (for benchmarks/solver_ab.py)")
    args = parser.parse_args()
    print(f"load: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; Llama-3-8B shape, "
          f"{args.layers} layers, seq {args.seq}, batch {args.batch}, {args.devices} H100")
    kwargs = dict(LLAMA_8B, num_hidden_layers=args.layers, max_position_embeddings=max(8192, args.seq))
    job = job_dict(kwargs, [args.devices], args.seq)
    job["training"]["global_batch_size"] = args.batch
    job["cluster"] = "h100x8"
    graphs = {}
    graph = None
    for name, options in OPTION_SETS.items():
        job["training"]["memory_options"] = options
        j = Job.from_dict(job)
        cluster = load_job_cluster(j)
        if graph is None:
            model, spec = build_job_model(j, "meta")
            j = resolve_job(j, spec, cluster)
            graph = capture_job(j, (model, spec))
        else:
            j = resolve_job(j, build_job_model(j, "meta")[1], cluster)
        cpu, wall = time.process_time(), time.perf_counter()
        G = job_cost_graph(graph, j, cluster, args.devices)
        rows = sum(len(G.nodes[n]["configs"]) for n in G.nodes)
        graphs[name] = (G, rows, time.process_time() - cpu, time.perf_counter() - wall)
    if args.save:
        import pickle

        with open(args.save, "wb") as f:
            pickle.dump({name: g[0] for name, g in graphs.items()}, f)
    solves: dict[str, list] = {name: [] for name in OPTION_SETS}
    for _ in range(args.rounds):
        for name in OPTION_SETS:
            solves[name].append(solve_once(graphs[name][0]))
    print("| memory options | configurations | cost graph CPU s | solve CPU s (rounds) | solve wall s | "
          "x first (CPU) | plans | bound |")
    print("|---|---|---|---|---|---|---|---|")
    first = None
    for name in OPTION_SETS:
        G, rows, graph_cpu, _ = graphs[name]
        runs = solves[name]
        cpu = min(r[0] for r in runs)
        first = first or cpu
        print(f"| {name} | {rows} | {graph_cpu:.1f} | {' / '.join(f'{r[0]:.1f}' for r in runs)} | "
              f"{' / '.join(f'{r[1]:.1f}' for r in runs)} | {cpu / first:.2f} | {runs[-1][2]} | "
              f"{100 * runs[-1][3]:.2g} % |")
    print(f"load after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
