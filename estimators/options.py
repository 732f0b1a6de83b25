"""Costs of the memory options recompute, zero1, zero2, zero3 (:mod:`tensoropt.configspace.options`).

All are priced as adjustments of the plain configuration's cost (:func:`estimators.op_costs.node_cost`
on :func:`~tensoropt.configspace.options.base_configuration`), so the objective stays additive:

* ``recompute`` (see :mod:`tensoropt.configspace.options`): time + two more forwards of the local
  shard (one for its own backward when it saves anything, one for the recipe its consumers keep);
  memory - its extra saved tensors and its output storage wherever it was charged (at the node, or
  on the edges of consumers that save or keep it in the same layout: they keep the recipe); the
  edges into it then charge every operand it reads (it keeps them) unless the producer recomputes
  too. What it rebuilds in backward (its output and the new tensors its backward saves) is
  ``Cost.recompute_bytes``, a transient: a chain of recomputing operators is alive at once
  (:func:`estimators.breakdown.recompute_chains` adds the largest chain to a plan's peak).
* ``zero3`` (per parameter with gradient-sync axes A, b its local bytes as computed with, s its
  stored shard): memory - (b - s) x (2 + optimizer state factor); communication - all-reduce(b, A)
  + 2 all-gather(b, A) (forward, and again in backward) + reduce-scatter(b, A); the optimizer
  steps over s; the gathered parameter is a transient buffer (``buffer_bytes``).
* ``zero1`` (per parameter it shards, :func:`~tensoropt.configspace.options.state_layouts`; b and
  s as above, s the optimizer-state shard): memory - (b - s) x optimizer state factor;
  communication + all-gather(b, A) of the updated shards (the all-reduce stays); the optimizer
  steps over s; the gathered parameter is a transient buffer.
* ``zero2``: as ``zero1``, and the gradient is reduce-scattered instead of all-reduced: memory
  - (b - s) x (1 + optimizer state factor); communication + reduce-scatter(b, A) + all-gather(b, A)
  - all-reduce(b, A); the full gradient, freed once reduce-scattered, is a transient buffer.

In a mixed precision (:mod:`tensoropt.precision`) each term is in its own dtype: b and s split
into the float32 master (parameter, optimizer state), the gradient (reduced in its dtype) and the
compute-dtype copy, which zero3 gathers (and reduce-scatters) in place of the master; a
recomputing node (without zero3) keeps every parameter's copy for its recipe.

Executor host overhead (:mod:`estimators.overhead`; 0 on GPU profiles): a node with options runs
through DTensor dispatch (never the local batch-split path), and each redistribution the option
adds costs ``redistribute_overhead_s`` (zero1: the all-gather; zero2: + the reduce-scatter; zero3:
the gather in forward, its backward and the gather again in backward), per sharded parameter.

The approximation beyond the plain model: the output of an operator that does not recompute, kept
by a recomputing consumer and saved or kept by one more consumer (while the operator itself does
not charge it), is charged on both edges (an over-count of one tensor).

Example:
    >>> # worked cases: tests/estimators/test_options.py
    >>> True
    True
"""

from __future__ import annotations

import dataclasses
from collections import ChainMap

import networkx as nx
import numpy as np

from estimators.collectives import grad_all_reduce_time_s
from estimators.compute import optimizer_time_s, roofline_time_s
from estimators.configuration import Configuration, local_shape
from estimators.memory import extra_saved_bytes, itemsize, keeps_param, numel, optimizer_factor, saved_spec
from estimators.memory_options import base_configuration, state_layouts
from estimators.op_costs import Cost, CostModel, GraphInfo, local_op, node_cost, param_bytes
from estimators.overhead import node_overhead_s


def recomputable(info: GraphInfo, name: str, node: dict, rules) -> bool:
    """Whether recomputing ``node`` keeps less: its output is kept for backward or it saves new tensors.

    Random operators (dropout) are left out: a recipe would draw again.

    Example:
        >>> from estimators.memory import SavingRules
        >>> relu = {"op": "aten.relu.default", "kind": "elementwise", "inputs": [{"shape": (4,)}],
        ...         "out_shape": (4,), "operands": []}
        >>> info = GraphInfo({"r": True}, {"r": True}, {"r": 0}, {"r": True})
        >>> recomputable(info, "r", relu, SavingRules())
        True
    """
    if node["kind"] in ("input", "dropout") or not info.computes_grad.get(name, False):
        return False
    if "rand" in node["op"] or "bernoulli" in node["op"]:
        return False
    if info.output_charged.get(name) or info.saving_consumers.get(name, 0) > 0:
        return True
    shapes = [tuple(e["shape"]) for e in node["inputs"]]
    return extra_saved_bytes(node, shapes, tuple(node["out_shape"]), rules) > 0


def _forward_s(model: CostModel, info: GraphInfo, name: str, node: dict, config: Configuration) -> float:
    op = local_op(node, config, model.mesh, info)
    timed = model.compute_time(name, node, config, op) if model.compute_time else None
    return (timed if timed is not None else roofline_time_s(model.cluster.device, op))[0]


def _recompute_delta(model: CostModel, info: GraphInfo, name: str, node: dict, base: Configuration):
    """(extra seconds, bytes no longer kept, bytes rebuilt in backward) of recomputing ``node`` in
    ``base``'s layout. Rebuilt: its output (the recipe's result, cached until every consumer's
    backward has read it) and the new tensors its own backward saves."""
    mesh, rules = model.mesh, model.rules
    op = local_op(node, base, mesh, info)
    out_local = local_shape(tuple(node["out_shape"]), base.output, mesh.shape)
    extra = extra_saved_bytes(node, list(op.in_shapes), out_local, rules)
    out_bytes = numel(out_local) * itemsize(str(node.get("out_dtype", "float32")))
    dropped = extra
    if info.output_charged.get(name):
        dropped += out_bytes
    spec = saved_spec(node, rules)
    own = int(bool(spec.inputs or spec.output or extra or node["params"]))
    reruns = own + 1  # its own backward, and the recipe (cached: once per backward)
    return reruns * _forward_s(model, info, name, node, base), dropped, extra + out_bytes


def _copies_kept_for_recompute(model: CostModel, info: GraphInfo, node: dict, base: Configuration) -> int:
    """Bytes of the compute-dtype parameter copies a recomputing node keeps beyond what the op keeps.

    A recomputing node keeps every operand it reads for the recipe, so in a mixed precision every
    parameter's cast copy (biases, a first layer's weight) lives until backward, not only the ones
    the op itself saves (:func:`estimators.memory.keeps_param`).
    """
    params = dict(base.params)
    need = [info.needs_grad.get(e["source"], False) for e in node["inputs"]]
    dtype = str(node.get("out_dtype", "float32"))
    return sum(param_bytes(model, shape, params.get(key, ("R",) * len(model.mesh.shape)), dtype).compute
               for key, shape in node["params"].items() if not keeps_param(node, shape, need))


def _zero3_delta(model: CostModel, info: GraphInfo, node: dict, config: Configuration, base: Configuration):
    """(communication s, optimizer s, [parameter, gradient, optimizer-state bytes], buffer bytes,
    redistributions, once-per-step communication s) changes of zero3 (the gathers and the
    reduce-scatter run per micro-batch: only the all-reduce they replace leaves the step's part).

    Per parameter (``ParamBytes`` b computed with, s stored): parameter, gradient and optimizer
    state shrink to the shard. In a mixed precision the shard is cast to the compute dtype before
    the gather (as FSDP2), so both gathers and the gradient's reduce-scatter move compute-dtype
    bytes; neither the cast shard nor the gathered copy is kept (backward casts and gathers again).
    """
    comm = model.comm
    dtype = str(node.get("out_dtype", "float32"))
    shared = set(node.get("shared_params") or ())
    stored, computed, sync = dict(config.params), dict(base.params), dict(config.grad_sync_axes)
    need = [info.needs_grad.get(e["source"], False) for e in node["inputs"]]
    mixed = model.precision.mixed
    comm_s, full_total, shard_total, buffer, step_comm_s = 0.0, 0, 0, 0.0, 0.0
    memory = [0, 0, 0]  # parameters (and kept copies), gradients, optimizer state
    for key, shape in node["params"].items():
        if key in shared:
            continue
        b = param_bytes(model, shape, computed[key], dtype)
        s = param_bytes(model, shape, stored[key], dtype)
        full_total, shard_total = full_total + b.stored, shard_total + s.stored
        memory[0] -= b.stored - s.stored
        memory[1] -= b.grad - s.grad
        memory[2] -= (b.stored - s.stored) * optimizer_factor(model.optimizer)
        if mixed and keeps_param(node, shape, need):  # the gathered copy is a recipe: not kept
            memory[0] -= b.compute
        axes = sync.get(key, ())
        if axes:
            all_reduce_s = grad_all_reduce_time_s(comm, b.grad, axes, _bucketed(model, info, dtype))
            comm_s += (
                2 * comm.time_s("all_gather", b.compute, axes)
                + comm.time_s("reduce_scatter", b.compute, axes)
                - all_reduce_s
            )
            step_comm_s -= all_reduce_s
            buffer = max(buffer, b.compute)
    device, n = model.cluster.device, len(node["params"])
    opt_s = optimizer_time_s(device, shard_total, n, model.optimizer) - optimizer_time_s(
        device, full_total, n, model.optimizer
    )
    moves = 3 * sum(1 for key in node["params"] if key not in shared and sync.get(key))
    return comm_s, opt_s, memory, buffer, moves, step_comm_s


def _bucketed(model: CostModel, info: GraphInfo, dtype: str) -> float | None:
    """The model's gradient bytes that share all-reduce buckets (as :func:`estimators.op_costs.node_cost`)."""
    return info.bucketed_grad_bytes(itemsize(model.precision.stored_dtypes(dtype)[1]))


def _zero12_delta(model: CostModel, info: GraphInfo, node: dict, config: Configuration, base: Configuration):
    """(communication s, optimizer s, [parameter, gradient, optimizer-state bytes], buffer bytes,
    redistributions, once-per-step communication s) changes of zero1/zero2 (the all-gather of the
    updated shards is once per step; zero2's reduce-scatter runs per micro-batch).

    The updated (master) shards are all-gathered in the stored dtype, zero2's gradients
    reduce-scattered in the gradient dtype.
    """
    mesh, comm = model.mesh, model.comm
    dtype = str(node.get("out_dtype", "float32"))
    shapes, computed, sync = node["params"], dict(base.params), dict(config.grad_sync_axes)
    grads_too = "zero2" in config.options
    comm_s, full_total, shard_total, buffer, step_comm_s = 0.0, 0, 0, 0.0, 0.0
    memory = [0, 0, 0]  # parameters, gradients, optimizer state
    for key, layout in state_layouts(config, shapes, mesh).items():
        b = param_bytes(model, shapes[key], computed[key], dtype)
        s = param_bytes(model, shapes[key], layout, dtype)
        full_total, shard_total = full_total + b.stored, shard_total + s.stored
        memory[2] -= (b.stored - s.stored) * optimizer_factor(model.optimizer)
        axes = sync[key]
        gather_s = comm.time_s("all_gather", b.stored, axes)
        comm_s += gather_s
        step_comm_s += gather_s
        if grads_too:
            memory[1] -= b.grad - s.grad
            all_reduce_s = grad_all_reduce_time_s(comm, b.grad, axes, _bucketed(model, info, dtype))
            comm_s += comm.time_s("reduce_scatter", b.grad, axes) - all_reduce_s
            step_comm_s -= all_reduce_s
        buffer = max(buffer, b.stored, b.grad if grads_too else 0)
    device, n = model.cluster.device, len(shapes)
    opt_s = optimizer_time_s(device, shard_total, n, model.optimizer) - optimizer_time_s(
        device, full_total, n, model.optimizer
    )
    moves = (1 + int(grads_too)) * len(state_layouts(config, shapes, mesh))
    return comm_s, opt_s, memory, buffer, moves, step_comm_s


def option_node_cost(model: CostModel, info: GraphInfo, name: str, node: dict, config: Configuration) -> Cost:
    """:func:`estimators.op_costs.node_cost` for a configuration that may carry memory options.

    Example:
        >>> # worked cases: tests/estimators/test_options.py
        >>> True
        True
    """
    base = base_configuration(config)
    cost = node_cost(model, info, name, node, base)
    if not config.options:
        return cost
    compute_s, comm_s, memory, buffer = cost.compute_s, cost.comm_s, cost.memory_bytes, cost.buffer_bytes
    step_compute_s, step_comm_s = cost.step_compute_s, cost.step_comm_s
    parts = [cost.param_bytes, cost.grad_bytes, cost.optimizer_bytes]
    rebuilt = 0.0
    device = model.cluster.device
    compute_s += node_overhead_s(device, node, config) - node_overhead_s(device, node, base)
    if "recompute" in config.options:
        extra_s, dropped, rebuilt = _recompute_delta(model, info, name, node, base)
        compute_s += extra_s
        memory -= dropped
        if model.precision.mixed and "zero3" not in config.options:
            kept = _copies_kept_for_recompute(model, info, node, base)
            memory += kept
            parts[0] += kept
    zero = _zero3_delta if "zero3" in config.options else _zero12_delta
    if {"zero1", "zero2", "zero3"} & set(config.options):
        d_comm, d_opt, d_mem, d_buf, moves, d_step_comm = zero(model, info, node, config, base)
        d_comm += moves * device.redistribute_overhead_s
        comm_s, compute_s, memory = comm_s + d_comm, compute_s + d_opt, memory + sum(d_mem)
        step_compute_s, step_comm_s = step_compute_s + d_opt, step_comm_s + d_step_comm
        parts = [p + d for p, d in zip(parts, d_mem)]
        buffer = max(buffer, d_buf)
    return Cost(compute_s=compute_s, comm_s=comm_s, memory_bytes=float(memory), buffer_bytes=float(buffer),
                param_bytes=float(parts[0]), grad_bytes=float(parts[1]), optimizer_bytes=float(parts[2]),
                recompute_bytes=rebuilt, step_compute_s=step_compute_s, step_comm_s=step_comm_s)


def option_edge_table(
    model: CostModel,
    info: GraphInfo,
    g: nx.DiGraph,
    u: str,
    v: str,
    confs_u: list[Configuration],
    confs_v: list[Configuration],
    table,
) -> dict[str, np.ndarray]:
    """``table`` (:func:`estimators.op_costs.edge_cost_table`) for configurations with memory options.

    Options do not change layouts, so the plain table applies, except the memory of the columns
    of a recomputing ``v``: it keeps every operand it reads (priced as if it saved them all).

    Example:
        >>> # worked cases: tests/estimators/test_options.py
        >>> True
        True
    """
    base_u = [base_configuration(c) for c in confs_u]
    base_v = [base_configuration(c) for c in confs_v]
    out = table(model, info, g, u, v, base_u, base_v)
    rows = [[i for i, c in enumerate(confs_u) if ("recompute" in c.options) == r] for r in (False, True)]
    cols = [[j for j, c in enumerate(confs_v) if ("recompute" in c.options) == r] for r in (False, True)]
    if not rows[1] and not cols[1]:
        return out
    memory = out["memory_bytes"].copy()
    for ru, rv in ((False, True), (True, False), (True, True)):
        i, j = rows[ru], cols[rv]
        if i and j:
            h = _keeping_all(g, u, v) if rv else g
            block = table(model, _charged(info, u) if ru else info, h, u, v,
                          [base_u[k] for k in i], [base_v[k] for k in j])
            memory[np.ix_(i, j)] = block["memory_bytes"]
    return dict(out, memory_bytes=memory)


def _charged(info: GraphInfo, u: str) -> GraphInfo:
    """``info`` with ``u``'s output taken as charged elsewhere: a recipe, nothing to keep."""
    return dataclasses.replace(info, output_charged=ChainMap({u: True}, info.output_charged))


def _keeping_all(g: nx.DiGraph, u: str, v: str) -> nx.DiGraph:
    """The edge (u, v) alone, ``v`` made opaque (the rule that saves every operand it reads)."""
    h = nx.DiGraph()
    h.add_node(u, **g.nodes[u])
    h.add_node(v, **dict(g.nodes[v], kind="opaque"))
    h.add_edge(u, v, **g.edges[u, v])
    return h


def option_edge_cost(
    model: CostModel, info: GraphInfo, g: nx.DiGraph, u: str, v: str, cu: Configuration, cv: Configuration
) -> Cost:
    """:func:`estimators.op_costs.edge_cost` of one configuration pair that may carry memory options.

    Example:
        >>> # worked cases: tests/estimators/test_options.py
        >>> True
        True
    """
    from estimators.op_costs import edge_cost

    keeps = "recompute" in cv.options
    h = _keeping_all(g, u, v) if keeps else g
    if "recompute" in cu.options:
        info = _charged(info, u)
    return edge_cost(model, info, h, u, v, base_configuration(cu), base_configuration(cv))


def with_recompute_rule(info: GraphInfo, g: nx.DiGraph, rules):
    """``name -> bool`` predicate for :func:`tensoropt.configspace.options.with_options`.

    Example:
        >>> pred = with_recompute_rule(GraphInfo({}, {}, {}, {}), nx.DiGraph(), None)
        >>> callable(pred)
        True
    """
    return lambda name: recomputable(info, name, g.nodes[name], rules)


__all__ = [
    "option_edge_cost",
    "option_edge_table",
    "option_node_cost",
    "recomputable",
    "with_recompute_rule",
]
