"""Time of a class-split (vocabulary-parallel) cross entropy's collectives (torch-free).

The executor runs a cross entropy whose 2-D logits ``N x V`` are split on the class dim (``S(1)``
over some mesh axes, its class axes) as :mod:`tensoropt.executor.ops.vocab_parallel` does: in forward,
per class axis, one all-reduce (max) of the ``N_local`` row maxima and one all-reduce (sum) of the
packed ``[sum of exponentials, target logit]`` (``2 N_local`` numbers), both blocking (the loss
waits on them); nothing in backward. ``N_local`` is the row count over the axes that split the
batch (``S(0)``). Both are priced by :meth:`estimators.collectives.CommModel.time_s` (latency and
bytes: on the 2-process gloo profile ~2.3 ms, what the node cost left out before). The local
arithmetic is the fused op's work, which profiled compute times at the local shapes.

Example:
    >>> from estimators.profiles import load_cluster
    >>> from estimators.collectives import CommModel
    >>> from estimators.configuration import Mesh
    >>> cm = CommModel(load_cluster("cpu-local"), Mesh((2,), ("gpu",)))
    >>> node = {"kind": "cross_entropy", "op": "aten.cross_entropy_loss.default",
    ...         "inputs": [{"shape": (1024, 4096)}, {"shape": (1024,)}]}
    >>> class_split_time_s(cm, node, (("S(1)",), ("R",))) > 2e-3
    True
    >>> class_split_time_s(cm, node, (("S(0)",), ("S(0)",)))
    0.0
"""

from __future__ import annotations

import math

from estimators.collectives import CommModel

LOSS_ITEMSIZE = 4
"""The reductions run in float32 (half-precision logits are upcast)."""


def _shard_dim(p: str, ndim: int) -> int | None:
    if not str(p).startswith("S("):
        return None
    d = int(p[2:-1])
    return d + ndim if d < 0 else d


def class_axes(node: dict, inputs) -> tuple[int, ...]:
    """Mesh axes splitting the class dim of a 2-D cross entropy's logits (``()`` if not one).

    Example:
        >>> node = {"op": "aten.cross_entropy_loss.default", "inputs": [{"shape": (8, 16)}, {"shape": (8,)}]}
        >>> class_axes(node, (("S(0)", "S(1)"), ("S(0)", "R"))), class_axes(node, (("R",), ("R",)))
        ((1,), ())
    """
    is_loss = str(node.get("op", "")).startswith("aten.cross_entropy_loss")
    if not is_loss or not inputs or not node.get("inputs"):
        return ()
    shape = node["inputs"][0]["shape"]
    if len(shape) != 2:
        return ()
    return tuple(a for a, p in enumerate(inputs[0]) if _shard_dim(p, 2) == 1)


def class_split_time_s(comm: CommModel, node: dict, inputs) -> float:
    """Seconds of a class-split cross entropy's forward all-reduces (0 when the classes are not split).

    Args:
        comm: collective cost model of the mesh.
        node: the cross-entropy node (its first input the ``N x V`` logits).
        inputs: the configuration's operand layouts (``Configuration.inputs``).

    Example:
        >>> from estimators.profiles import load_cluster
        >>> from estimators.configuration import Mesh
        >>> cm = CommModel(load_cluster("h100x8"), Mesh((2,), ("gpu",)))
        >>> node = {"op": "aten.cross_entropy_loss.default",
        ...         "inputs": [{"shape": (64, 512)}, {"shape": (64,)}]}
        >>> t = class_split_time_s(cm, node, (("S(1)",), ("R",)))
        >>> t == (cm.blocking_time_s("all_reduce", 64 * 4, (0,))
        ...       + cm.blocking_time_s("all_reduce", 2 * 64 * 4, (0,)))
        True
    """
    axes = class_axes(node, inputs)
    if not axes:
        return 0.0
    rows = node["inputs"][0]["shape"][0]
    batch_ways = math.prod(comm.mesh.shape[a] for a, p in enumerate(inputs[0]) if _shard_dim(p, 2) == 0)
    local_rows = math.ceil(rows / batch_ways)
    return sum(comm.blocking_time_s("all_reduce", k * local_rows * LOSS_ITEMSIZE, (a,))
               for a in axes for k in (1, 2))
