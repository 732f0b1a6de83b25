"""One block's transfer table of the pipeline search (issue 27): one three-objective table for a range
of in-flight counts (``ChainSettings.in_flight``) against the two-objective table of each count.

Captures a :mod:`scale` case at ``auto``'s micro-batch size and prices it on one stage mesh (as
:mod:`pipeline_stages`), then, in rounds interleaved in one process, eliminates a middle block's
interior keeping its two boundary tensors (:meth:`tensoropt.pipeline.chain_stages.StageChain._part`,
the planner's box grid): once in (time, memory at k1, memory at k2) on the compiled three-objective
kernel (:mod:`frontier.staircase3`), and once per in-flight count of the range in (time, memory at
k) (:mod:`frontier.staircase`); ``--numpy3`` adds the three-objective table on the numpy combine
(enumerate, then prune: minutes). Each measurement starts from an empty memo. Prints CPU seconds of
this process (the machine is shared: wall seconds beside them) and the table's rows.

Usage::

    .venv/bin/python benchmarks/transfer_table3.py --case 8b --devices 16 --stages 2 --in-flight 1,8
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import pipeline_stages  # noqa: E402  (the stage graph of a case)
import scale  # noqa: E402  (the cases)


def table_cpu_s(solver, key, compiled: bool = True) -> tuple[float, float, int]:
    """(CPU s, wall s, rows) of the middle block's transfer table for the tables ``key`` (a count,
    or a range of counts: three objectives), from an empty memo."""
    import frontier.combine as combine
    from tensoropt.pipeline.chain_stages import StageChain
    from tensoropt.planner import pipeline_chain_settings

    chain = StageChain(solver, pipeline_chain_settings(key if isinstance(key, tuple) else None))
    before = combine.COMPILED_KERNEL
    combine.COMPILED_KERNEL = compiled
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        reduced, table, _ = chain._part("block", key)
        return time.process_time() - cpu, time.perf_counter() - wall, len(table.cost)
    finally:
        combine.COMPILED_KERNEL = before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", default="8b", choices=sorted(scale.CASES))
    parser.add_argument("--devices", type=int, default=16)
    parser.add_argument("--stages", type=int, default=2, help="stage mesh: devices / stages")
    parser.add_argument("--in-flight", default="1,8", help="k1,k2: the range the shared table serves")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--numpy3", action="store_true", help="also the numpy three-objective combine")
    args = parser.parse_args()
    import numpy as np

    from frontier.staircase3 import sum_union_3d
    from tensoropt.pipeline.search import StageSolver

    k1, k2 = (int(x) for x in args.in_flight.split(","))
    graph, blocks, G, m = pipeline_stages.stage_graph(args.case, args.devices, args.stages)
    solver = StageSolver(G, graph, blocks, m, solve=None)
    one = np.zeros((1, 3))
    sum_union_3d([one], [np.array([0, 1])], [np.zeros(1, int)], 1, 1)  # numba's compile, not timed
    print(f"{args.case}: {blocks.count} blocks, stage mesh {args.devices // args.stages} devices, "
          f"{m} micro-batches; middle block's transfer table, in-flight range ({k1}, {k2})")
    print("| round | tables | objectives | CPU s | wall s | rows |")
    print("|---|---|---|---|---|---|")
    for r in range(args.rounds):
        ways = [("shared (k1, k2), compiled", (k1, k2), True)]
        if args.numpy3 and r == 0:
            ways.append(("shared (k1, k2), numpy", (k1, k2), False))
        ways += [(f"k = {k}", k, True) for k in range(k1, k2 + 1)]
        per_k = 0.0
        for name, key, compiled in ways:
            cpu, wall, rows = table_cpu_s(solver, key, compiled)
            if not isinstance(key, tuple):
                per_k += cpu
            print(f"| {r + 1} | {name} | {3 if isinstance(key, tuple) else 2} | {cpu:.2f} | {wall:.2f} | "
                  f"{rows} |", flush=True)
        print(f"| {r + 1} | every k of the range, two objectives (sum) | 2 | {per_k:.2f} | | |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
