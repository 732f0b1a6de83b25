"""Node and edge costs of one configuration (pair) of an OpGraph: time and memory (torch-free).

Node cost c(v, s) (shared/guide/ALGORITHM.md):

* compute: forward + backward of the local shard (:mod:`estimators.compute`, or a profiled
  timer), plus the optimizer step over the local parameters;
* communication inside the operator: the partial-sum reduction of its output
  (``Configuration.partial_axes``: all-reduce to R, or reduce-scatter to S with an all-gather
  backward) and the weight-gradient all-reduce over ``grad_sync_axes``, bucketed
  (:func:`estimators.collectives.grad_all_reduce_time_s`), with the gradient's copy into its bucket
  (:func:`estimators.layout_copies.bucket_copy_time_s`);
* a cross entropy whose logits' class dim is split: its two blocking forward all-reduces
  (:mod:`estimators.vocab_parallel`);
* a training batch norm whose batch is split, with synchronised statistics: one all-reduce of
  its packed per-channel sums per direction, and its compute timed as the executor runs it where
  the profiled timer can (:data:`estimators.batch_norm.SYNC_BATCH_NORM`); whose channels are split:
  the all-gather of its updated running statistics, and its compute timed as the executor runs it
  (:data:`estimators.batch_norm.CHANNEL_SPLIT_BATCH_NORM`) (:mod:`estimators.batch_norm`);
* memory: local parameters x (1 + 1 gradient + optimizer state factor) (in a mixed precision,
  :mod:`tensoropt.precision`: float32 master, gradient and state, plus the compute-dtype copy of
  each parameter the operator keeps for backward, :func:`estimators.memory.keeps_param`), the
  tensors the operator saves for backward that it owns (its output when it saves it, statistics, masks,
  indices; :mod:`estimators.memory`), and its output once more when two or more consumers save
  it (one storage, charged once, here).

Edge cost c(u, v, s_u, s_v), summed over the operands of v that read u:

* time: redistribution from u's output layout (carried through the folded views; a shard on a
  dim a view mixes is all-gathered first) to the operand layout v computes with, forward and
  backward (:func:`estimators.redistribution.edge_time_s`); each collective blocking (a sync
  point), except the backward of an operand whose gradient only u's parameters read (an
  embedding: :func:`_leaf`), which runs beside the rest of backward, at its fit;
* memory: the operand tensor v saves, when v saves it. Same layout as u's output -> the same
  storage: charged here only when nothing else charges that storage (u does not save its
  output and v is its only saving consumer), else 0. Different layout -> a new storage (DTensor
  redistribution copies, even a Replicate -> Shard slice clones) in v's layout, charged here.

The objective stays additive. The one approximation: when u's output is saved by two or more
consumers, it is charged at u even if every one of them redistributes it first (an over-count
of one tensor per such producer). Communication buffers are transient: they are not in the
additive memory objective; ``buffer_bytes`` reports the largest one so a plan's peak can add it
once (:func:`estimators.breakdown.plan_breakdown`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from estimators.batch_norm import CHANNEL_SPLIT_BATCH_NORM, SYNC_BATCH_NORM, SYNC_EXTRA_OPERATORS
from estimators.batch_norm import channel_split as bn_channel_split
from estimators.batch_norm import running_stats_time_s as bn_running_stats_time_s
from estimators.batch_norm import stats_time_s as bn_stats_time_s
from estimators.batch_norm import synchronized as bn_synchronized
from estimators.collectives import GRAD_BUCKET_BYTES, CommModel, grad_all_reduce_time_s, grad_bucket_fixed_s
from estimators.compute import LocalOp, cast_time_s, optimizer_time_s, roofline_time_s
from estimators.configuration import Configuration, Mesh
from estimators.layout_copies import bucket_copy_time_s, layout_copy_time_s
from estimators.memory import (  # noqa: F401 - copies_operand re-exported (was defined here)
    SavingRules,
    copies_operand,
    copy_key,
    extra_saved_bytes,
    itemsize,
    keeps_param,
    numel,
    optimizer_factor,
    saved_operand_key,
    saved_spec,
    sdpa_path,
)
from estimators.overhead import node_overhead_s, runs_local
from estimators.precision import Precision, get_precision
from estimators.profiles import Cluster
from estimators.redistribution import (
    edge_time_s,
    gradient_layout,
    local_shape,
    redistribution_steps,
    redistribution_time_s,
    through_view,
)
from estimators.vocab_parallel import class_split_time_s

FLOATING = ("float", "bfloat", "complex")
DEFAULT_RULES = SavingRules()


@dataclass(frozen=True)
class Cost:
    """Cost of one node configuration or one edge configuration pair."""

    compute_s: float = 0.0
    comm_s: float = 0.0
    memory_bytes: float = 0.0
    buffer_bytes: float = 0.0
    """Largest transient communication buffer (not part of the additive objective)."""
    param_bytes: float = 0.0
    """Part of ``memory_bytes``: stored parameters and the compute-dtype copies kept for backward."""
    grad_bytes: float = 0.0
    """Part of ``memory_bytes``: parameter gradients."""
    optimizer_bytes: float = 0.0
    """Part of ``memory_bytes``: optimizer state. The rest of ``memory_bytes`` is saved activations."""
    recompute_bytes: float = 0.0
    """What a recomputing configuration rebuilds in backward (a transient, not in the objective)."""
    step_compute_s: float = 0.0
    """Part of ``compute_s`` paid once per optimizer step whatever the micro-batch count: the
    optimizer step (:mod:`estimators.micro_batches` repeats the rest per micro-batch)."""
    step_comm_s: float = 0.0
    """Part of ``comm_s`` paid once per step: the gradient all-reduce a plan defers to the last
    micro-batch, ZeRO-1/2's all-gather of the updated shards (not ZeRO-2/3's reduce-scatter or
    ZeRO-3's gathers: those run per micro-batch)."""

    @property
    def time_s(self) -> float:
        """compute + communication seconds."""
        return self.compute_s + self.comm_s


@dataclass
class CostModel:
    """Everything that turns (node, configuration) into a :class:`Cost`.

    Attributes:
        cluster: the cluster profile.
        mesh: the device mesh.
        optimizer: "sgd" | "momentum" | "adam" | "adamw" (optimizer-state memory, step time).
        compute_time: optional ``(name, node, config, op: LocalOp) -> (fwd_s, bwd_s)`` replacing the
            roofline (profiled mode); return None to fall back to the roofline.
        rules: how the executor runs attention and batch norm (what they save); its device kind
            should be the cluster's.
        precision: the training precision (:mod:`tensoropt.precision`): the graph is captured in
            its compute dtype; a mixed one stores float32 master parameters, gradients and
            optimizer state, and keeps compute-dtype copies of the parameters ops save.
    """

    cluster: Cluster
    mesh: Mesh
    optimizer: str = "adamw"
    compute_time: Callable | None = None
    rules: SavingRules = field(default_factory=SavingRules)
    precision: Precision = field(default_factory=lambda: get_precision("fp32"))
    layout_copies: bool = True
    """Price the local copies DTensor makes around a redistribution's collectives
    (:mod:`estimators.layout_copies`); False: the estimator without them (for before/after tables)."""
    bucket_copies: bool = True
    """Price the copy of each synchronised gradient into its all-reduce bucket
    (:func:`estimators.layout_copies.bucket_copy_time_s`); False: the estimator without it."""
    batch_norm_stats: str = "synchronized"
    """``training.batch_norm``: a batch-split batch norm's statistics summed across ranks (priced:
    :mod:`estimators.batch_norm`) or per rank (``local``, free)."""
    comm: CommModel = field(init=False)
    operand_cache: dict = field(init=False, default_factory=dict, repr=False)
    """Memo of per-operand redistribution costs (identical layers and configurations repeat)."""

    def __post_init__(self):
        self.comm = CommModel(self.cluster, self.mesh)
        optimizer_factor(self.optimizer)  # validates the name
        self.precision = get_precision(self.precision)


@dataclass
class GraphInfo:
    """Per-graph facts the costs need: which tensors need gradients, who saves what."""

    needs_grad: dict[str, bool]
    """Node -> whether its output requires grad (it depends on a parameter and is floating)."""
    computes_grad: dict[str, bool]
    """Node -> whether it takes part in backward (has parameters or an operand needing grad)."""
    saving_consumers: dict[str, int]
    """Node -> number of distinct consumers that save its output itself (or a view of it)."""
    output_charged: dict[str, bool]
    """Node -> whether its output storage is charged at the node."""
    copy_savers: dict[tuple, int] = field(default_factory=dict)
    """(node, copy key) -> number of distinct consumers that save that copy of its output (a cast
    or a materialised view, :func:`estimators.memory.saved_operand_key`)."""
    shared_copies: dict[str, tuple] = field(default_factory=dict)
    """Node -> ``(operand shape, dtype)`` of each copy of its output that two or more consumers
    save: one storage, charged once at the node (in its output layout)."""
    param_numels: tuple[int, ...] = ()
    """Elements of each parameter (a shared one once): the model's gradients, which the bucketed
    all-reduce prices its buckets from (:meth:`bucketed_grad_bytes`). Empty: not known."""

    def bucketed_grad_bytes(self, itemsize_bytes: int) -> float | None:
        """Bytes of the gradients below ``GRAD_BUCKET_BYTES`` (those that share buckets), or None.

        Example:
            >>> GraphInfo({}, {}, {}, {}, param_numels=(2**20, 2**23)).bucketed_grad_bytes(4)
            4194304
        """
        if not self.param_numels:
            return None
        cache = self.__dict__.setdefault("_bucketed_grad_bytes", {})
        if itemsize_bytes not in cache:
            cache[itemsize_bytes] = sum(
                n * itemsize_bytes for n in self.param_numels if n * itemsize_bytes < GRAD_BUCKET_BYTES
            )
        return cache[itemsize_bytes]

    @staticmethod
    def of(g: nx.DiGraph, rules: SavingRules = DEFAULT_RULES) -> GraphInfo:
        """Derive the facts from an OpGraph's networkx graph (under the executor's ``rules``).

        A storage is charged once, and only where some backward saves it: the output of a node
        whose consumers save only casts or materialised copies of it (HF's residual stream, read
        by the next RMSNorm through ``.to(float32)``) is not charged; a copy saved by two
        consumers (that RMSNorm's pow and mul) is charged once, at the producer.

        Example:
            >>> g = nx.DiGraph()
            >>> g.add_node("x", op="input", kind="input", inputs=[], params={}, out_dtype="float32")
            >>> GraphInfo.of(g).needs_grad
            {'x': False}
        """
        needs, computes = {}, {}
        for n in nx.topological_sort(g):
            d = g.nodes[n]
            srcs = [e["source"] for e in d["inputs"]]
            computes[n] = d["kind"] != "input" and (bool(d["params"]) or any(needs[s] for s in srcs))
            needs[n] = computes[n] and str(d.get("out_dtype", "float32")).startswith(FLOATING)
        saving = {n: 0 for n in g.nodes}
        copies: dict[tuple, set] = {}
        shapes: dict[tuple, tuple] = {}
        for v in g.nodes:
            d = g.nodes[v]
            if not computes[v]:
                continue
            views_of: set[str] = set()
            for i in saved_spec(d, rules).inputs:
                entry = d["inputs"][i]
                u = entry["source"]
                key = saved_operand_key(g.nodes[u], entry, rules)
                if key is None:
                    views_of.add(u)
                else:
                    copies.setdefault((u, key), set()).add(v)
                    shapes[(u, key)] = (tuple(entry["shape"]), str(entry.get("dtype", "float32")))
            for u in views_of:
                saving[u] += 1
        charged = {
            n: computes[n] and (saved_spec(g.nodes[n], rules).output or saving[n] >= 2) for n in g.nodes
        }
        # A consumer-saved output of a node outside backward (e.g. an input) is still stored.
        charged.update({n: saving[n] >= 2 for n in g.nodes if not computes[n]})
        savers = {k: len(vs) for k, vs in copies.items()}
        shared: dict[str, tuple] = {}
        for (u, key), count in sorted(savers.items(), key=lambda kv: repr(kv[0])):
            if count >= 2:
                shared[u] = (*shared.get(u, ()), shapes[(u, key)])
        numels = tuple(
            int(np.prod(shape, dtype=np.int64))
            for n in g.nodes
            for key, shape in g.nodes[n]["params"].items()
            if key not in set(g.nodes[n].get("shared_params") or ())
        )
        return GraphInfo(needs, computes, saving, charged, savers, shared, numels)

    def copy_charged(self, u: str, key: tuple | None) -> bool:
        """Whether the storage ``key`` of ``u``'s output (None: the output itself) is charged at ``u``.

        Example:
            >>> info = GraphInfo({}, {}, {}, {"u": False}, {("u", ("aten.to.dtype",)): 2})
            >>> info.copy_charged("u", ("aten.to.dtype",)), info.copy_charged("u", None)
            (True, False)
        """
        if key is None:
            return bool(self.output_charged.get(u, False))
        return self.copy_savers.get((u, key), 0) >= 2


def _bytes(shape, layout, mesh: Mesh, dtype: str) -> int:
    return _local_bytes(tuple(shape), tuple(layout), mesh.shape, dtype)


@functools.lru_cache(maxsize=262144)
def _local_bytes(shape: tuple, layout: tuple, mesh_shape: tuple, dtype: str) -> int:
    """Bytes of the local shard (memoised: the same tensors and layouts recur across a graph)."""
    return numel(local_shape(shape, layout, mesh_shape)) * itemsize(dtype)


@dataclass(frozen=True)
class ParamBytes:
    """Local bytes of one parameter in one layout, per role, under the model's precision."""

    stored: int
    """The stored (master) parameter; each optimizer-state tensor is as large."""
    grad: int
    """Its gradient (reduced in this dtype)."""
    compute: int
    """The tensor ops compute with: a cast copy in a mixed precision, the parameter itself otherwise."""


def param_bytes(model: CostModel, shape, layout, op_dtype: str) -> ParamBytes:
    """:class:`ParamBytes` of a parameter of ``shape`` in ``layout`` on an operator captured in ``op_dtype``.

    Example:
        >>> from estimators.profiles import load_cluster
        >>> from tensoropt.configspace.configuration import Mesh
        >>> model = CostModel(load_cluster("h100x8"), Mesh((2,), ("gpu",)), precision="bf16-mixed")
        >>> param_bytes(model, (4, 4), ("S(0)",), "bfloat16")
        ParamBytes(stored=32, grad=32, compute=16)
    """
    stored, grad = model.precision.stored_dtypes(op_dtype)
    return ParamBytes(_bytes(shape, layout, model.mesh, stored), _bytes(shape, layout, model.mesh, grad),
                      _bytes(shape, layout, model.mesh, op_dtype))


def _split_axes(config: Configuration) -> frozenset[int]:
    return frozenset(a for _, axes in config.splits for a in axes)


def _check(name: str, node: dict, config: Configuration, mesh: Mesh) -> None:
    if len(config.inputs) != len(node["inputs"]):
        raise ValueError(
            f"node {name!r} configuration {config.label!r} has {len(config.inputs)} input layouts "
            f"but the node has {len(node['inputs'])} inputs"
        )
    if len(config.output) != len(mesh.shape):
        raise ValueError(
            f"node {name!r} configuration {config.label!r}: output layout {config.output} does not "
            f"match mesh {mesh.shape}"
        )


def shared_copy_bytes(info: GraphInfo, name: str, node: dict, config: Configuration, mesh: Mesh) -> int:
    """Local bytes of the copies of ``name``'s output that two or more consumers save
    (:attr:`GraphInfo.shared_copies`), each once, split as the node's output is.

    Example:
        >>> from tensoropt.configspace.configuration import Configuration, Mesh
        >>> info = GraphInfo({}, {}, {}, {}, shared_copies={"a": (((4, 8), "float32"),)})
        >>> c = Configuration("batch=2", (("batch", (0,)),), (), (), ("S(0)",))
        >>> shared_copy_bytes(info, "a", {"out_shape": (4, 8)}, c, Mesh((2,), ("gpu",)))
        64
    """
    copies = info.shared_copies.get(name)
    if not copies:
        return 0
    full = numel(tuple(node["out_shape"]))
    local = numel(local_shape(tuple(node["out_shape"]), tuple(config.output), mesh.shape))
    return sum(numel(shape) * local // max(1, full) * itemsize(dtype) for shape, dtype in copies)


def local_op(node: dict, config: Configuration, mesh: Mesh, info: GraphInfo) -> LocalOp:
    """The local shard of ``node`` under ``config`` (shapes, FLOPs) for the compute model.

    Example:
        >>> from tensoropt.configspace.configuration import Configuration, Mesh
        >>> node = {"kind": "elementwise", "op": "aten.relu.default", "flops": 64, "out_shape": (8, 8),
        ...         "out_dtype": "float32", "params": {}, "inputs": [{"source": "x", "shape": (8, 8),
        ...         "dtype": "float32"}]}
        >>> info = GraphInfo({"x": True}, {}, {}, {})
        >>> c = Configuration("batch=2", (("batch", (0,)),), (("S(0)",),), (), ("S(0)",))
        >>> local_op(node, c, Mesh((2,), ("gpu",)), info).flops
        32.0
    """
    divisor = 1
    for dim, _ in config.splits:
        divisor *= config.degree(dim, mesh)
    params = dict(config.params)
    raw_out = tuple("R" if a in config.partial_axes else p for a, p in enumerate(config.output))
    return LocalOp(
        kind=node["kind"],
        dtype=str(node.get("out_dtype", "float32")),
        flops=float(node.get("flops", 0)) / divisor,
        in_shapes=tuple(
            local_shape(tuple(e["shape"]), tuple(lay), mesh.shape)
            for e, lay in zip(node["inputs"], config.inputs)
        ),
        in_dtypes=tuple(str(e.get("dtype", "float32")) for e in node["inputs"]),
        param_shapes=tuple(
            local_shape(tuple(s), tuple(params.get(k, ("R",) * len(mesh.shape))), mesh.shape)
            for k, s in node["params"].items()
        ),
        out_shape=local_shape(tuple(node["out_shape"]), raw_out, mesh.shape),
        has_params=bool(node["params"]),
        inputs_need_grad=tuple(info.needs_grad.get(e["source"], False) for e in node["inputs"]),
    )


def _bucket_fixed_share_s(comm: CommModel, bucketed: float | None, full_grad_bytes: int) -> float:
    """A synchronised parameter's share (by its full gradient bytes) of the gradient buckets' fixed
    latency (:func:`estimators.collectives.grad_bucket_fixed_s` over every mesh axis): a plan whose
    every gradient is synchronised carries the executor's bucket count, one that synchronises none
    (a model-parallel plan) carries no bucket, and replicating one small gradient saves its share,
    never a whole latency."""
    if not bucketed or full_grad_bytes >= GRAD_BUCKET_BYTES:
        return 0.0
    axes = tuple(range(len(comm.mesh.shape)))
    key = ("grad_bucket_fixed_s", bucketed, axes)
    if key not in comm.memo:
        comm.memo[key] = grad_bucket_fixed_s(comm, bucketed, axes)
    return comm.memo[key] * full_grad_bytes / bucketed


def node_cost(model: CostModel, info: GraphInfo, name: str, node: dict, config: Configuration) -> Cost:
    """Time and memory of ``node`` under ``config`` (see the module docstring).

    Example:
        >>> from estimators.profiles import load_cluster
        >>> from tensoropt.configspace.configuration import Configuration, Mesh
        >>> mesh = Mesh((2,), ("gpu",))
        >>> node = {"kind": "linear", "op": "aten.linear.default", "flops": 256, "out_shape": (8, 4),
        ...         "out_dtype": "float32", "params": {"w": (4, 4)}, "shared_params": [],
        ...         "inputs": [{"source": "x", "shape": (8, 4), "dtype": "float32"}]}
        >>> c = Configuration("batch=2", (("batch", (0,)),), (("S(0)",),), (("w", ("R",)),), ("S(0)",),
        ...                   grad_sync_axes=(("w", (0,)),))
        >>> info = GraphInfo({"x": False, "l": True}, {"l": True}, {}, {"l": False})
        >>> cost = node_cost(CostModel(load_cluster("h100x8"), mesh, "sgd"), info, "l", node, c)
        >>> cost.memory_bytes  # weight + its gradient (16 floats each); the saved input is the edge's
        128.0
        >>> cost.comm_s > 0  # gradient all-reduce
        True
    """
    _check(name, node, config, model.mesh)
    mesh, comm = model.mesh, model.comm
    if node["kind"] == "input":
        out_bytes = _bytes(node["out_shape"], config.output, mesh, node.get("out_dtype", "float32"))
        return Cost(memory_bytes=float((out_bytes if info.output_charged.get(name) else 0)
                                       + shared_copy_bytes(info, name, node, config, mesh)))
    op = local_op(node, config, mesh, info)
    sync_bn = node["kind"] == "batch_norm" and bn_synchronized(node, config, model.batch_norm_stats)
    variant = SYNC_BATCH_NORM if sync_bn else \
        CHANNEL_SPLIT_BATCH_NORM if node["kind"] == "batch_norm" and bn_channel_split(node, config) else ""
    if variant and variant in (getattr(model.compute_time, "variants", None) or ()):
        op = dataclasses.replace(op, variant=variant)  # timed as the executor runs it
    timed = model.compute_time(name, node, config, op) if model.compute_time else None
    fwd_s, bwd_s = timed if timed is not None else roofline_time_s(model.cluster.device, op)
    if not info.computes_grad.get(name, True):
        bwd_s = 0.0
    params = dict(config.params)
    shared = set(node.get("shared_params") or ())
    own_param_bytes, own_grad_bytes, copy_bytes, cast_bytes = 0, 0, 0, 0
    comm_s, buffer, sync_s = 0.0, 0.0, 0.0
    sync = dict(config.grad_sync_axes)
    mixed = model.precision.mixed
    need = [info.needs_grad.get(e["source"], False) for e in node["inputs"]]
    grad_itemsize = itemsize(model.precision.stored_dtypes(op.dtype)[1])
    bucketed = info.bucketed_grad_bytes(grad_itemsize)
    for key, shape in node["params"].items():
        lay = params.get(key, ("R",) * len(mesh.shape))
        pb = param_bytes(model, shape, lay, op.dtype)
        if mixed:  # cast to the compute dtype where used; its gradient cast back in backward
            cast_bytes += pb.stored + 2 * pb.compute + pb.grad
            if keeps_param(node, shape, need):
                copy_bytes += pb.compute
        if key not in shared:
            own_param_bytes += pb.stored
            own_grad_bytes += pb.grad
            if sync.get(key):
                sync_s += grad_all_reduce_time_s(comm, pb.grad, sync[key], bucketed)  # bucketed
                buffer = max(buffer, pb.grad)
                sync_s += _bucket_fixed_share_s(comm, bucketed, numel(shape) * grad_itemsize)
                if model.bucket_copies:  # concatenated into its bucket before the all-reduce
                    sync_s += bucket_copy_time_s(model.cluster.device, pb.grad)
    comm_s += sync_s
    device = model.cluster.device
    step_s = optimizer_time_s(device, own_param_bytes, len(node["params"]), model.optimizer)
    compute_s = (
        fwd_s
        + bwd_s
        + step_s
        + node_overhead_s(device, node, config)
        + cast_time_s(device, cast_bytes, 2 * len(node["params"]) if mixed else 0)
    )
    out_dtype = str(node.get("out_dtype", "float32"))
    if node["kind"] == "batch_norm":  # cross-rank statistics; running statistics gathered back
        comm_s += bn_stats_time_s(comm, node, config, info.computes_grad.get(name, True),
                                  model.batch_norm_stats, itemsize(out_dtype))
        comm_s += bn_running_stats_time_s(comm, node, config)
        if sync_bn and (timed is None or not op.variant):  # its arithmetic not timed: counted
            compute_s += SYNC_EXTRA_OPERATORS * device.op_overhead_dtensor_s
    if node["kind"] == "cross_entropy":  # a class split's blocking all-reduces (0 otherwise)
        comm_s += class_split_time_s(comm, node, config.inputs)
    if config.partial_axes:
        src = tuple("P" if a in config.partial_axes else p for a, p in enumerate(config.output))
        # a batch-split cross entropy or mse_loss the executor runs on local shards leaves the loss a
        # partial sum, read after the step; only a cross entropy's label count is all-reduced, during
        # forward (overlapped); an mse_loss mean divides by the element count the shapes give
        reduced_locally = runs_local(node, config)
        if not reduced_locally:
            comm_s += redistribution_time_s(
                comm, tuple(node["out_shape"]), itemsize(out_dtype), src, config.output
            )
            if model.layout_copies:  # a reduce-scatter to a dim > 0 lays its input out first
                comm_s += layout_copy_time_s(device, tuple(node["out_shape"]), itemsize(out_dtype), src,
                                             tuple(config.output), mesh.shape)
        buffer = max(buffer, numel(op.out_shape) * itemsize(out_dtype))
        if device.redistribute_overhead_s and not reduced_locally:  # a DTensor redistribution
            comm_s += device.redistribute_overhead_s * (1 + bool(info.needs_grad.get(name)))
        if info.needs_grad.get(name):
            gathered = tuple("R" if a in config.partial_axes else p for a, p in enumerate(config.output))
            comm_s += redistribution_time_s(
                comm, tuple(node["out_shape"]), itemsize(out_dtype), config.output, gathered
            )
    memory = own_param_bytes * (1 + optimizer_factor(model.optimizer)) + own_grad_bytes + copy_bytes
    if info.computes_grad.get(name, True):
        out_bytes = _bytes(node["out_shape"], config.output, mesh, out_dtype)
        if info.output_charged.get(name):
            memory += out_bytes
        memory += shared_copy_bytes(info, name, node, config, mesh)
        memory += extra_saved_bytes(
            node,
            list(op.in_shapes),
            local_shape(tuple(node["out_shape"]), config.output, mesh.shape),
            model.rules,
        )
    factor = optimizer_factor(model.optimizer)
    return Cost(compute_s=compute_s, comm_s=comm_s, memory_bytes=float(memory), buffer_bytes=float(buffer),
                param_bytes=float(own_param_bytes + copy_bytes), grad_bytes=float(own_grad_bytes),
                optimizer_bytes=float(own_param_bytes * factor), step_compute_s=step_s, step_comm_s=sync_s)


def _operand_move(model: CostModel, out_shape, size, src, dim_map, shape, dst, split_axes, grad,
                  leaf: bool = False):
    """(seconds forward + backward, largest buffer bytes, whether the data moves) of one operand.
    ``leaf``: only the producer's parameter gradients read the operand's gradient (:func:`_leaf`)."""
    comm = model.comm
    gathered, translated = through_view(src, list(dim_map) if dim_map is not None else None, len(out_shape))
    moved = gathered != src or translated != dst
    t = 0.0
    if gathered != src:
        t += redistribution_time_s(comm, out_shape, size, src, gathered)
    fwd, bwd = edge_time_s(comm, shape, size, translated, dst, split_axes, grad, gradient_waited=not leaf)
    redistributions = (gathered != src) + (translated != dst)
    t += model.cluster.device.redistribute_overhead_s * redistributions * (1 + bool(grad))
    if model.layout_copies:  # the local copies around the collectives, forward and backward
        device, mesh_shape = model.cluster.device, model.mesh.shape
        if gathered != src:
            t += layout_copy_time_s(device, out_shape, size, src, gathered, mesh_shape)
        t += layout_copy_time_s(device, shape, size, translated, dst, mesh_shape)
        if grad:
            back = gradient_layout(dst, split_axes)
            t += layout_copy_time_s(device, shape, size, back, translated, mesh_shape)
    buf = 0.0
    if moved:
        buf = max(
            [0.0] + [n for _, n, _ in redistribution_steps(shape, size, translated, dst, model.mesh.shape)]
        )
    return t + fwd + bwd, buf, moved


def _leaf(info: GraphInfo, du: dict) -> bool:
    """Whether only the producer's own parameter gradients read its output's gradient (none of its
    operands needs one: an embedding of token ids, a position embedding). Its gradient's
    redistribution is then waited for only where the parameter's gradient is made, at the end of
    backward (the replayed program defers each wait to its first reader), or, a partial sum, is
    summed by the gradient all-reduce itself: not a sync point (``benchmarks/collective_match.py``:
    the position embeddings of GPT-2's and BERT's data-parallel plans, 2026-11-29)."""
    return bool(du["params"]) and not any(info.needs_grad.get(e["source"], False) for e in du["inputs"])


def edge_cost(
    model: CostModel, info: GraphInfo, g: nx.DiGraph, u: str, v: str, cu: Configuration, cv: Configuration
) -> Cost:
    """Redistribution time and saved-operand memory of edge ``(u, v)`` for one configuration pair.

    Example:
        >>> # worked cases: tests/estimators/test_memory.py and test_cost_graph.py
        >>> True
        True
    """
    t = edge_cost_table(model, info, g, u, v, [cu], [cv])
    return Cost(
        comm_s=float(t["comm_s"][0, 0]),
        memory_bytes=float(t["memory_bytes"][0, 0]),
        buffer_bytes=float(t["buffer_bytes"][0, 0]),
    )


def _chunk_factor(src, dim_map, rank: int, dst, mesh_shape) -> float:
    """How many times larger than ``dst``'s local shard the storage behind it is, without all-to-all:
    a shard moved to another dim on the same mesh axis is all-gathered, then chunked (a view)."""
    _, translated = through_view(src, list(dim_map) if dim_map is not None else None, rank)
    factor = 1.0
    for axis, (a, b) in enumerate(zip(translated, dst)):
        if a != b and str(a).startswith("S(") and str(b).startswith("S("):
            factor *= mesh_shape[axis]
    return factor


def _unique(keys: list) -> tuple[list, np.ndarray]:
    """Distinct keys (first-seen order) and, per position, the index of its key."""
    index: dict = {}
    idx = np.array([index.setdefault(k, len(index)) for k in keys], dtype=np.int64)
    return list(index), idx


def edge_cost_table(
    model: CostModel,
    info: GraphInfo,
    g: nx.DiGraph,
    u: str,
    v: str,
    confs_u: list[Configuration],
    confs_v: list[Configuration],
) -> dict[str, np.ndarray]:
    """:func:`edge_cost` for every pair of ``confs_u`` x ``confs_v``, as ``C_u x C_v`` arrays.

    An operand's cost depends only on u's output layout and on v's operand layout and split
    axes; those take few distinct values, so each distinct pair is priced once (memoised on the
    model across edges) and spread to the full table by indexing.

    Returns:
        ``{"comm_s", "memory_bytes", "buffer_bytes"}``, each of shape ``(len(confs_u), len(confs_v))``.

    Example:
        >>> # see edge_cost
        >>> True
        True
    """
    du, dv = g.nodes[u], g.nodes[v]
    operands = g.edges[u, v].get("operands") or [i for i, e in enumerate(dv["inputs"]) if e["source"] == u]
    saved = set(saved_spec(dv, model.rules).inputs) if info.computes_grad.get(v, True) else set()
    out_shape = tuple(du["out_shape"])
    size = itemsize(du.get("out_dtype", "float32"))
    charged_u = info.output_charged.get(u, False)
    shape_uv = (len(confs_u), len(confs_v))
    comm = np.zeros(shape_uv)
    buffer = np.zeros(shape_uv)
    memory = np.zeros(shape_uv)
    srcs, iu = _unique([tuple(c.output) for c in confs_u])
    charged: list[tuple] = []  # (dst layout ids, moved matrix, storage key) of charged operands
    for i in operands:
        entry = dv["inputs"][i]
        dim_map = entry.get("dim_map")
        dim_map = tuple(dim_map) if dim_map is not None else None
        dtype = entry.get("dtype", "float32")
        shape = tuple(entry["shape"])
        grad = info.needs_grad.get(u, False) and str(dtype).startswith(FLOATING)
        leaf = grad and _leaf(info, du)
        dsts, iv = _unique([(tuple(c.inputs[i]), _split_axes(c)) for c in confs_v])
        t = np.zeros((len(srcs), len(dsts)))
        buf = np.zeros_like(t)
        moved = np.zeros(t.shape, dtype=bool)
        for a, src in enumerate(srcs):
            for b, (dst, split_axes) in enumerate(dsts):
                key = (out_shape, size, src, dim_map, shape, dst, split_axes, grad, leaf)
                if key not in model.operand_cache:
                    model.operand_cache[key] = _operand_move(model, *key)
                t[a, b], buf[a, b], moved[a, b] = model.operand_cache[key]
        comm += t[np.ix_(iu, iv)]
        buffer = np.maximum(buffer, buf[np.ix_(iu, iv)])
        if i not in saved:
            continue
        layouts, il = _unique([tuple(c.inputs[i]) for c in confs_v])
        nbytes = np.array([_bytes(shape, lay, model.mesh, dtype) for lay in layouts], dtype=np.float64)[il]
        mv = moved[np.ix_(iu, iv)]
        if not model.cluster.has_all_to_all:  # Shard(i) -> Shard(j): all-gather, then a chunk (a view)
            factor = np.array([[_chunk_factor(src, dim_map, len(out_shape), dst, model.mesh.shape)
                                for dst in layouts] for src in srcs])[np.ix_(iu, il)]
            nbytes_moved = nbytes[None, :] * factor
        else:
            nbytes_moved = np.broadcast_to(nbytes[None, :], mv.shape)
        storage = saved_operand_key(du, entry, model.rules)  # None: u's output itself (a view of it)
        if storage is not None:  # a copy (cast, materialised view): its own storage, whatever u saves,
            # charged at u when two or more consumers save it (GraphInfo.shared_copies)
            charge = np.where(mv, nbytes_moved, 0.0 if info.copy_charged(u, storage) else nbytes[None, :])
        else:  # a view of u's output: the saved storage is u's whole output (q, k, v of one split)
            whole = np.array([_bytes(out_shape, src, model.mesh, du.get("out_dtype", "float32"))
                              for src in srcs], dtype=np.float64)[iu]
            kept = np.maximum(nbytes[None, :], whole[:, None])
            charge = np.where(mv, nbytes_moved, 0.0 if charged_u else kept)
        layout_ids = np.array([hash(lay) for lay in layouts], dtype=np.int64)[il]
        for prev_ids, prev_moved, prev_storage in charged:  # one storage saved twice: charged once;
            # each redistributed operand is its own copy (q, k, v of one split: three storages)
            if prev_storage != storage:
                continue
            same = (prev_ids == layout_ids)[None, :] & ~prev_moved & ~mv
            charge = np.where(same, 0.0, charge)
        charged.append((layout_ids, mv, storage))
        memory += charge
    return {"comm_s": comm, "memory_bytes": memory, "buffer_bytes": buffer}
