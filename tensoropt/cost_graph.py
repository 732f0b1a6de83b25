"""The cost graph: an OpGraph's configurations priced into ``frontier.solve``'s input format.

Each node carries ``"cost"`` (C x K float64: one row per configuration, one column per
objective), each edge ``"cost"`` (C_u x C_v x K). Objective 0 is step time in seconds
(compute + communication, no overlap: additive and conservative), objective 1 per-device memory
in bytes (parameters, gradients, optimizer state, saved activations; see
:mod:`estimators.op_costs` for how shared storages are charged once). The formulas live in
``estimators``; this module only walks the graph and fills the arrays.

Node attributes added: ``cost``, ``configs`` (labels, index-aligned with the rows),
``configurations`` (the :class:`Configuration` objects), ``op``, ``kind``, ``module`` and the
per-configuration components ``compute_s``, ``comm_s``, ``memory_bytes``, ``buffer_bytes``,
``step_compute_s`` and ``step_comm_s`` (the parts of ``compute_s`` and ``comm_s`` paid once per step
whatever the micro-batch count: :mod:`tensoropt.accumulation`) and the parts of ``memory_bytes``
``param_bytes``, ``grad_bytes``, ``optimizer_bytes`` (the rest
is saved activations), with ``recompute_bytes`` (rebuilt in backward; a transient) (1-D arrays;
the part names: :data:`estimators.memory_parts.COST_PARTS`).
Edge attributes: ``cost`` and the components ``comm_s``, ``memory_bytes``,
``buffer_bytes`` (C_u x C_v); an edge that prices a tied parameter between its first user and
another user (:mod:`estimators.tied`) carries ``tied_params`` (the parameter keys) and, when ``u``
does not also feed ``v``, ``tied=True``. Graph attributes: ``mesh``, ``num_devices``, ``cluster`` (the
:class:`estimators.profiles.Cluster`), ``objectives``, ``optimizer``, ``compute_mode``, ``blocks``
(block module path -> its nodes, where block options are priced; nodes carry their ``block``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

import networkx as nx
import numpy as np

from estimators.block_options import (
    BLOCK_OPTIONS,
    block_edge_table,
    edge_role,
    graph_blocks,
    node_blocks,
    priced_node_cost,
    with_block_options,
)
from estimators.chunked_loss import (
    DEFAULT_CHUNK_TOKENS,
    chunked,
    chunked_edge_table,
    chunked_node_cost,
    loss_blocks,
    with_chunked_loss,
)
from estimators.memory import SavingRules
from estimators.memory_parts import COST_PARTS
from estimators.op_costs import Cost, CostModel, GraphInfo, edge_cost_table
from estimators.options import option_edge_table, with_recompute_rule
from estimators.profiles import Cluster, load_cluster
from estimators.tied import tied_edge_table, tied_pairs
from tensoropt.configspace.configuration import Configuration, Mesh
from tensoropt.precision import get_precision

OBJECTIVES = ("time_s", "memory_bytes", "compute_s", "comm_s")
"""Objectives a cost graph can carry (any subset, in any order)."""


def _value(cost: Cost, objective: str) -> float:
    return cost.time_s if objective == "time_s" else getattr(cost, objective)


def replicated(node: dict, mesh: Mesh) -> Configuration:
    """The fully replicated configuration of a node (used for nodes the configuration space omits).

    Example:
        >>> replicated({"inputs": [{}], "params": {"w": (2, 2)}}, Mesh((2,), ("gpu",))).output
        ('R',)
    """
    r = ("R",) * len(mesh.shape)
    return Configuration(
        "replicate", (), tuple(r for _ in node["inputs"]), tuple((k, r) for k in node["params"]), r
    )


def _node_key(name: str, node: dict, info: GraphInfo) -> tuple:
    """Everything a node's cost depends on, so identical layers (transformer blocks) are priced once."""
    return (
        node["op"],
        node["kind"],
        tuple(node["out_shape"]),
        node.get("out_dtype"),
        int(node.get("flops", 0)),
        repr(node.get("attrs")),
        # parameter names differ between identical layers (h.0.*, h.1.*): key on shapes and order
        tuple(tuple(s) for s in node["params"].values()),
        tuple(k in (node.get("shared_params") or ()) for k in node["params"]),
        tuple((tuple(e["shape"]), e.get("dtype"), info.needs_grad.get(e["source"])) for e in node["inputs"]),
        info.computes_grad.get(name),
        info.needs_grad.get(name),
        info.output_charged.get(name),
        info.shared_copies.get(name),
    )


def _config_key(c: Configuration) -> tuple:
    """A configuration without its parameter names (identical layers then share one cache entry)."""
    return (
        c.label,
        c.splits,
        c.inputs,
        c.output,
        c.partial_axes,
        tuple(lay for _, lay in c.params),
        tuple(axes for _, axes in c.grad_sync_axes),
        c.options,
    )


def cost_graph(
    graph,
    cluster: str | os.PathLike | dict | Cluster,
    num_devices: int,
    objectives: Sequence[str] = ("time_s", "memory_bytes"),
    batch_size: int | None = None,
    optimizer: str = "adamw",
    compute_mode: str = "roofline",
    *,
    configurations: dict[str, list[Configuration]] | None = None,
    mesh: Mesh | None = None,
    cache_dir: str | os.PathLike | None = None,
    sdpa_backend: str = "auto",
    batch_norm: str = "auto",
    batch_norm_stats: str = "synchronized",
    progress: Callable[[int, int], None] | None = None,
    memory_options: Sequence[str] = (),
    precision: str = "fp32",
    memoise: bool = True,
    checkpoint_modules: Sequence[str] | None = None,
    loss_chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    profile_clock: str | None = None,
    price_layout_copies: bool = True,
    price_bucket_copies: bool = True,
) -> nx.DiGraph:
    """Price every configuration of every operator of ``graph`` on ``num_devices`` devices of ``cluster``.

    Args:
        graph: an :class:`tensoropt.capture.OpGraph` (or its ``.nx`` DiGraph).
        cluster: a profile name (``"h100x8"``, ``"cpu-local"``), a YAML path, a dict, or a Cluster.
        num_devices: device count P; the mesh is ``Mesh.for_cluster(P, devices_per_node)``.
        objectives: which costs, in order (from ``OBJECTIVES``); the default is (time, memory).
        batch_size: the global batch size the graph must have been captured with (checked against
            the first input's dim 0; capture again for another batch size).
        optimizer: "sgd", "momentum", "adam" or "adamw".
        compute_mode: "roofline" or "profiled" (times the local shard shapes with torch on the
            current device, cached on disk under ``cache_dir``; see :mod:`estimators.profiled`).
        configurations: node -> configurations; default ``tensoropt.configurations(graph, mesh)``.
        mesh: override the mesh (default from the cluster).
        cache_dir: profiled-mode cache directory.
        sdpa_backend: the attention kernel the executor will use ("auto": torch's choice on the
            cluster's device; "math"; "fused"): it decides what attention saves for backward.
        batch_norm: what a batch norm saves: "native" (aten's: input + per-channel statistics),
            "decomposed" (a batch norm written with tensor ops: the centred and normalised input too)
            or "auto" (native: tensoropt's executor saves what aten does, synchronised or not).
        batch_norm_stats: the job's ``training.batch_norm``: "synchronized" (a batch-split batch
            norm's statistics all-reduced across ranks, priced by :mod:`estimators.batch_norm`) or
            "local" (per-rank statistics, as plain DDP: no collective).
        progress: called as ``progress(done, total)`` while nodes and edges are priced.
        memory_options: some of ``"recompute"``, ``"zero1"``, ``"zero2"``, ``"zero3"``: multiply the
            configurations with these options (:mod:`tensoropt.configspace.options`, priced by
            :mod:`estimators.options`); ``"block_recompute"``, ``"block_selective"``: whole-block
            checkpointing of the blocks (:mod:`estimators.block_options`).
        checkpoint_modules: the module paths checkpointed as blocks (``training.checkpoint_modules``;
            None: the repeated modules the capture finds).
        loss_chunk_tokens: tokens per chunk of the ``chunked_loss`` option (``training.loss_chunk_tokens``:
            :mod:`estimators.chunked_loss`, offered on each head + cross entropy pair it fuses).
        profile_clock: profiled mode's clock, ``"thread"`` or ``"wall"`` (None: the device's,
            :func:`estimators.profiled.timing_clock`; a thread-clock timing also files the same runs'
            wall-clock means, so a wall-clock cost graph after it reads them without timing again).
        price_layout_copies: price the local copies around redistributions' collectives
            (:mod:`estimators.layout_copies`); False: the estimator without them (ablations).
        price_bucket_copies: price each synchronised gradient's copy into its all-reduce bucket
            (:func:`estimators.layout_copies.bucket_copy_time_s`); False: without it (ablations).
        precision: the training precision (:mod:`tensoropt.precision`); capture the graph in its
            compute dtype. A mixed one prices float32 master parameters, gradients (reduced in
            float32) and optimizer state, and the compute-dtype copies of the parameters ops keep.
        memoise: price structurally identical operators and edges once (same op, shapes, dtypes,
            gradient flags, configurations up to parameter names; for edges also the same operand
            wiring): the 32 layers of a Llama are priced as one. ``False`` prices every node and
            edge on its own (slow; tests check both give the same graph).

    Returns:
        A new ``networkx.DiGraph`` in ``frontier.solve``'s format (see the module docstring).

    Example:
        >>> import torch
        >>> from tensoropt.capture import capture
        >>> g = capture(torch.nn.Linear(8, 4), (torch.randn(2, 8),))
        >>> cg = cost_graph(g, "cpu-local", 1, configurations={})
        >>> cg.nodes["linear"]["cost"].shape, cg.nodes["linear"]["configs"]
        ((1, 2), ['replicate'])
    """
    g = graph.nx if hasattr(graph, "nx") else graph
    cl = load_cluster(cluster)
    if num_devices < 1:
        raise ValueError(f"num_devices must be >= 1, got {num_devices}")
    if num_devices > cl.max_devices:
        raise ValueError(f"cluster {cl.name!r} has {cl.max_devices} devices; cannot plan for {num_devices}")
    for o in objectives:
        if o not in OBJECTIVES:
            raise ValueError(f"unknown objective {o!r}; expected some of {OBJECTIVES}")
    if compute_mode not in ("roofline", "profiled"):
        raise ValueError(f"compute_mode must be 'roofline' or 'profiled', got {compute_mode!r}")
    _check_batch(g, batch_size)
    mesh = mesh or Mesh.for_cluster(num_devices, cl.devices_per_node)
    if configurations is None:
        from tensoropt.configspace import configurations as enumerate_configurations

        configurations = enumerate_configurations(graph, mesh)
    timer = None
    if compute_mode == "profiled":
        from estimators.profiled import ProfiledCompute

        # on a CPU host the other ranks compute at the same time, sharing caches and memory bandwidth
        co_runners = min(num_devices, cl.devices_per_node) - 1
        from estimators.batch_norm import CHANNEL_SPLIT_BATCH_NORM, SYNC_BATCH_NORM
        from tensoropt.executor.ops.batch_norm import (
            channel_split_batch_norm_alone,
            synchronized_batch_norm_alone,
        )

        # batch norms timed as the executor runs them (estimators/batch_norm.py)
        variants = {SYNC_BATCH_NORM: synchronized_batch_norm_alone,
                    CHANNEL_SPLIT_BATCH_NORM: channel_split_batch_norm_alone}
        timer = ProfiledCompute(cl.device, program=getattr(graph, "program", None), cache_dir=cache_dir,
                                co_runners=co_runners, clock=profile_clock, variants=variants)
    if batch_norm == "auto":
        batch_norm = "native"
    rules = SavingRules(cl.device.kind, sdpa_backend, batch_norm)
    model = CostModel(cl, mesh, optimizer, compute_time=timer, rules=rules,
                      precision=get_precision(precision), batch_norm_stats=batch_norm_stats,
                      layout_copies=price_layout_copies, bucket_copies=price_bucket_copies)
    info = GraphInfo.of(g, rules)
    if memory_options:
        from tensoropt.configspace.options import with_options

        recomputable = with_recompute_rule(info, g, rules)
        configurations = with_options(g, configurations, mesh, memory_options, recomputable)
    blocks = graph_blocks(g, checkpoint_modules) if set(BLOCK_OPTIONS) & set(memory_options) else {}
    configurations = with_block_options(configurations, blocks, memory_options)
    losses = loss_blocks(g) if "chunked_loss" in memory_options else {}
    configurations = with_chunked_loss(configurations, losses, memory_options)
    loss_edges = {(head, loss) for loss, head in losses.items()}
    inside = node_blocks(blocks)
    order = {n: i for i, n in enumerate(nx.topological_sort(g))}
    out = nx.DiGraph()
    out.graph.update(
        mesh=mesh,
        num_devices=num_devices,
        cluster=cl,
        objectives=tuple(objectives),
        optimizer=optimizer,
        compute_mode=compute_mode,
        precision=model.precision.name,
        blocks={b: list(nodes) for b, nodes in blocks.items()},
    )
    total, done = g.number_of_nodes() + g.number_of_edges(), 0
    # node -> (its cost key, its configurations' keys): computed once, read by every edge
    node_cache: dict[tuple, tuple[np.ndarray, dict[str, np.ndarray]]] = {}
    configs_of: dict[str, list[Configuration]] = {}
    keys_of: dict[str, tuple[tuple, tuple]] = {}
    for name in nx.topological_sort(g):
        d = g.nodes[name]
        confs = list(configurations.get(name) or [replicated(d, mesh)])
        configs_of[name] = confs
        keys_of[name] = (_node_key(name, d, info), tuple(_config_key(c) for c in confs))
        key = keys_of[name] if memoise else (name,)
        if key not in node_cache:
            costs = [chunked_node_cost(model, info, name, d, c, loss_chunk_tokens) if chunked(c)
                     else priced_node_cost(model, info, name, d, c) for c in confs]
            node_cache[key] = (
                np.array([[_value(c, o) for o in objectives] for c in costs], dtype=np.float64),
                _components(costs),
            )
        cost, components = node_cache[key]
        out.add_node(  # copies: identical layers share the cached arrays
            name,
            op=d["op"],
            kind=d["kind"],
            module=d.get("module", ""),
            block=inside.get(name, ""),
            configs=[c.label for c in confs],
            configurations=confs,
            cost=cost.copy(),
            **{k: a.copy() for k, a in components.items()},
        )
        done += 1
        if progress:
            progress(done, total)
    edge_cache: dict[tuple, dict[str, np.ndarray]] = {}
    for u, v in g.edges:
        cu, cv = configs_of[u], configs_of[v]
        role = edge_role(g, inside, u, v, order) if inside else ""
        key = (
            role or ("chunked_loss" if (u, v) in loss_edges else ""),
            keys_of[u][0],
            keys_of[v][0],
            keys_of[u][1],
            keys_of[v][1],
            repr(g.edges[u, v].get("operands")),
            repr([(e.get("dim_map"), e["source"] == u) for e in g.nodes[v]["inputs"]]),
        ) if memoise else (role, u, v)
        if key not in edge_cache:
            if not memoise:  # the operand moves too are priced afresh for every edge
                model.operand_cache.clear()
            if role or inside.get(u):
                edge_cache[key] = block_edge_table(model, info, g, u, v, cu, cv, role, _option_table)
            else:
                edge_cache[key] = option_edge_table(model, info, g, u, v, cu, cv, edge_cost_table)
            if (u, v) in loss_edges:
                edge_cache[key] = chunked_edge_table(edge_cache[key], cu, cv)
        comps = edge_cache[key]
        columns = [
            comps["comm_s"] if o in ("time_s", "comm_s") else comps.get(o, np.zeros_like(comps["comm_s"]))
            for o in objectives
        ]
        out.add_edge(
            u,
            v,
            cost=np.stack(columns, axis=-1).astype(np.float64),
            compute_s=np.zeros_like(comps["comm_s"]),
            **comps,
        )
        done += 1
        if progress:
            progress(done, total)
    _add_tied_edges(out, g, model, info, configs_of, objectives)
    return out


def _option_table(model, info, g, u, v, cu, cv):
    return option_edge_table(model, info, g, u, v, cu, cv, edge_cost_table)


def _add_tied_edges(out: nx.DiGraph, g: nx.DiGraph, model: CostModel, info: GraphInfo,
                    configs_of: dict[str, list[Configuration]], objectives: Sequence[str]) -> None:
    """Price each tied parameter between its first user and every other user (:mod:`estimators.tied`):
    an edge ``u -> v`` marked ``tied=True`` and ``tied_params`` (the keys); where ``u`` already
    feeds ``v`` the tie's table is added to that data edge's (``tied_params`` set, ``tied`` not)."""
    for u, v, key in tied_pairs(g):
        comps = tied_edge_table(model, info, g, u, v, key, configs_of[u], configs_of[v])
        zeros = np.zeros_like(comps["comm_s"])
        columns = [comps["comm_s"] if o in ("time_s", "comm_s") else comps.get(o, zeros) for o in objectives]
        cost = np.stack(columns, axis=-1).astype(np.float64)
        if out.has_edge(u, v):
            e = out.edges[u, v]
            e["cost"] = e["cost"] + cost
            for k in ("comm_s", "memory_bytes"):
                e[k] = e[k] + comps[k]
            e["buffer_bytes"] = np.maximum(e["buffer_bytes"], comps["buffer_bytes"])
            e["tied_params"] = [*e.get("tied_params", []), key]
        else:
            out.add_edge(u, v, cost=cost, compute_s=zeros, tied=True, tied_params=[key], **comps)


_COMPONENTS = ("compute_s", "comm_s", "memory_bytes", "buffer_bytes", *COST_PARTS,
               "step_compute_s", "step_comm_s")


def _components(costs: list[Cost]) -> dict[str, np.ndarray]:
    """Per-configuration compute/comm/memory/buffer arrays of a node's costs (1-D, float64)."""
    table = np.array([[getattr(c, k) for k in _COMPONENTS] for c in costs], dtype=np.float64)
    table = table.reshape(len(costs), len(_COMPONENTS))
    return {k: np.ascontiguousarray(table[:, i]) for i, k in enumerate(_COMPONENTS)}


def _check_batch(g: nx.DiGraph, batch_size: int | None) -> None:
    """Raise when ``batch_size`` disagrees with the captured graph's batch (inputs' dim 0)."""
    if batch_size is None:
        return
    inputs = [n for n in g.nodes if g.nodes[n]["kind"] == "input" and g.nodes[n]["out_shape"]]
    captured = {g.nodes[n]["out_shape"][0] for n in inputs}
    if captured and batch_size not in captured:
        raise ValueError(
            f"batch_size={batch_size} but the graph was captured with batch {sorted(captured)}; "
            "capture the model with example inputs of the global batch size"
        )


class _CallableCostGraphModule(type(sys.modules[__name__])):
    """Keeps ``tensoropt.cost_graph(...)`` callable after this module is imported.

    Importing ``tensoropt.cost_graph`` binds the *module* to that attribute of the package,
    shadowing the lazily exported function; calling the module forwards to :func:`cost_graph`.
    """

    def __call__(self, *args, **kwargs) -> nx.DiGraph:
        return cost_graph(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableCostGraphModule
