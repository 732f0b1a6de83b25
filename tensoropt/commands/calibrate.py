"""``tensoropt calibrate --nproc N [--out FILE]``: measure collectives, fit alpha-beta, write a profile.

Spawns N local processes (gloo on CPU, nccl when N GPUs are visible), times all-reduce,
all-gather, reduce-scatter, broadcast (and all-to-all where the backend has it) at several
sizes, fits ``time = alpha + beta * bytes`` per collective (estimators.calibration) and writes a
cluster profile YAML that ``cost_graph``/``tensoropt plan`` accept by path. Prints each point's
fit error.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import yaml

from tensoropt.commands import CommandError

DEFAULT_SIZES = "4096,65536,1048576,4194304,16777216"


def add_parser(subparsers) -> None:
    """Add the ``calibrate`` subcommand."""
    p = subparsers.add_parser(
        "calibrate",
        help="measure collectives with the real backend and write a profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--nproc", type=int, required=True, help="number of local processes (>= 2)")
    p.add_argument("--out", default=None, help="profile YAML to write (default: ./<cluster>-calibrated.yaml)")
    p.add_argument(
        "--cluster",
        default=None,
        help="profile whose hardware the fit refines (default: cpu-local, or h100x8 with GPUs)",
    )
    p.add_argument(
        "--sizes", default=DEFAULT_SIZES, help=f"comma-separated byte sizes (default {DEFAULT_SIZES})"
    )
    p.add_argument("--iters", type=int, default=5, help="timed iterations per size (fastest kept; default 5)")
    p.add_argument(
        "--backend", choices=("gloo", "nccl"), default=None, help="default: nccl with GPUs, else gloo"
    )
    p.add_argument("--timeout-s", type=float, default=300.0, help="give up after this many seconds")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _collectives(backend: str) -> list[str]:
    out = ["all_reduce", "all_gather", "reduce_scatter", "broadcast"]
    return out + (["all_to_all"] if backend == "nccl" else [])


def _worker(
    rank: int, nproc: int, port: int, backend: str, sizes: list[int], iters: int, out_file: str
) -> None:
    """One rank: time every collective at every size; rank 0 writes {collective: [[bytes, s], ...]}."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=nproc)
    try:
        results: dict[str, list[list[float]]] = {}
        for coll in _collectives(backend):
            for nbytes in sizes:
                numel = max(nproc, nbytes // 4 // nproc * nproc)
                full = torch.ones(numel, device=device)
                part = torch.ones(numel // nproc, device=device)

                def call(coll=coll, full=full, part=part):
                    if coll == "all_reduce":
                        dist.all_reduce(full)
                    elif coll == "all_gather":
                        getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(full, part)
                    elif coll == "reduce_scatter":
                        getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)(part, full)
                    elif coll == "broadcast":
                        dist.broadcast(full, 0)
                    else:
                        dist.all_to_all_single(torch.empty_like(full), full)

                times = []
                for i in range(iters + 2):
                    dist.barrier()
                    if backend == "nccl":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    call()
                    if backend == "nccl":
                        torch.cuda.synchronize()
                    if i >= 2:
                        times.append(time.perf_counter() - t0)
                # the model's n: all-to-all counts bytes per device, the others the full tensor
                # the fastest repetition: on a shared machine the others measure the neighbours
                t = torch.tensor([min(times)], dtype=torch.float64, device=device)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's time
                results.setdefault(coll, []).append([float(numel * 4), float(t.item())])
        if rank == 0:
            Path(out_file).write_text(yaml.safe_dump(results))
    finally:
        dist.destroy_process_group()


def measure(nproc: int, sizes: list[int], iters: int, backend: str, timeout_s: float) -> dict:
    """Spawn ``nproc`` processes and return {collective: [(bytes, seconds), ...]}.

    Example:
        >>> measure(2, [4096, 65536], 2, "gloo", 120)  # doctest: +SKIP
    """
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out_file = os.path.join(tmp, "points.yaml")
        ctx = mp.start_processes(
            _worker,
            args=(nproc, _free_port(), backend, sizes, iters, out_file),
            nprocs=nproc,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout_s
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.terminate()
                raise TimeoutError(f"calibration did not finish within {timeout_s:.0f} s")
        data = yaml.safe_load(Path(out_file).read_text())
    return {c: [(float(n), float(t)) for n, t in pts] for c, pts in data.items()}


def run(args: argparse.Namespace) -> int:
    """Measure, fit, write the profile, print the fit errors."""
    from estimators.calibration import calibrated_profile
    from estimators.profiles import Cluster, load_cluster

    if args.nproc < 2:
        raise CommandError(f"--nproc must be >= 2 (collectives need two processes), got {args.nproc}")
    try:
        sizes = sorted({int(s) for s in str(args.sizes).split(",") if s.strip()})
    except ValueError:
        raise CommandError(f"--sizes must be comma-separated integers (bytes), got {args.sizes!r}") from None
    if len(sizes) < 2 or sizes[0] <= 0:
        raise CommandError("--sizes needs at least two positive sizes to fit alpha and beta")
    import torch

    gpus = torch.cuda.device_count()
    backend = args.backend or ("nccl" if gpus >= args.nproc else "gloo")
    if backend == "nccl" and gpus < args.nproc:
        raise CommandError(f"--backend nccl needs {args.nproc} GPUs, {gpus} visible")
    base = load_cluster(args.cluster or ("h100x8" if backend == "nccl" else "cpu-local"))
    print(
        f"calibrating {backend} collectives on {args.nproc} processes, sizes {sizes} B, {args.iters} iters",
        flush=True,
    )
    points = measure(args.nproc, sizes, args.iters, backend, args.timeout_s)
    profile = calibrated_profile(base, args.nproc, points, backend)
    cluster = Cluster.from_dict(profile, "<calibrated>")
    print(f"{'collective':<15}{'bytes':>12}{'measured ms':>14}{'fit ms':>10}{'error':>8}")
    for coll, pts in sorted(points.items()):
        for n, t in pts:
            model = cluster.fit_time_s(coll, args.nproc, "gpu", n)
            print(f"{coll:<15}{int(n):>12}{t * 1e3:>14.3f}{model * 1e3:>10.3f}{(model - t) / t:>8.1%}")
    out = Path(args.out or f"{profile['name']}.yaml")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(
        f"# written by: tensoropt calibrate --nproc {args.nproc}\n" + yaml.safe_dump(profile, sort_keys=False)
    )
    tmp.replace(out)
    print(f"wrote {out}", file=sys.stderr)
    return 0
