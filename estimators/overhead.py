"""The executor's framework overhead: what a step costs beyond the ops' own compute and the collectives.

The torch executor (:mod:`tensoropt.executor.program.interpreter`) runs a plan whose nodes are all pure
batch splits laid out alike (:func:`batch_local`: data parallelism of an MLP) as a whole on local
tensors, as DDP does; any other plan goes operator by operator through DTensor's dispatch
(sharding propagation, output wrapping, DTensor autograd), except batch-split cross entropy
and mse_loss (:func:`runs_local`). Both cost host time per operator on top of the op itself, forward and
backward; so does every DTensor redistribution on top of its collective. On a GPU that host time
overlaps with the asynchronous kernels; on a CPU it adds to the step.

Per-step time model (seconds), each constant from the device profile:

    node:  compute (roofline or profiled) + optimizer
           + op_overhead_local_s    if the node is a pure batch split (:func:`batch_local`)
           + op_overhead_dtensor_s  otherwise (x the operators of an explicit implementation:
                                    class-split cross entropy, :data:`CLASS_SPLIT_CROSS_ENTROPY`)
    edge:  collectives (alpha-beta fits) + redistribute_overhead_s per redistribution, per direction

The objective stays additive: a node is charged the local overhead when *it* is a pure batch
split, although the executor runs it locally only when the whole plan is (an approximation for
mixed plans, exact for data parallelism and for plans without batch-split nodes).

``tensoropt calibrate --overhead`` measures the three constants (the fit is
:func:`fit_overhead`); without a measurement they are 0 (GPU profiles: host dispatch hides
behind the kernels of large operators; calibrate on the machine to model small ones).

The executor's default runtime replays a local program traced from the interpreter
(:mod:`tensoropt.executor.program.replay`): every node of it runs on local tensors, DTensor's dispatch
is paid once at trace time, so calibrate prices both per-operator constants with the replayed
program's slope (9.6 us per operator, forward + backward, on the cpu profile; the interpreter
measured 62 us on local tensors and 588 us through DTensor in the same run) and
``redistribute_overhead_s`` with the replay of a traced redistribution. The distinction between
the two constants remains for profiles calibrated for the interpreter (``executor.mode:
interpret``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from estimators.profiles import Device
from estimators.vocab_parallel import class_axes

LOCAL_PACKETS = frozenset({"cross_entropy_loss", "mse_loss"})
"""Aten overload packets the executor may run on local shards inside a DTensor plan."""

BATCH_LOCAL_PACKETS = frozenset({"linear", "relu", "gelu", "silu", "tanh", "sigmoid", "cross_entropy_loss"})
"""Aten packets whose batch split is purely local (no size argument, no RNG, no batch statistics).
mse_loss is not among them: ``F.mse_loss`` captures as ``broadcast_tensors`` + ``mse_loss``, so its plans
go through the interpreter's operator path, which runs a batch-split mse_loss locally (:func:`runs_local`)."""


CLASS_SPLIT_CROSS_ENTROPY = (42, 0)
"""Program nodes and DTensor redistributions of the executor's class-split cross entropy
(:mod:`tensoropt.executor.ops.vocab_parallel`: the row maxima, shift, pick, ``exp``, the packed sums,
the softmax kept for backward, the masked mean and its backward: 38 nodes traced by ``make_fx``
on one rank, plus the two all-reduces and their waits; the fused op it replaces traces as 10),
each charged its overhead (the all-reduces' time is the node's communication,
:mod:`estimators.vocab_parallel`)."""


def _packet(node: dict) -> str:
    op = str(node.get("op", ""))
    return op.split(".")[1] if op.startswith("aten.") and op.count(".") >= 2 else ""


def batch_local(node: dict, config) -> bool:
    """Whether ``node`` under ``config`` is a pure batch split: every activation and the output in one
    layout of ``"S(0)"`` / ``"R"`` per axis, parameters replicated, no option; a batch-split cross
    entropy (its mean is one all-reduce). A plan whose nodes are all such, laid out alike (no
    redistribution between them), runs as a whole on local tensors, as DDP does
    (:class:`tensoropt.executor.program.interpreter.PlanInterpreter`).

    Example:
        >>> from tensoropt.configspace.configuration import Configuration
        >>> node = {"op": "aten.linear.default", "kind": "linear", "inputs": [{"shape": (4, 8)}]}
        >>> batch_local(node, Configuration("batch=2", (("batch", (0,)),), (("S(0)",),), (("w", ("R",)),),
        ...                                 ("S(0)",)))
        True
    """
    if config is None or config.options or any(p != "R" for _, lay in config.params for p in lay):
        return False
    out = tuple(config.output)
    if node.get("kind") == "input":
        return all(p in ("S(0)", "R") for p in out)
    packet = _packet(node)
    if packet not in BATCH_LOCAL_PACKETS:
        return False
    if packet == "cross_entropy_loss":
        return runs_local(node, config)
    inputs = [_normalise(lay, len(e["shape"])) for lay, e in zip(config.inputs, node["inputs"])]
    return not config.partial_axes and all(p in ("S(0)", "R") for p in out) and all(i == out for i in inputs)


def _shard(p: str) -> int | None:
    return int(p[2:-1]) if p.startswith("S(") else None


def _normalise(layout, ndim: int) -> tuple[str, ...]:
    out = []
    for p in layout:
        d = _shard(p)
        out.append(f"S({d + ndim})" if d is not None and d < 0 else p)
    return tuple(out)


def runs_local(node: dict, config) -> bool:
    """Whether the executor runs ``node`` under ``config`` on local shards (no DTensor dispatch).

    Example:
        >>> from tensoropt.configspace.configuration import Configuration
        >>> node = {"op": "aten.cross_entropy_loss.default", "inputs": [{"shape": (4, 8)}, {"shape": (4,)}]}
        >>> runs_local(node, Configuration("batch=2", (("batch", (0,)),), (("S(0)",), ("S(0)",)), (), ("R",),
        ...                                partial_axes=(0,)))
        True
    """
    if _packet(node) not in LOCAL_PACKETS or config.options:
        return False
    inputs = [_normalise(lay, len(e["shape"])) for lay, e in zip(config.inputs, node["inputs"])]
    if _packet(node) == "mse_loss":  # prediction and target of one shape, split alike on dim 0
        shapes = [tuple(e["shape"]) for e in node["inputs"]]
        return len(inputs) == 2 and shapes[0] == shapes[1] and all(
            p == q and p in ("R", "S(0)") for p, q in zip(*inputs))
    if len(inputs) != 2 or len(node["inputs"][0]["shape"]) != 2 or len(node["inputs"][1]["shape"]) != 1:
        return False
    attrs = node.get("attrs") or {}
    if attrs.get("label_smoothing") or attrs.get("reduction", "mean") not in ("mean", 1):  # capture names it
        return False
    return all(z == y and z in ("R", "S(0)") for z, y in zip(*inputs))


def node_overhead_s(device: Device, node: dict, config) -> float:
    """Executor overhead of one operator (forward + backward) under ``config``.

    Example:
        >>> from estimators.profiles import load_device
        >>> node_overhead_s(load_device("h100-sxm-80gb"), {"op": "aten.relu.default", "kind": "elementwise",
        ...     "inputs": [{"shape": (4,)}]}, None)
        0.0
    """
    if node.get("kind") == "input":
        return 0.0
    if batch_local(node, config):
        return device.op_overhead_local_s
    if config is not None and class_axes(node, config.inputs):  # estimators/vocab_parallel.py
        ops, redistributions = CLASS_SPLIT_CROSS_ENTROPY
        return ops * device.op_overhead_dtensor_s + 2 * redistributions * device.redistribute_overhead_s
    return device.op_overhead_dtensor_s


def fit_overhead(counts: Sequence[float], times_s: Sequence[float]) -> tuple[float, float]:
    """Least-squares line ``time = base + per_op * count``: (base_s, per_op_s), per_op kept >= 0.

    The calibration times one step of chains of ``count`` operators; the slope is the cost of one
    more operator (its compute is subtracted by the caller, through the same fit on plain eager).

    Example:
        >>> base, per_op = fit_overhead([4, 8, 16, 32], [1e-3 + 5e-5 * n for n in (4, 8, 16, 32)])
        >>> round(base * 1e3, 6), round(per_op * 1e6, 6)
        (1.0, 50.0)
    """
    n = np.asarray(counts, dtype=np.float64)
    t = np.asarray(times_s, dtype=np.float64)
    if n.shape != t.shape or len(set(n.tolist())) < 2:
        raise ValueError("need timings at two or more distinct operator counts to fit the per-operator cost")
    slope, base = np.polyfit(n, t, 1)
    if slope < 0:
        return float(np.mean(t)), 0.0
    return float(base), float(slope)
