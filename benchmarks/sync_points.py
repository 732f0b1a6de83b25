"""What a blocking collective in the middle of a step costs beyond its alpha-beta price (issue 29 item 3).

A model-parallel plan stops every rank at each collective whose result the next operator needs
(an all-reduce of a row-parallel linear's output, the all-gather before a replicated norm): the
rank that arrives first waits for the other, and a rank that waited wakes gloo's threads late.
The cluster's collective fits (``configs/clusters/cpu-local.yaml``) time collectives issued one
after another, so they do not hold that wait. This benchmark measures it: 2 gloo processes, one
thread each, run a chain of ``--ops`` matrix products (``--rows`` x ``--width``, about BERT-sized;
the same work on both ranks) with ``k`` blocking all-reduces of a ``--bytes`` tensor spaced evenly
through it, ``k`` in ``--syncs``, interleaved (each repetition runs every ``k`` in a rotated
order). Per ``k``: the median step time; then the least-squares slope of step time over ``k``
(seconds per sync point), the cluster's priced all-reduce of ``--bytes`` and their difference,
the unpriced part of one sync point: ``sync_point_s`` of ``configs/devices/cpu.yaml``
(:mod:`estimators.sync_points`).

Usage (one command): ``.venv/bin/python benchmarks/sync_points.py [--reps 30] [--syncs 0,4,8,16]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def worker(options: dict) -> None:
    """torchrun entry: every sync count per repetition, rotated, and the all-reduce alone as calibrate
    times it; rank 0 writes the step times, the collective's times and each step's sync waits."""
    import torch.distributed as dist
    from micro_batch_time import run_delay_s

    from tensoropt.executor.state.worker import end_process_group, init_process_group

    init_process_group()
    rank = dist.get_rank()
    torch.manual_seed(0)
    x = torch.randn(options["rows"], options["width"])
    weights = [torch.randn(options["width"], options["width"]) / options["width"] ** 0.5
               for _ in range(options["ops"])]
    buf = torch.zeros(max(1, options["bytes"] // 4))
    syncs = options["syncs"]

    def step(k: int) -> tuple[float, list]:
        at = {round((i + 1) * options["ops"] / (k + 1)) for i in range(k)}  # evenly spaced
        dist.barrier()
        start = time.perf_counter()
        marks = [(start, run_delay_s(), start, run_delay_s())]  # (issue, its run delay, end, its delay)
        h = x
        for i, w in enumerate(weights):
            h = torch.tanh(h @ w)
            if i in at:
                buf[0] = h[0, 0]  # the collective depends on the compute before it
                issued, delay = time.perf_counter(), run_delay_s()
                dist.all_reduce(buf)  # blocking: the next operator needs it
                marks.append((issued, delay, time.perf_counter(), run_delay_s()))
                h = h + buf[0] * 0
        dist.all_reduce(buf)  # the step's end (every k alike: DP's gradient sync)
        return time.perf_counter() - start, marks

    def alone() -> float:  # as tensoropt calibrate times it: after a barrier and 1 ms of compute
        from tensoropt.commands.calibrate import BUSY_S

        busy = torch.ones(128, 128)
        dist.barrier()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < BUSY_S:
            busy @ busy
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        return time.perf_counter() - t0

    for k in syncs:  # warm-up
        step(k)
    times = {k: [] for k in syncs}
    marks = {k: [] for k in syncs}
    collective = []
    for r in range(options["reps"]):
        order = syncs[r % len(syncs):] + syncs[:r % len(syncs)]
        for k in (order[::-1] if r % 2 else order):
            took, got = step(k)
            times[k].append(took)
            marks[k].append(got)
        collective.append(alone())
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, {"marks": marks, "collective": collective})
    if rank == 0:
        waits = {k: [sync_waits([e["marks"][k][r] for e in every]) for r in range(options["reps"])]
                 for k in syncs}
        slowest = [max(e["collective"][r] for e in every) for r in range(options["reps"])]
        Path(options["out"]).write_text(json.dumps({"times": {str(k): v for k, v in times.items()},
                                                    "waits": {str(k): v for k, v in waits.items()},
                                                    "collective_s": slowest}))
    dist.barrier()
    end_process_group()


def sync_waits(marks: list[list[tuple]]) -> tuple[float, float]:
    """Rank 0's waits at one step's sync points: ``(sum of its waits for the last rank to issue each
    collective, the same less what the last rank waited runnable for a core beyond rank 0 since its
    previous collective)``. ``marks[rank]``: that rank's (issue time, run delay then, end time, run
    delay then) per sync point, the step's start first (the same clock on every rank of one host).

    Example:
        >>> me = [(0.0, 0.0, 0.0, 0.0), (1.0, 0.0, 1.005, 0.0)]
        >>> late = [(0.0, 0.0, 0.0, 0.0), (1.003, 0.002, 1.005, 0.002)]
        >>> [round(x, 6) for x in sync_waits([me, late])]
        [0.003, 0.001]
    """
    wait = unloaded = 0.0
    for i in range(1, len(marks[0])):
        last = max(range(len(marks)), key=lambda r: marks[r][i][0])
        skew = marks[last][i][0] - marks[0][i][0]
        extra = (marks[last][i][1] - marks[last][i - 1][3]) - (marks[0][i][1] - marks[0][i - 1][3])
        wait += skew
        unloaded += max(0.0, skew - max(0.0, extra))
    return wait, unloaded


def fit_slope(counts: list[float], times_s: list[float]) -> float:
    """Least-squares slope of ``times_s`` over ``counts`` (seconds per sync point).

    Example:
        >>> round(fit_slope([0, 4, 8], [0.010, 0.012, 0.014]), 6)
        0.0005
    """
    mx, my = statistics.fmean(counts), statistics.fmean(times_s)
    den = sum((x - mx) ** 2 for x in counts)
    return sum((x - mx) * (y - my) for x, y in zip(counts, times_s)) / den


def main(argv: list[str] | None = None) -> int:
    """Launch, print the table and the fitted unpriced time per sync point."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=48, help="matrix products per step")
    parser.add_argument("--rows", type=int, default=256, help="rows of the activation")
    parser.add_argument("--width", type=int, default=128, help="width of the activation and the weights")
    parser.add_argument("--bytes", type=int, default=4 * 256 * 128,
                        help="bytes of each all-reduce (default: one rank's 256 x 128 float32 activation)")
    parser.add_argument("--syncs", default="0,4,8,16", help="sync points per step, comma-separated")
    parser.add_argument("--reps", type=int, default=30, help="interleaved repetitions")
    parser.add_argument("--cluster", default="cpu-local", help="cluster whose all-reduce price is subtracted")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    from estimators.collectives import CommModel
    from estimators.configuration import Mesh
    from estimators.profiles import load_cluster

    syncs = [int(s) for s in args.syncs.split(",") if s.strip()]
    if len(set(syncs)) < 2:
        parser.error("--syncs: give two or more distinct counts")
    load_before = os.getloadavg()
    start = time.perf_counter()
    got = measure({"ops": args.ops, "rows": args.rows, "width": args.width, "bytes": args.bytes,
                   "syncs": syncs, "reps": args.reps})
    load_after = os.getloadavg()
    comm = CommModel(load_cluster(args.cluster), Mesh((2,), ("gpu",)))
    priced_s = comm.time_s("all_reduce", args.bytes, (0,))
    medians = got["medians_s"]
    print(f"{'syncs':>6} {'median step ms':>15} {'per sync ms (vs 0)':>19}")
    for k in syncs:
        per = (medians[k] - medians[syncs[0]]) / (k - syncs[0]) * 1e3 if k != syncs[0] else float("nan")
        print(f"{k:>6} {medians[k] * 1e3:>15.2f} {per:>19.3f}")
    slope_s = got["slope_s"]
    print(f"\nslope {slope_s * 1e3:.3f} ms per sync point; the all-reduce of {args.bytes} B alone (as "
          f"calibrate times it, this launch) {got['collective_s'] * 1e3:.3f} ms, priced on {args.cluster} "
          f"{priced_s * 1e3:.3f} ms")
    print(f"per sync point: slope less the all-reduce alone {(slope_s - got['collective_s']) * 1e3:.3f} ms; "
          f"slope less its price {(slope_s - priced_s) * 1e3:.3f} ms (the measure before 2026-11-28 22:30)")
    print(f"rank 0's wait for the last rank to issue: {got['wait_s'] * 1e3:.3f} ms per sync point; less the "
          f"last rank's extra run delay (sync_point_s): {got['sync_point_s'] * 1e3:.3f} ms")
    print(f"load average before {' '.join(f'{x:.2f}' for x in load_before)}, after "
          f"{' '.join(f'{x:.2f}' for x in load_after)}; {args.reps} repetitions; "
          f"{time.perf_counter() - start:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({**got, "priced_s": priced_s, "load_before": load_before,
                                               "load_after": load_after, **vars(args)}, indent=2))
    return 0


def measure(options: dict, timeout_s: float = 1800) -> dict:
    """One launch of :func:`worker` on 2 processes: ``medians_s`` (sync count -> median step seconds),
    ``slope_s`` (seconds per sync point), ``collective_s`` (the all-reduce alone, median of the slowest
    rank's), ``wait_s`` (rank 0's wait for the last rank to issue, per sync point: the median over the
    repetitions of the steps' sums over their sync counts) and ``sync_point_s`` (the same less the last
    rank's extra run delay).

    Example:
        >>> options = {"ops": 24, "rows": 64, "width": 64, "bytes": 4096, "syncs": [0, 8], "reps": 4}
        >>> measure(options)  # starts 2 processes  # doctest: +SKIP
        {'medians_s': {0: 0.004, 8: 0.016}, 'slope_s': 0.0015, ...}
    """
    sys.path.insert(0, str(HERE))
    from worker_launch import launch_workers

    syncs = options["syncs"]
    with tempfile.TemporaryDirectory() as tmp:
        got = launch_workers(__file__, options, Path(tmp), 2, timeout_s=timeout_s)
    medians = {k: statistics.median(got["times"][str(k)]) for k in syncs}
    counted = [k for k in syncs if k > 0]
    per_rep = list(zip(*(got["waits"][str(k)] for k in counted)))  # per repetition: each k's (wait, unloaded)
    waits = [sum(w[0] for w in rep) / sum(counted) for rep in per_rep]
    unloaded = [sum(w[1] for w in rep) / sum(counted) for rep in per_rep]
    return {"medians_s": medians, "slope_s": fit_slope(syncs, [medians[k] for k in syncs]),
            "collective_s": statistics.median(got["collective_s"]), "wait_s": statistics.median(waits),
            "sync_point_s": statistics.median(unloaded)}


if __name__ == "__main__":
    from worker_launch import run_worker_if_asked

    run_worker_if_asked(worker)
    sys.exit(main())
