"""Time of a batch norm's cross-rank statistics when its batch is split (torch-free).

tensoropt's executor runs a training-mode batch norm whose batch dim is split over some mesh
axes (its statistics axes) as ``torch.nn.SyncBatchNorm`` does when the job's
``training.batch_norm`` is ``synchronized`` (:mod:`tensoropt.executor.ops.batch_norm`): per
statistics axis, one all-reduce in forward of the packed per-channel ``[sum, sum of squares]``
(``2 C_local`` float64 numbers) and, when the node takes part in backward, one in backward of
``[sum dy, sum dy * xhat]`` (``2 C_local`` numbers of the activation dtype, float32 for a 16-bit
one); ``C_local`` is the
channel count over the node's channel split. Each is priced by
:meth:`estimators.collectives.CommModel.time_s` (latency and bytes; on the 2-process gloo
profile a small all-reduce is ~1.1 ms, so the toy CNN's two batch norms add ~4.5 ms to a
data-parallel step). The per-channel arithmetic around the collectives runs as extra program
nodes: :data:`SYNC_EXTRA_OPERATORS` operators' host overhead (``op_overhead_dtensor_s`` each), or, in
the profiled mode, the executor's whole batch norm timed without its collectives (:data:`SYNC_BATCH_NORM`).
``local`` statistics (DDP's per-rank batch norm) cost nothing beyond the op.

A channel split (in either mode) keeps each rank's channels' running statistics; the executor
keeps the running-statistics buffers replicated, so it gathers them back after the update: one
all-gather of the packed ``[running_mean; running_var]`` (``2 C`` float32 numbers) per
channel-split axis in forward (:func:`running_stats_time_s`).
"""

from __future__ import annotations

from estimators.collectives import CommModel

BATCH_NORM_STATS = ("synchronized", "local")
"""``training.batch_norm`` (see tensoropt.config.BATCH_NORM_MODES, the same names)."""

STATS_ITEMSIZE = 8
"""Forward statistics are packed as float64 (their combination cancels in float32)."""

SYNC_BATCH_NORM = "sync_batch_norm"
"""The :attr:`estimators.compute.LocalOp.variant` of a synchronised batch norm: a profiled timer that
knows it (``tensoropt.cost_graph`` gives :class:`estimators.profiled.ProfiledCompute` the executor's own
function, :func:`tensoropt.executor.ops.batch_norm.synchronized_batch_norm_alone`) times every operator
of it but the all-reduces: the statistics' pass, the packing, the running statistics, the backward's
correction; then :data:`SYNC_EXTRA_OPERATORS` is not added (it is in the timing)."""

CHANNEL_SPLIT_BATCH_NORM = "channel_split_batch_norm"
"""The :attr:`estimators.compute.LocalOp.variant` of a training batch norm whose channels are split (and
whose batch is not synchronised): the executor runs the native kernel without running statistics and
updates its replicated running statistics apart (new tensors, stacked, gathered back); a profiled timer
that knows it times that (:func:`tensoropt.executor.ops.batch_norm.channel_split_batch_norm_alone`), the
gather's all-gather priced as communication (:func:`running_stats_time_s`)."""

SYNC_EXTRA_OPERATORS = 6
"""Host overhead of the synchronised batch norm's per-channel arithmetic where its compute is not timed
as the executor runs it (the roofline, a timer without :data:`SYNC_BATCH_NORM`), in graph operators: the
replayed program of runtime.py's CNN data-parallel plan has 286 nodes with ``synchronized`` and 178
with ``local``, 54 more per batch norm (forward: var_mean, shift, pack, all-reduce and wait,
combine, casts, the fused normalisation, running-statistics updates; backward: the fused local
sums, pack, all-reduce and wait, the input gradient), and one graph operator replays as ~9 nodes
(``op_overhead_dtensor_s``, estimators/overhead.py)."""


def _shard_dim(p: str) -> int | None:
    return int(p[2:-1]) if str(p).startswith("S(") else None


def stats_axes(config) -> tuple[int, ...]:
    """Mesh axes over which a batch norm under ``config`` splits its batch (its input's dim 0).

    Example:
        >>> from estimators.configuration import Configuration
        >>> c = Configuration("batch=2", (("batch", (0,)),), (("S(0)", "S(1)"),), (), ("S(0)", "S(1)"))
        >>> stats_axes(c)
        (0,)
    """
    if config is None or not config.inputs:
        return ()
    return tuple(a for a, p in enumerate(config.inputs[0]) if _shard_dim(p) == 0)


def synchronized(node: dict, config, mode: str) -> bool:
    """Whether the executor sums ``node``'s statistics across ranks (a training batch norm whose batch
    is split, ``mode`` synchronized).

    Example:
        >>> from estimators.configuration import Configuration
        >>> bn = {"kind": "batch_norm", "attrs": {"training": True}, "inputs": [{"shape": (8, 4, 2, 2)}]}
        >>> c = Configuration("batch=2", (("batch", (0,)),), (("S(0)",),), (), ("S(0)",))
        >>> synchronized(bn, c, "synchronized"), synchronized(bn, c, "local")
        (True, False)
    """
    if mode not in BATCH_NORM_STATS:
        raise ValueError(f"batch_norm statistics must be one of {BATCH_NORM_STATS}, got {mode!r}")
    if node.get("kind") != "batch_norm" or not (node.get("attrs") or {}).get("training", True):
        return False
    return mode == "synchronized" and bool(stats_axes(config))


def channel_split(node: dict, config) -> bool:
    """Whether ``node`` is a training batch norm whose channels (its input's dim 1) ``config`` splits.

    Example:
        >>> from estimators.configuration import Configuration
        >>> bn = {"kind": "batch_norm", "attrs": {"training": True}, "inputs": [{"shape": (8, 4, 2, 2)}]}
        >>> channel_split(bn, Configuration("out=2", (("out", (0,)),), (("S(1)",),), (), ("S(1)",)))
        True
    """
    if node.get("kind") != "batch_norm" or not (node.get("attrs") or {}).get("training", True):
        return False
    return config is not None and bool(config.inputs) and any(_shard_dim(p) == 1 for p in config.inputs[0])


def running_stats_time_s(comm: CommModel, node: dict, config) -> float:
    """Seconds of gathering a channel-split training batch norm's updated running statistics.

    Example:
        >>> from estimators.configuration import Configuration, Mesh
        >>> from estimators.profiles import load_cluster
        >>> comm = CommModel(load_cluster("cpu-local"), Mesh((2,), ("gpu",)))
        >>> bn = {"kind": "batch_norm", "attrs": {"training": True}, "inputs": [{"shape": (8, 4, 2, 2)}],
        ...       "buffers": {"running_mean": (4,), "running_var": (4,)}}
        >>> c = Configuration("out=2", (("out", (0,)),), (("S(1)",),), (), ("S(1)",))
        >>> running_stats_time_s(comm, bn, c) == comm.time_s("all_gather", 32, (0,))
        True
    """
    if node.get("kind") != "batch_norm" or not (node.get("attrs") or {}).get("training", True):
        return 0.0
    if not node.get("buffers") or config is None or not config.inputs:
        return 0.0
    shape = node["inputs"][0]["shape"]
    channels = shape[1] if len(shape) > 1 else 1
    return sum(comm.time_s("all_gather", 2 * channels * 4, (axis,))
               for axis, p in enumerate(config.inputs[0]) if _shard_dim(p) == 1)


def stats_time_s(comm: CommModel, node: dict, config, backward: bool, mode: str = "synchronized",
                 itemsize: int = 4) -> float:
    """Seconds of the statistics' all-reduces of one batch norm under ``config`` (0 when not synchronised).

    Args:
        comm: the mesh's collective model.
        node: the OpGraph node (``kind``, ``attrs.training``, ``inputs[0].shape``: N x C x ...).
        config: its configuration (input 0's layout gives the batch and channel splits).
        backward: whether the node takes part in backward (its backward all-reduce).
        mode: ``training.batch_norm``: ``synchronized`` or ``local``.
        itemsize: bytes per element of the activation (the backward sums).

    Example:
        >>> from estimators.configuration import Configuration, Mesh
        >>> from estimators.profiles import load_cluster
        >>> comm = CommModel(load_cluster("cpu-local"), Mesh((2,), ("gpu",)))
        >>> bn = {"kind": "batch_norm", "attrs": {"training": True}, "inputs": [{"shape": (8, 4, 2, 2)}]}
        >>> c = Configuration("batch=2", (("batch", (0,)),), (("S(0)",),), (), ("S(0)",))
        >>> both = stats_time_s(comm, bn, c, backward=True)
        >>> both == (comm.blocking_time_s("all_reduce", 64, (0,))
        ...          + comm.blocking_time_s("all_reduce", 32, (0,)))
        True
        >>> stats_time_s(comm, bn, c, backward=True, mode="local")
        0.0
    """
    if not synchronized(node, config, mode):
        return 0.0
    shape = node["inputs"][0]["shape"]
    channels = shape[1] if len(shape) > 1 else 1
    split = 1
    for axis, p in enumerate(config.inputs[0]):
        if _shard_dim(p) == 1:
            split *= comm.mesh.shape[axis]
    local = -(-channels // split)
    total = 0.0
    for axis in stats_axes(config):
        total += comm.blocking_time_s("all_reduce", 2 * local * STATS_ITEMSIZE, (axis,))
        if backward:
            # 16-bit activations: the sums in float32
            total += comm.blocking_time_s("all_reduce", 2 * local * max(itemsize, 4), (axis,))
    return total
