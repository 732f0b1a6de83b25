"""Profiled compute: time each operator's *local shard* with torch on this machine, cached on disk.

The roofline misjudges small shards (they run far below peak); this mode runs the node's real
aten op (from the exported program) at the local shapes a configuration gives one device,
forward then backward, and keeps the mean of a few repetitions (the slowest 10 % left out, as
``tensoropt calibrate`` summarises collectives: a step's average is the sum of its operators'
averages), on as many CPU threads as a worker gets (``OMP_NUM_THREADS``, 1 under torchrun with
several processes). On a CPU the ranks of one host compute the same shapes at the same moment
and share its cores' caches and memory bandwidth: ``co_runners`` threads run the same op on their
own tensors while it is timed (one per other rank on the host), so the timing carries that
contention (2-12 % on the fully-connected shapes of ``benchmarks/executor_vs_ddp.py`` on this
2-core machine; GPUs are timed alone). Results are cached in
``<cache_dir>/<device>.json`` keyed by device name + op + local shapes + dtypes + attributes,
so a later plan (another device count, another model sharing layer shapes) reuses them.
Anything that cannot be timed (an op whose arguments do not fit the local shapes) falls back to
the roofline, counted in ``fallbacks``.

Default cache directory: ``$TENSOROPT_CACHE`` or ``~/.cache/tensoropt``.

**The clock** (:func:`timing_clock`). On a CPU whose workers run one thread each (torchrun's
default), an op runs on the calling thread, forward and backward (autograd runs CPU backward on
the thread that calls it), so its cost is that thread's CPU time (``time.thread_time``): what the
op takes on a core of its own, which a dedicated host gives every rank. Wall time (``perf_counter``)
adds the time the thread waited for a core, i.e. whatever else the host ran meanwhile, and the
cache keeps it keyed by shape: measured on this 2-core machine at load 6-8, the decoder's (HF
GPT-2, width 256) data-parallel GEMMs were priced 843.7 ms a step from a wall-clock cache, 4x
the 217.5 ms of CPU the whole step's main thread spent (``benchmarks/fidelity.py``, docs/results.md
2026-11-28, branch ``fidelity2``). The co-running ranks' threads still share the caches and the
memory bandwidth: their stalls are CPU time of the timed thread. GPUs and multi-threaded CPU workers
keep the wall clock (kernels run asynchronously, or on other threads). Timings taken with the
thread clock have their own cache keys.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from estimators.calibration import summarise_s
from estimators.compute import LocalOp
from estimators.files import merge_json_file, read_json_object
from estimators.profiles import Device


def default_cache_dir() -> Path:
    """``$TENSOROPT_CACHE`` or ``~/.cache/tensoropt``.

    Example:
        >>> default_cache_dir().name in ("tensoropt", os.environ.get("TENSOROPT_CACHE", "tensoropt"))
        True
    """
    return Path(os.environ.get("TENSOROPT_CACHE") or Path.home() / ".cache" / "tensoropt")


#: Tag of how timings are taken; part of every cache key, so a change re-measures.
TIMING = "mean-v2"
# (a timing taken beside co-running ranks adds their count to its key)


def timing_clock(device_kind: str) -> str:
    """``"thread"`` (the timing thread's CPU time) for a CPU whose workers run one thread, else
    ``"wall"`` (see the module docstring: the thread clock leaves out the time the host gave others).

    Example:
        >>> timing_clock("gpu")
        'wall'
    """
    return "thread" if device_kind == "cpu" and worker_threads() == 1 else "wall"


def worker_threads() -> int:
    """CPU threads a training worker runs with: ``OMP_NUM_THREADS`` if set, else 1 (torchrun's default).

    Example:
        >>> worker_threads() >= 1
        True
    """
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "1")))
    except ValueError:
        return 1


#: Operators that compute one GEMM over their first operand's leading dims flattened: a linear on
#: (16, 64, 512) and on (8, 128, 512) is the same (1024 x 512) product, forward and backward, so they
#: share one timing (two timings of it differ only by noise, which the planner would otherwise trust:
#: a sequence split priced 15 % cheaper than the batch split of the same GEMM).
FLATTENED_GEMM_OPS = frozenset({"aten.linear.default"})


def gemm_shapes(node: dict, op: LocalOp) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """(operand shapes, output shape) as timed: a linear's leading dims flattened into one.

    Example:
        >>> op = LocalOp("linear", "float32", 0.0, ((16, 64, 512),), ("float32",), ((8, 512),), (16, 64, 8),
        ...              True, (True,))
        >>> gemm_shapes({"op": "aten.linear.default"}, op)
        (((1024, 512),), (1024, 8))
    """
    shapes, out = tuple(tuple(s) for s in op.in_shapes), tuple(op.out_shape)
    flattens = node["op"] in FLATTENED_GEMM_OPS and shapes and len(shapes[0]) > 2
    if not flattens or out[:-1] != shapes[0][:-1]:
        return shapes, out
    rows = 1
    for d in shapes[0][:-1]:
        rows *= d
    return ((rows, shapes[0][-1]),) + shapes[1:], (rows, out[-1])


def cache_key(device_name: str, node: dict, op: LocalOp, co_runners: int = 0, clock: str = "wall") -> str:
    """Stable key of one timing: device, aten op, local shapes and dtypes, attributes, what needs grad
    (and the co-running ranks, when there are any; the clock, when it is not the wall clock:
    :func:`timing_clock`; the op's ``variant``, when it has one). A linear's shapes are keyed as the
    GEMM it computes (:func:`gemm_shapes`).

    Example:
        >>> op = LocalOp("elementwise", "float32", 8.0, ((8,),), ("float32",), (), (8,), False, (True,))
        >>> cache_key("cpu", {"op": "aten.relu.default", "attrs": {}}, op) == cache_key(
        ...     "cpu", {"op": "aten.relu.default", "attrs": {}}, op)
        True
    """
    in_shapes, out_shape = gemm_shapes(node, op)
    text = json.dumps(
        [
            TIMING,
            worker_threads(),
            device_name,
            node["op"],
            in_shapes,
            op.in_dtypes,
            op.param_shapes,
            out_shape,
            op.dtype,
            op.has_params,
            op.inputs_need_grad,
            node.get("attrs") or {},
        ]
        + ([f"co-runners={co_runners}"] if co_runners else [])
        + ([f"clock={clock}"] if clock != "wall" else [])
        + ([f"variant={op.variant}"] if op.variant else []),
        sort_keys=True,
        default=str,
    )
    return hashlib.sha1(text.encode()).hexdigest()


class ProfiledCompute:
    """A ``compute_time`` callable for :class:`estimators.op_costs.CostModel` (profiled mode).

    Args:
        device: the profile of the device being timed (its name keys the cache).
        program: the ExportedProgram of the graph (``OpGraph.program``); without it every node
            falls back to the roofline.
        cache_dir: where the cache file lives (default :func:`default_cache_dir`).
        repeats: timed repetitions per shape (their mean, the slowest 10 % left out, is kept).
        variants: ``LocalOp.variant`` -> a callable taking the captured op's arguments that runs the op
            as the executor runs that variant (timed in the op's place; e.g. the synchronised batch
            norm, :func:`tensoropt.executor.ops.batch_norm.synchronized_batch_norm_alone`). An op whose
            variant is not here is timed as captured.

    Example:
        >>> from estimators.profiles import load_device
        >>> pc = ProfiledCompute(load_device("cpu"), program=None, cache_dir="/tmp/tensoropt-doc-cache")
        >>> op = LocalOp("elementwise", "float32", 8.0, ((8,),), ("float32",), (), (8,), False, (True,))
        >>> pc("x", {"op": "aten.relu.default", "attrs": {}}, None, op) is None
        True
    """

    def __init__(
        self, device: Device, program=None, cache_dir: str | os.PathLike | None = None, repeats: int = 10,
        co_runners: int = 0, clock: str | None = None, variants: dict[str, Callable] | None = None,
    ):
        self.device, self.program, self.repeats = device, program, repeats
        self.variants = dict(variants or {})
        self.co_runners = co_runners if device.kind == "cpu" else 0
        self.clock = clock or timing_clock(device.kind)
        if self.clock not in ("thread", "wall"):
            raise ValueError(f"profiled compute: clock must be 'thread' or 'wall', got {self.clock!r}")
        self.path = Path(cache_dir or default_cache_dir()) / f"{device.name}.json"
        self.cache: dict[str, list[float]] = read_json_object(self.path)
        self.fx_nodes = {n.name: n for n in program.graph.nodes} if program is not None else {}
        self.hits = self.measured = self.fallbacks = 0

    def __call__(self, name: str, node: dict, config, op: LocalOp) -> tuple[float, float] | None:
        """(forward, backward) seconds of the local shard, or None to use the roofline."""
        target = self.variants.get(op.variant) if op.variant else None
        if op.variant and target is None:  # a variant this timer cannot run: the captured op
            op = dataclasses.replace(op, variant="")
        key = cache_key(self.device.name, node, op, self.co_runners, self.clock)
        if key in self.cache:
            self.hits += 1
            return tuple(self.cache[key])
        fx_node = self.fx_nodes.get(name)
        if fx_node is None:
            self.fallbacks += 1
            return None
        walls: dict[str, list[float]] = {}
        try:
            fwd, bwd = time_local_op(fx_node, node, op, self.repeats, self.co_runners, self.clock, walls,
                                     target)
        except Exception:  # arguments that do not fit the local shapes: the roofline answers
            self.fallbacks += 1
            return None
        self.measured += 1
        self.cache[key] = [fwd, bwd]
        if self.clock == "thread":  # the same runs on the wall clock, under the wall clock's key
            self.cache.setdefault(cache_key(self.device.name, node, op, self.co_runners), walls["wall"])
        self._save()
        return fwd, bwd

    def _save(self) -> None:
        """Write the cache, merged (under a file lock) with what another timer or process wrote since."""
        self.cache = merge_json_file(self.path, self.cache)


def local_constant_shape(shape: tuple[int, ...], node: dict, op: LocalOp) -> tuple[int, ...]:
    """A buffer or constant operand's shape at the node's local shard: each dim (aligned from the right
    with the first input) that has the input's global size, where the shard's is smaller, takes the
    shard's size, as the executor lays the constant out beside that input (an attention mask
    ``(B, 1, T, T)`` expanded to the batch, beside ``q`` split on the batch). Before, the mask kept the
    global batch, the timing raised and attention fell back to the roofline: HF GPT-2's priced 2.4 ms
    against ~40 ms measured per layer (width 256, batch 4 a rank).

    Example:
        >>> op = LocalOp("sdpa", "float32", 0.0, ((4, 2, 16, 8),), ("float32",), (), (4, 2, 16, 8), False,
        ...              (True,))
        >>> local_constant_shape((8, 1, 16, 16), {"inputs": [{"shape": (8, 2, 16, 8)}]}, op)
        (4, 1, 16, 16)
    """
    if not node.get("inputs") or not op.in_shapes:
        return shape
    full, part = tuple(node["inputs"][0]["shape"]), tuple(op.in_shapes[0])
    out = list(shape)
    for d in range(len(shape)):
        j = d - (len(shape) - len(full))  # the input's dim aligned with this one (broadcasting)
        if 0 <= j < len(full) and shape[d] == full[j] != part[j] and shape[d] > 1:
            out[d] = part[j]
    return tuple(out)


def local_buffer_shape(shape: tuple[int, ...], node: dict, op: LocalOp) -> tuple[int, ...]:
    """A buffer or constant operand's shape at the node's local shard: one shaped as a parameter of the
    node (a batch norm's running statistics beside its weight) takes that parameter's local shape, as
    the executor lays it out (:func:`estimators.measure.local_buffer`'s rule); any other,
    :func:`local_constant_shape`. Before, a channel-split batch norm was timed with its whole running
    statistics beside its half of the channels: the op raised and the node fell back to the roofline
    (the CNN's leanest plan: its 7 batch norms priced 0.49 ms a step, their kernels clocked 1.73 ms in
    the replayed step, docs/results.md ``cnnprice``).

    Example:
        >>> op = LocalOp("batch_norm", "float32", 0.0, ((8, 2, 4, 4),), ("float32",), ((2,), (2,)),
        ...              (8, 2, 4, 4), True, (True,))
        >>> node = {"params": {"weight": (4,), "bias": (4,)}, "inputs": [{"shape": (8, 4, 4, 4)}]}
        >>> local_buffer_shape((4,), node, op)
        (2,)
    """
    for full, local in zip((node.get("params") or {}).values(), op.param_shapes):
        if tuple(full) == tuple(shape):
            return tuple(local)
    return local_constant_shape(shape, node, op)


def time_local_op(
    fx_node, node: dict, op: LocalOp, repeats: int = 10, co_runners: int = 0, clock: str = "wall",
    walls: dict | None = None, target: Callable | None = None,
) -> tuple[float, float]:
    """Run the aten op of ``fx_node`` at ``op``'s local shapes; mean forward and backward seconds,
    on the ``clock`` of :func:`timing_clock` (``"thread"``: the timing thread's CPU seconds).
    ``walls``, when given, receives ``"wall"``: the same runs' means on the wall clock. ``target``:
    what is run with the node's arguments (default the node's aten op; a variant's callable,
    :class:`ProfiledCompute`).

    The mean leaves the slowest 10 % of the repetitions out (:func:`estimators.calibration.summarise_s`);
    on the CPU the op runs on :func:`worker_threads` threads, as it will in a worker, while
    ``co_runners`` threads run it too, on tensors of their own (the host's other ranks).

    Example:
        >>> import torch
        >>> from tensoropt.capture import capture
        >>> g = capture(torch.nn.Linear(8, 4), (torch.randn(2, 8),))
        >>> fx = {n.name: n for n in g.program.graph.nodes}["linear"]
        >>> op = LocalOp("linear", "float32", 128.0, ((2, 8),), ("float32",), ((4, 8), (4,)), (2, 4), True,
        ...              (False,))
        >>> fwd, bwd = time_local_op(fx, g.nx.nodes["linear"], op, 2)
        >>> fwd > 0 and bwd > 0
        True
    """
    import torch

    from estimators.measure import call_arguments

    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    now = time.thread_time if clock == "thread" and dev.type == "cpu" else time.perf_counter
    call = target or fx_node.target
    params = iter(())
    inputs = list(zip(op.in_shapes, op.in_dtypes, op.inputs_need_grad))

    def tensor_for(entry: dict, arg) -> torch.Tensor:
        if entry["role"] == "input":
            shape, dtype, grad = inputs[entry["index"]]
            dt = getattr(torch, dtype)
            if dt.is_floating_point:
                return torch.randn(shape, dtype=dt, device=dev, requires_grad=grad)
            if dt == torch.bool:
                return torch.ones(shape, dtype=dt, device=dev)
            return torch.zeros(shape, dtype=dt, device=dev)  # indices / labels: 0 is always in range
        if entry["role"] == "param":
            return torch.randn(next(params), dtype=getattr(torch, op.dtype), device=dev, requires_grad=True)
        val = arg.meta.get("val")
        return torch.ones(local_buffer_shape(tuple(val.shape), node, op), dtype=val.dtype, device=dev)

    lock = threading.Lock()  # the argument builder walks one parameter-shape iterator

    def arguments():
        nonlocal params
        with lock:
            params = iter(op.param_shapes)
            args, kwargs = call_arguments(fx_node, node["operands"], tensor_for)
        leaves = [
            t for t in list(args) + list(kwargs.values()) if isinstance(t, torch.Tensor) and t.requires_grad
        ]
        return args, kwargs, leaves

    def once() -> tuple[float, float]:
        args, kwargs, leaves = arguments()
        sync()
        w0, t0 = time.perf_counter(), now()
        out = call(*args, **kwargs)
        out = out[0] if isinstance(out, (tuple, list)) else out
        sync()
        w1, t1 = time.perf_counter(), now()
        backward = bool(leaves and out.requires_grad)
        if backward:
            out.backward(torch.ones_like(out))
            sync()
        w2, t2 = time.perf_counter(), now()
        return t1 - t0, t2 - t1 if backward else 0.0, w1 - w0, w2 - w1 if backward else 0.0

    stop = threading.Event()

    def co_run() -> None:  # another rank of this host, computing the same shapes meanwhile
        try:
            args, kwargs, leaves = arguments()
            while not stop.is_set():
                out = call(*args, **kwargs)
                out = out[0] if isinstance(out, (tuple, list)) else out
                if leaves and out.requires_grad:
                    out.backward(torch.ones_like(out))
                    for t in leaves:
                        t.grad = None
        except Exception:  # noqa: BLE001 - the timed run raises the same error and falls back
            return

    threads = torch.get_num_threads()
    n_co = co_runners if dev.type == "cpu" else 0
    runners = [threading.Thread(target=co_run, daemon=True) for _ in range(n_co)]
    if dev.type == "cpu":
        torch.set_num_threads(worker_threads())
    try:
        for r in runners:
            r.start()
        once()  # warm-up
        runs = [once() for _ in range(max(1, repeats))]
    finally:
        stop.set()
        for r in runners:
            r.join()
        torch.set_num_threads(threads)
    if walls is not None:
        walls["wall"] = [summarise_s([r[2] for r in runs], "mean"), summarise_s([r[3] for r in runs], "mean")]
    return summarise_s([r[0] for r in runs], "mean"), summarise_s([r[1] for r in runs], "mean")
