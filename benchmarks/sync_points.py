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
    """torchrun entry: every sync count per repetition, rotated; rank 0 writes the step times."""
    import torch.distributed as dist

    from tensoropt.executor.state.worker import end_process_group, init_process_group

    init_process_group()
    rank = dist.get_rank()
    torch.manual_seed(0)
    x = torch.randn(options["rows"], options["width"])
    weights = [torch.randn(options["width"], options["width"]) / options["width"] ** 0.5
               for _ in range(options["ops"])]
    buf = torch.zeros(max(1, options["bytes"] // 4))
    syncs = options["syncs"]

    def step(k: int) -> float:
        at = {round((i + 1) * options["ops"] / (k + 1)) for i in range(k)}  # evenly spaced
        dist.barrier()
        start = time.perf_counter()
        h = x
        for i, w in enumerate(weights):
            h = torch.tanh(h @ w)
            if i in at:
                buf[0] = h[0, 0]  # the collective depends on the compute before it
                dist.all_reduce(buf)  # blocking: the next operator needs it
                h = h + buf[0] * 0
        dist.all_reduce(buf)  # the step's end (every k alike: DP's gradient sync)
        return time.perf_counter() - start

    for k in syncs:  # warm-up
        step(k)
    times = {k: [] for k in syncs}
    for r in range(options["reps"]):
        order = syncs[r % len(syncs):] + syncs[:r % len(syncs)]
        for k in (order[::-1] if r % 2 else order):
            times[k].append(step(k))
    if rank == 0:
        Path(options["out"]).write_text(json.dumps({str(k): v for k, v in times.items()}))
    dist.barrier()
    end_process_group()


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
    sys.path.insert(0, str(HERE))
    from worker_launch import launch_workers

    from estimators.collectives import CommModel
    from estimators.configuration import Mesh
    from estimators.profiles import load_cluster

    syncs = [int(s) for s in args.syncs.split(",") if s.strip()]
    if len(set(syncs)) < 2:
        parser.error("--syncs: give two or more distinct counts")
    load_before = os.getloadavg()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        got = launch_workers(__file__, {"ops": args.ops, "rows": args.rows, "width": args.width,
                                        "bytes": args.bytes, "syncs": syncs, "reps": args.reps},
                             Path(tmp), 2, timeout_s=1800)
    load_after = os.getloadavg()
    medians = {k: statistics.median(got[str(k)]) for k in syncs}
    comm = CommModel(load_cluster(args.cluster), Mesh((2,), ("gpu",)))
    priced_s = comm.time_s("all_reduce", args.bytes, (0,))
    slope_s = fit_slope(syncs, [medians[k] for k in syncs])
    print(f"{'syncs':>6} {'median step ms':>15} {'per sync ms (vs 0)':>19}")
    for k in syncs:
        per = (medians[k] - medians[syncs[0]]) / (k - syncs[0]) * 1e3 if k != syncs[0] else float("nan")
        print(f"{k:>6} {medians[k] * 1e3:>15.2f} {per:>19.3f}")
    unpriced_s = slope_s - priced_s
    print(f"\nslope {slope_s * 1e3:.3f} ms per sync point; priced all-reduce of {args.bytes} B on "
          f"{args.cluster}: {priced_s * 1e3:.3f} ms; unpriced per sync point (sync_point_s): "
          f"{unpriced_s * 1e3:.3f} ms")
    print(f"load average before {' '.join(f'{x:.2f}' for x in load_before)}, after "
          f"{' '.join(f'{x:.2f}' for x in load_after)}; {args.reps} repetitions; "
          f"{time.perf_counter() - start:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"medians_s": medians, "slope_s": slope_s, "priced_s": priced_s,
                                               "sync_point_s": unpriced_s, "load_before": load_before,
                                               "load_after": load_after, **vars(args)}, indent=2))
    return 0


if __name__ == "__main__":
    from worker_launch import run_worker_if_asked

    run_worker_if_asked(worker)
    sys.exit(main())
