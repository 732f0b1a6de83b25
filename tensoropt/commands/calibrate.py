"""``tensoropt calibrate --nproc N [--out FILE] [--overhead] [--memory]``: measure collectives (and the
executor's per-operator overhead and memory), fit, write a profile.

Starts N local processes with torchrun (:func:`tensoropt.launch.launch_module`; this module is
their entry point, :func:`main`; gloo on CPU, nccl when N GPUs are visible), times all-reduce,
all-gather, reduce-scatter, broadcast (and all-to-all where the backend has it) at several
sizes, fits ``time = alpha + beta * bytes`` per collective (estimators.calibration) and writes a
cluster profile YAML that ``cost_graph``/``tensoropt plan`` accept by path. Prints each point's
fit error.

With ``--overhead`` it also times one forward + backward of data-parallel MLPs of growing depth
(tiny layers, so the ops cost next to nothing) four ways on the same processes: the plain
module on the local batch shard, the executor's replayed local program (the default runtime:
the traced step, gradient all-reduce included, :mod:`tensoropt.executor.program.replay`), and the DTensor
interpreter running the plan on local tensors (a pure batch split) and sending every operator
through DTensor. The slope of each against the operator count
(:func:`estimators.overhead.fit_overhead`) minus the plain slope is the executor's host time
per operator; the profile prices the default runtime, so ``op_overhead_local_s`` and
``op_overhead_dtensor_s`` both take the replayed program's (every node of it runs on local
tensors), and ``redistribute_overhead_s`` the replay of a traced Replicate -> Shard
redistribution (no communication). The interpreter's slopes are reported beside them. They go
into the profile's device (see :mod:`estimators.overhead`).

With ``--memory`` it also measures the device's ``runtime_overhead_bytes`` and
``bytes_per_program_node`` (:func:`runtime_memory`: a tiny transformer's training-loop peak beyond
its tensors at two depths, in one worker process each), which the predicted peak memory adds per
process (:mod:`estimators.peak`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

from estimators.calibration import STATISTICS, summarise_s
from estimators.files import write_text_atomic
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
    p.add_argument("--nproc", type=int, default=None,
                   help="number of local processes (>= 2) for the collectives (not with --device)")
    p.add_argument("--out", default=None, help="profile YAML to write (default: ./<cluster>-calibrated.yaml)")
    p.add_argument(
        "--cluster",
        default=None,
        help="profile whose hardware the fit refines (default: cpu-local, or h100x8 with GPUs)",
    )
    p.add_argument(
        "--sizes", default=DEFAULT_SIZES, help=f"comma-separated byte sizes (default {DEFAULT_SIZES})"
    )
    p.add_argument("--iters", type=int, default=20, help="timed iterations per size (default 20)")
    p.add_argument(
        "--statistic",
        choices=STATISTICS,
        default="mean",
        help="what of the timed iterations the fit uses: mean (default; the slowest 10%% left out): "
        "what a step of several collectives adds up to on average, stalls included; median; "
        "fastest: the hardware's best case (a quiet dedicated cluster)",
    )
    p.add_argument(
        "--backend", choices=("gloo", "nccl"), default=None, help="default: nccl with GPUs, else gloo"
    )
    p.add_argument("--timeout-s", type=float, default=300.0, help="give up after this many seconds")
    p.add_argument(
        "--overhead",
        action="store_true",
        help="also measure the executor's per-operator and per-redistribution host overhead",
    )
    p.add_argument(
        "--device",
        action="store_true",
        help="measure this device instead of collectives (one process, CUDA when visible): GEMM "
        "efficiency per dtype, elementwise memory bandwidth and the per-kernel launch floor; writes a "
        "device profile (default ./<device>-measured.yaml)",
    )
    p.add_argument("--tiny", action="store_true", help="with --device: small sizes (a quick CPU check)")
    p.add_argument(
        "--memory",
        action="store_true",
        help="also measure the device's runtime_overhead_bytes and bytes_per_program_node (a tiny "
        "transformer's training-loop peak beyond its tensors at two depths)",
    )


def _collectives(backend: str) -> list[str]:
    out = ["all_reduce", "all_gather", "reduce_scatter", "broadcast"]
    return out + (["all_to_all"] if backend == "nccl" else [])


def _worker(
    backend: str, sizes: list[int], iters: int, out_file: str, overhead: bool = False,
    statistic: str = "mean", timeout_s: float = 300.0,
) -> None:
    """One rank torchrun started (:func:`main`): time every collective at every size; rank 0 writes
    ``{collective: [[bytes, s], ...]}`` to ``out_file``."""
    import datetime

    import torch
    import torch.distributed as dist

    rank, nproc = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))  # torchrun's env://
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

                # the model's n: all-to-all counts bytes per device, the others the full tensor
                seconds = _timed_s(call, iters, 2, device, statistic)
                results.setdefault(coll, []).append([float(numel * 4), seconds])
        if overhead:
            results["executor_overhead"] = _overhead_points(nproc, backend, max(iters, 20), statistic)
        if rank == 0:
            Path(out_file).write_text(yaml.safe_dump(results))
    finally:
        from tensoropt.executor.state.worker import end_process_group

        end_process_group()


BUSY_S = 1e-3
"""Host compute before each timed call. In a training step a collective follows the compute that
produced its input, not a barrier: on a CPU host its threads have gone to sleep meanwhile and the
wake-up is part of what it costs (gloo on 2 cores: +1-3 ms on a fraction of the calls)."""


def _times_s(fn, iters: int, warmup: int, device) -> list[float]:
    """This rank's times of ``iters`` calls of ``fn`` (after ``warmup``): each after a barrier and
    :data:`BUSY_S` of compute, as in a step."""
    import torch
    import torch.distributed as dist

    times = []
    busy = torch.ones(128, 128)
    for i in range(iters + warmup):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < BUSY_S:  # as in a step: the collective follows compute
            busy @ busy
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def _slowest_rank(value_s: float, device) -> float:
    """The largest of every rank's ``value_s`` (a collective)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([value_s], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _timed_s(fn, iters: int, warmup: int, device, statistic: str) -> float:
    """``statistic`` (:func:`summarise_s`) of ``iters`` timed calls of ``fn``, the slowest rank's figure."""
    return _slowest_rank(summarise_s(_times_s(fn, iters, warmup, device), statistic), device)


OVERHEAD_DEPTHS = (1, 8, 32, 64)
"""Hidden layers of the MLPs the overhead calibration times (2 operators each: linear + relu; 4 to 130
operators). Each timed replayed step carries its gradient all-reduce, whose jitter on gloo (~0.3 ms)
was larger than what 34 operators cost: depths up to 16 gave 5.9-24.9 us per operator in three
quiet runs, depths up to 64 gave 6.3-10.3 us."""


def _overhead_points(nproc: int, backend: str, iters: int, statistic: str = "mean") -> dict[str, list]:
    """(operators, forward + backward seconds) per way of running, and redistribution times.

    Runs inside the calibration workers (the process group is up). Returns ``{"plain": [[ops, s],
    ...], "local": [...], "dtensor": [...], "redistribute": [[0, s]]}``.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from tensoropt.baselines import data_parallel_index
    from tensoropt.capture import capture
    from tensoropt.config import Job
    from tensoropt.configspace import configurations
    from tensoropt.configspace.configuration import Mesh
    from tensoropt.executor.job.data import synthetic_batch
    from tensoropt.executor.job.plan import ExecPlan
    from tensoropt.executor.job.spec import TrainSpec
    from tensoropt.training.trainer import Trainer

    rank = dist.get_rank()
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    width = 8
    cases = []  # (way, operators, callable)
    mesh = Mesh((nproc,), ("gpu",))
    trainer = None
    for depth in OVERHEAD_DEPTHS:
        kwargs = {"in_features": width, "hidden": [width] * depth, "num_classes": width}
        job = Job.from_dict({"model": {"name": "mlp", "kwargs": kwargs, "input_shape": [width],
                                       "num_classes": width},
                             "cluster": "cpu-local", "devices": [nproc],
                             "training": {"global_batch_size": 4 * nproc, "optimizer": "sgd"}})
        spec = TrainSpec.from_job(job, steps=1)
        model = spec.build_model().to(device)
        batch = synthetic_batch(list(spec.inputs), spec.global_batch_size, spec.seed, 0)
        batch = [t.to(device) for t in batch]
        placements = {name: confs[data_parallel_index(confs, mesh)]
                      for name, confs in configurations(capture(model, tuple(batch)), mesh).items()}
        trainer = Trainer(spec, ExecPlan("calibrate", mesh, placements), mode="replay")
        values = trainer._placeholder_values(trainer.batch(0))
        ops = sum(1 for n in trainer.ep.graph.nodes if n.op == "call_function")
        trainer.program.program(values)  # traced here, not timed

        def replay(trainer=trainer, values=values):
            trainer.program.run(values)
            for p in trainer.params.values():
                p.grad = None
        cases.append(("replay", ops, replay))
        interp = trainer.interpreter
        if interp.batch_axes is None:
            raise RuntimeError("calibrate --overhead: the data-parallel MLP plan should run on local tensors")
        modes = {"local": (dict(interp.local), interp.batch_axes), "dtensor": ({}, None)}
        for way, mode in modes.items():
            def step(trainer=trainer, values=values, mode=mode):
                trainer.interpreter.local, trainer.interpreter.batch_axes = mode
                loss = trainer.interpreter.run(*values)
                (loss[0] if isinstance(loss, (tuple, list)) else loss).backward()
                trainer.grad_sync.finish()  # one bucket: a constant per step, not in the slope
                for p in trainer.params.values():
                    p.grad = None
            cases.append((way, ops, step))
        shards = [t.chunk(nproc)[rank] for t in batch]

        def plain(model=model, shards=shards):
            model(*shards).backward()
            model.zero_grad(set_to_none=True)
        cases.append(("plain", ops, plain))
    rep = distribute_tensor(torch.ones(4 * nproc, width, device=device), trainer.mesh, [Replicate()])
    cases.append(("redistribute", 0, lambda: rep.redistribute(placements=[Shard(0)])))
    cases.append(("redistribute_replay", 0, _traced_redistribution(rep)))
    # rounds over every case: a burst of load from elsewhere hits one repetition of each case
    # rather than every repetition of one case
    # (each repetition's figure is the slowest rank's)
    times: list[list[float]] = [[] for _ in cases]
    for _ in range(iters):
        for i, (_, _, fn) in enumerate(cases):
            times[i].append(_timed_s(fn, 1, 1, device, "fastest"))
    out: dict[str, list[list[float]]] = {}
    for (way, ops, _), t in zip(cases, times):
        out.setdefault(way, []).append([ops, summarise_s(t, statistic)])
    return out


def _traced_redistribution(rep):
    """The replayed local program of ``rep``'s Replicate -> Shard(0) redistribution (a callable)."""
    import torch
    from torch.distributed.tensor import DTensor, Shard
    from torch.fx.experimental.proxy_tensor import make_fx

    def redistribute(local):
        whole = DTensor.from_local(local, rep.device_mesh, rep.placements, run_check=False)
        return whole.redistribute(placements=[Shard(0)]).to_local()

    local = rep.to_local()
    gm = make_fx(redistribute)(local)
    return torch.no_grad()(lambda: gm(local))


def measure(nproc: int, sizes: list[int], iters: int, backend: str, timeout_s: float,
            overhead: bool = False, statistic: str = "mean") -> dict:
    """Start ``nproc`` processes with the project's launcher and return {collective: [(bytes, seconds), ...]}.

    The processes are torchrun's (:func:`tensoropt.launch.launch_module`, standalone: the
    rendezvous binds its own port, so two calibrations at once cannot race for one).

    Example:
        >>> measure(2, [4096, 65536], 2, "gloo", 120)  # starts torchrun worker processes  # doctest: +SKIP
    """
    from tensoropt.launch import LaunchOptions, launch_module

    with tempfile.TemporaryDirectory(prefix="tensoropt-calibrate-") as tmp:
        out_file = os.path.join(tmp, "points.yaml")
        config = {"backend": backend, "sizes": sizes, "iters": iters, "out_file": out_file,
                  "overhead": overhead, "statistic": statistic, "timeout_s": timeout_s}
        config_file = os.path.join(tmp, "calibrate.json")
        Path(config_file).write_text(json.dumps(config))
        opts = LaunchOptions(nproc, timeout_s=timeout_s)
        rc = launch_module("tensoropt.commands.calibrate", [config_file], opts)
        if rc == 124:
            raise TimeoutError(f"calibration did not finish within {timeout_s:.0f} s")
        if rc != 0:
            raise CommandError(f"calibration workers failed (torchrun exit code {rc}); errors above")
        data = yaml.safe_load(Path(out_file).read_text())
    extra = data.pop("executor_overhead", None)
    out = {c: [(float(n), float(t)) for n, t in pts] for c, pts in data.items()}
    if extra is not None:
        out["executor_overhead"] = extra
    return out


def overhead_profile_keys(points: dict, nproc: int, backend: str, statistic: str = "mean") -> dict:
    """Device keys (and their sources) fitted from :func:`_overhead_points`' measurements.

    Example:
        >>> pts = {"plain": [[4, 1e-3], [8, 1.2e-3]], "local": [[4, 2e-3], [8, 2.6e-3]],
        ...        "dtensor": [[4, 3e-3], [8, 4e-3]], "redistribute": [[0, 5e-5]]}
        >>> keys = overhead_profile_keys(pts, 2, "gloo")
        >>> round(keys["op_overhead_local_s"] * 1e6), round(keys["op_overhead_dtensor_s"] * 1e6)
        (100, 200)
    """
    from estimators.overhead import fit_overhead

    ways = [w for w in ("plain", "replay", "local", "dtensor") if w in points]
    slope = {w: fit_overhead([p[0] for p in points[w]], [p[1] for p in points[w]])[1] for w in ways}
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    counts = ", ".join(str(int(p[0])) for p in points["plain"])
    what = {"mean": "mean (slowest 10 % left out)", "median": "median", "fastest": "fastest"}[statistic]
    why = (f"tensoropt calibrate --overhead --nproc {nproc} ({backend}, {stamp}): slope of the {what} "
           f"forward+backward of data-parallel MLPs with {counts} operators, minus the plain module's slope")
    if "replay" in slope:  # the default runtime: every node of the replayed program runs on local tensors
        per_op = max(0.0, slope["replay"] - slope["plain"])
        replayed = (why + " (the replayed local program; the DTensor interpreter measured "
                    + ", ".join(f"{w} {max(0.0, slope[w] - slope['plain']) * 1e6:.1f} us"
                                for w in ("local", "dtensor") if w in slope) + ")")
        return {
            "op_overhead_local_s": per_op, "op_overhead_dtensor_s": per_op,
            "redistribute_overhead_s": float(points["redistribute_replay"][0][1]),
            "sources": {
                "op_overhead_local_s": replayed, "op_overhead_dtensor_s": replayed,
                "redistribute_overhead_s": f"tensoropt calibrate --overhead --nproc {nproc} ({backend}, "
                f"{stamp}): {what} replayed traced Replicate -> Shard(0) redistribution of a 4N x 8 tensor "
                "(no communication)",
            },
        }
    return {
        "op_overhead_local_s": max(0.0, slope["local"] - slope["plain"]),
        "op_overhead_dtensor_s": max(0.0, slope["dtensor"] - slope["plain"]),
        "redistribute_overhead_s": float(points["redistribute"][0][1]),
        "sources": {
            "op_overhead_local_s": why + " (the plan run on local tensors)",
            "op_overhead_dtensor_s": why + " (operators through DTensor)",
            "redistribute_overhead_s": f"tensoropt calibrate --overhead --nproc {nproc} ({backend}, "
            f"{stamp}): {what} DTensor Replicate -> Shard(0) redistribution of a 4N x 8 tensor (no "
            "communication)",
        },
    }


MEMORY_CALIBRATION_LAYERS = (1, 4)
"""Depths of the tiny decoder-only transformer ``--memory`` trains (:func:`memory_calibration_job`):
two replayed programs of different node counts, for the slope and the intercept."""


def memory_calibration_job(layers: int):
    """The job ``tensoropt calibrate --memory`` trains: the zoo ``gpt`` at width 64, 4 heads,
    vocabulary 256, sequence 32, ``layers`` blocks, batch 8, AdamW, planned for 1 device of cpu-local.

    Example:
        >>> memory_calibration_job(1).model.kwargs["layers"]
        1
    """
    from tensoropt.config import Job

    return Job.from_dict({
        "model": {"name": "gpt", "kwargs": {"vocab_size": 256, "seq_len": 32, "layers": layers, "width": 64,
                                            "heads": 4, "dropout": 0.0}},
        "training": {"global_batch_size": 8, "optimizer": "adamw", "learning_rate": 0.001},
        "cluster": "cpu-local", "devices": [1]})


def runtime_memory_point(layers: int, steps: int = 3, timeout_s: float = 300.0) -> tuple[int, int]:
    """(traced program nodes, peak bytes beyond the memory model's tensors) of one 1-process run of
    :func:`memory_calibration_job` (``layers``) through the executor's worker: ``measured.peak_bytes``
    minus ``predicted.peak_bytes`` without its runtime terms (:mod:`estimators.peak`).

    Example:
        >>> runtime_memory_point(1)  # starts a worker process  # doctest: +SKIP
        (219, 13683712)
    """
    from estimators.peak import program_bytes
    from estimators.profiles import load_cluster
    from tensoropt.executor.job.spec import TrainSpec
    from tensoropt.launch import LaunchOptions, launch_workers
    from tensoropt.planner import plan_job
    from tensoropt.plans import plan_file_text

    job = memory_calibration_job(layers)
    frontier = plan_job(job).to_json()
    plan = json.loads(plan_file_text(frontier, frontier["frontiers"][0]["plans"][0]["id"]))
    spec = TrainSpec.from_job(job, steps=steps)
    with tempfile.TemporaryDirectory(prefix="tensoropt-memory-") as tmp:
        metrics = Path(tmp) / "metrics.json"
        config = {"steps": steps, "runs": [{"spec": spec.to_json(), "plan": plan, "metrics": str(metrics)}]}
        rc = launch_workers(config, LaunchOptions(1, timeout_s=timeout_s))
        if rc != 0 or not metrics.exists():
            raise CommandError(f"calibrate --memory: the {layers}-layer model's run failed (exit {rc})")
        m = json.loads(metrics.read_text())
    device = load_cluster(job.cluster).device
    nodes = int(m.get("executor", {}).get("traced_nodes", 0))
    tensors = (m["predicted"]["peak_bytes"] - device.runtime_overhead_bytes
               - program_bytes(nodes, device.bytes_per_program_node))
    return nodes, int(m["measured"]["peak_bytes"]) - tensors


def runtime_memory(steps: int = 3, timeout_s: float = 300.0) -> tuple[dict[str, int], str]:
    """The device profile's ``runtime_overhead_bytes`` and ``bytes_per_program_node``, and their citation.

    A tiny transformer of :data:`MEMORY_CALIBRATION_LAYERS` depths is trained in 1-process launches
    of the executor's worker (:func:`runtime_memory_point`); what each peak holds beyond the memory
    model's tensors is the runtime's own memory, a line in the replayed program's node count as
    traced: its slope is ``bytes_per_program_node`` (the trace's and the program's Python objects),
    its intercept ``runtime_overhead_bytes`` (the kernels' code paged in, the autograd engine, the
    allocator's slack). :mod:`estimators.peak` adds both to the predicted peak.

    Example:
        >>> runtime_memory()  # starts worker processes  # doctest: +SKIP
        ({'runtime_overhead_bytes': 11848704, 'bytes_per_program_node': 8396}, 'tensoropt calibrate ...')
    """
    import datetime

    points = [runtime_memory_point(layers, steps, timeout_s) for layers in MEMORY_CALIBRATION_LAYERS]
    (n1, b1), (n2, b2) = points
    if n2 <= n1:
        raise CommandError(f"calibrate --memory: the deeper model traced {n2} nodes, not more than {n1}; "
                           "is the executor's mode replay?")
    per_node = max(0, round((b2 - b1) / (n2 - n1)))
    overhead = max(0, round(b1 - per_node * n1))
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    why = (f"tensoropt calibrate --memory ({stamp}, load average {load:.1f}): measured.peak_bytes beyond the "
           f"memory model's tensors of a tiny GPT (width 64, vocabulary 256, seq 32, batch 8, AdamW) with "
           f"{MEMORY_CALIBRATION_LAYERS} blocks in one worker process each: {b1 / 2**20:.1f} MiB at {n1} "
           f"traced program nodes, {b2 / 2**20:.1f} MiB at {n2}; the line's intercept and slope "
           "(tensoropt/executor/state/peak_memory.py, estimators/peak.py)")
    return {"runtime_overhead_bytes": overhead, "bytes_per_program_node": per_node}, why


def run_device(args: argparse.Namespace) -> int:
    """``--device``: time this device's kernels, write the measured device profile, print the table."""
    from estimators.device_fit import gemm_efficiency
    from estimators.profiles import Device, ProfileError, load_device
    from tensoropt.commands.calibrate_device import calibrate_device

    base = None
    if args.cluster:  # a device profile's name, or a cluster's (its device)
        try:
            base = load_device(args.cluster)
        except (ProfileError, FileNotFoundError):
            from estimators.profiles import load_cluster

            base = load_cluster(args.cluster).device
    profile, timings = calibrate_device(base.name if base else None, tiny=args.tiny)
    Device.from_dict(profile, "<measured>")  # refuses what the loader would refuse, before writing
    datasheet = load_device(base.name if base else profile["name"].removesuffix("-measured"))
    desc = timings["device"]
    print(f"device: {desc['name']} (torch {desc['torch']}, driver {desc.get('driver')})")
    print(f"{'gemm':<22}{'ms':>10}{'TFLOP/s':>10}{'of peak':>9}")
    for row in timings["gemms"]:
        size = f"{row['dtype']} {row['m']}^3"
        tflops = 2 * row["m"] * row["n"] * row["k"] / row["time_s"] / 1e12
        eff = gemm_efficiency(row, datasheet)
        print(f"{size:<22}{row['time_s'] * 1e3:>10.3f}{tflops:>10.1f}{eff:>9.1%}")
    for row in timings["bandwidth"]:
        gbps = row["bytes"] / row["time_s"] / 1e9
        print(f"{row['kind']:<22}{row['time_s'] * 1e3:>10.3f}{gbps:>10.0f} GB/s")
    print(f"kernel launch: {timings['kernel_launch_s'] * 1e6:.2f} us; matmul_efficiency "
          f"{profile['matmul_efficiency']:.3f}, memory_efficiency {profile['memory_efficiency']:.3f}")
    out = Path(args.out or f"{profile['name']}.yaml")
    header = "# written by: tensoropt calibrate --device" + (" --tiny" if args.tiny else "") + "\n"
    write_text_atomic(out, header + yaml.safe_dump(profile, sort_keys=False))
    print(f"wrote {out}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Measure, fit, write the profile, print the fit errors."""
    from estimators.calibration import calibrated_profile
    from estimators.profiles import Cluster, load_cluster

    if getattr(args, "device", False):
        return run_device(args)
    if args.nproc is None:
        raise CommandError("--nproc is required to calibrate collectives (or pass --device to measure "
                           "this device's kernels)")
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
    statistic = getattr(args, "statistic", "mean")
    points = measure(args.nproc, sizes, args.iters, backend, args.timeout_s, args.overhead, statistic)
    extra = points.pop("executor_overhead", None)
    profile = calibrated_profile(base, args.nproc, points, backend, statistic=statistic)
    if extra is not None:
        fitted = overhead_profile_keys(extra, args.nproc, backend, statistic)
        profile["device"].update({k: v for k, v in fitted.items() if k != "sources"})
        profile["device"]["sources"].update(fitted["sources"])
        for way in ("plain", "replay", "local", "dtensor"):
            print(f"{way:<9}" + "  ".join(f"{int(n)} ops {t * 1e3:.3f} ms" for n, t in extra[way]))
        print("executor overhead: " + ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in fitted.items()
                                                 if k != "sources"))
    if getattr(args, "memory", False):
        constants, why = runtime_memory(timeout_s=args.timeout_s)
        profile["device"].update(constants)
        profile["device"]["sources"].update({key: why for key in constants})
        print(f"runtime memory: {constants['runtime_overhead_bytes'] / 2**20:.1f} MiB per process + "
              f"{constants['bytes_per_program_node'] / 2**10:.1f} KiB per traced program node", flush=True)
    cluster = Cluster.from_dict(profile, "<calibrated>")
    print(f"{'collective':<15}{'bytes':>12}{'measured ms':>14}{'fit ms':>10}{'error':>8}")
    for coll, pts in sorted(points.items()):
        for n, t in pts:
            model = cluster.fit_time_s(coll, args.nproc, "gpu", n)
            print(f"{coll:<15}{int(n):>12}{t * 1e3:>14.3f}{model * 1e3:>10.3f}{(model - t) / t:>8.1%}")
    out = Path(args.out or f"{profile['name']}.yaml")
    header = f"# written by: tensoropt calibrate --nproc {args.nproc}\n"
    write_text_atomic(out, header + yaml.safe_dump(profile, sort_keys=False))
    print(f"wrote {out}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """The calibration worker torchrun starts: ``python -m tensoropt.commands.calibrate CONFIG.json``.

    CONFIG.json holds :func:`_worker`'s arguments (written by :func:`measure`).
    """
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m tensoropt.commands.calibrate CONFIG.json (started by tensoropt calibrate)",
              file=sys.stderr)
        return 2
    _worker(**json.loads(Path(argv[0]).read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
