"""A plan's tensor peak in step order, from the exported graph and the plan's rows: the one figure the
planner's :attr:`tensoropt.plans.Plan.peak_memory_bytes` and the executor's ``predicted.peak_tensor_bytes``
(:func:`tensoropt.executor.state.peak_memory.predicted_peak_bytes`) both are.

:func:`plan_tensor_peak_bytes` hands :func:`estimators.step_peak.step_peak_bytes` the plan's operator and
edge rows (what each operator keeps, its gradients, the data-parallel ones bucketed) and the transients
the exported graph gives at each operator on one process:

* forward: a communication transient (a partial output and its reduced copy, a gathered operand and
  gloo's gather buffer: :func:`forward_transients`);
* the turn: what the loss holds beside every saved activation (its unsaved logits and their copy in
  its layout, then the gradients of the log-probabilities and of the logits: :func:`loss_turn_bytes`);
* backward: the activation gradients of each operator (the gradient of its output and those it makes
  for its operands: :func:`backward_transients`);
* the optimizer step's temporaries (:func:`estimators.peak.optimizer_step_transient_bytes`, from the
  rows' local parameter bytes).

A plan with a recompute chain (a checkpointed block, a loss chunk) is not walked here (None: its peak
stays the sum form's, with the executor's block-backward terms).

The graph is ``torch.export``'s (the planner's capture, ``OpGraph.program``; the executor's, exported on
meta): the same nodes, the same shapes, so both sides compute the same bytes. Its cost is a few walks
of the graph per plan (about 5 ms for a 1,000-node graph).

Example:
    >>> import torch
    >>> from tensoropt.capture import capture
    >>> g = capture(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 4)),
    ...             (torch.randn(8, 256),))
    >>> from tensoropt.configspace.configuration import Mesh
    >>> plan = StepPlan(Mesh((1,), ("gpu",)), {})
    >>> local = local_output_bytes(g.program.graph, plan)
    >>> local["input"], local["linear"], local["relu"], local["linear_1"], local["p_0_weight"]
    (8192, 16384, 16384, 128, 524288)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from estimators.chunked_loss import CHUNKED_LOSS
from estimators.peak import optimizer_step_transient_bytes
from estimators.step_peak import step_peak_moments
from tensoropt.capture.fxroles import tensor_args
from tensoropt.configspace.configuration import Configuration, Mesh, shard_dim


@dataclass(frozen=True)
class StepPlan:
    """What the step-order peak reads of a plan: the mesh, a configuration per node and plan.json's rows
    (the executor's :class:`~tensoropt.executor.job.plan.ExecPlan` has the same attributes)."""

    mesh: Mesh
    placements: dict[str, Configuration]
    layers: tuple = ()
    redistributions: tuple = field(default=())


def _packet(node) -> str:
    """The aten overload packet (``"linear"``) of a call_function node, else ``""``."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target.overloadpacket.__name__
    return getattr(target, "__name__", "")


def local_output_bytes(graph, plan) -> dict[str, int]:
    """Node name -> the bytes of its output (a tensor; 0 otherwise) on one process: its bytes over the
    mesh axes the plan's output layout of that node splits. A node the plan does not place (a view, a
    no-op cast, a ``getitem``) is split as its first tensor argument is.

    Example:
        >>> # not run here: needs a Trainer on a process group
        >>> local_output_bytes(trainer.ep.graph, trainer.plan)["addmm"]  # doctest: +SKIP
        3145728
    """
    mesh = list(plan.mesh.shape)
    out: dict[str, int] = {}
    splits: dict[str, int] = {}
    for node in graph.nodes:
        val = node.meta.get("val")
        config = plan.placements.get(node.name)
        split = 1
        if config is not None:
            for axis, placement in enumerate(config.output):
                if str(placement).startswith("S"):
                    split *= mesh[axis]
        else:  # unplaced: laid out as the tensor it reads
            args = [a for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
            split = splits.get(args[0].name, 1) if args else 1
        splits[node.name] = split
        out[node.name] = val.numel() * val.element_size() // split if isinstance(val, torch.Tensor) else 0
    return out


def backward_transients(graph, plan) -> dict[str, int]:
    """Placed node -> the activation gradients alive while its backward runs on one process: the
    gradient of its output and the gradients it makes for its operands that are activations (their
    producers' local outputs, through the views between; parameters' gradients are the plan's
    ``grad_bytes``, the batch's inputs take none). The step-order peak places each at its operator
    (:mod:`estimators.step_peak`).

    Example:
        >>> # not run here: needs a Trainer on a process group
        >>> backward_transients(trainer.ep.graph, trainer.plan)["gelu"]  # doctest: +SKIP
        2129920
    """
    local = local_output_bytes(graph, plan)
    out: dict[str, int] = {}
    for node in graph.nodes:
        if node.op != "call_function" or node.name not in plan.placements or not local.get(node.name):
            continue
        operands = {a.name for a in node.all_input_nodes if a.op == "call_function"}
        out[node.name] = local[node.name] + sum(local.get(a, 0) for a in operands)
    return out


_LOSSES = {"cross_entropy_loss"}
"""Losses whose backward holds two tensors of its input's size at once (the gradient of the
log-probabilities and of the logits; the log-probabilities themselves are saved, counted)."""


def _split(layout, mesh: list[int]) -> int:
    """How many pieces a layout (one placement string per mesh axis) cuts a tensor into."""
    out = 1
    for axis, placement in enumerate(layout or ()):
        if str(placement).startswith("S"):
            out *= mesh[axis]
    return out


def _nbytes(node) -> int:
    val = node.meta.get("val")
    return val.numel() * val.element_size() if isinstance(val, torch.Tensor) else 0


def loss_turn_bytes(graph, plan) -> tuple[int, int]:
    """(forward, backward): what the loss adds to the saved activations at the forward/backward turn, on
    one process, from ``graph`` and ``plan``.

    For each cross entropy the plan does not run chunked (a ``chunked_loss`` never holds the logits:
    its chunk is its recompute transient): its logits operand, reached through the unplaced views
    between it and the node that computes it, at that node's output layout.

    * forward: the logits, which nothing saves when every reader of them is a loss (cross entropy
      saves its log-probabilities, new, counted with the activations), plus the copy laid out for
      the loss where its input layout is another (both alive while the loss computes);
    * backward: the gradient of the log-probabilities and of the logits at the loss's input layout,
      alive at once (the log-probabilities are saved, counted); where the loss's layout is another
      than the logits', the logits' gradient laid back beside the first.

    Example:
        >>> # not run here: needs a Trainer's exported graph and plan
        >>> loss_turn_bytes(trainer.ep.graph, trainer.plan)  # doctest: +SKIP
        (4194304, 8388608)
    """
    mesh = list(plan.mesh.shape)
    forward = backward = 0
    for node in graph.nodes:
        config = plan.placements.get(node.name)
        if node.op != "call_function" or _packet(node) not in _LOSSES or config is None \
                or CHUNKED_LOSS in config.options or not node.args or not hasattr(node.args[0], "meta"):
            continue
        producer = node.args[0]
        while producer.op == "call_function" and producer.name not in plan.placements and \
                producer.all_input_nodes:
            producer = producer.all_input_nodes[0]
        made = plan.placements.get(producer.name)
        made_layout = tuple(made.output) if made is not None else ()
        loss_layout = tuple(config.inputs[0]) if config.inputs else made_layout
        whole = _nbytes(node.args[0])
        at_producer, at_loss = whole // _split(made_layout, mesh), whole // _split(loss_layout, mesh)
        moved = made_layout != loss_layout
        readers = _readers(producer, plan)
        unsaved = at_producer if readers and all(_packet(r) in _LOSSES for r in readers) else 0
        forward = max(forward, unsaved + (at_loss if moved else 0))
        backward = max(backward, at_loss + (max(at_loss, at_producer) if moved else at_loss))
    return forward, backward


def _readers(node, plan) -> list:
    """The placed nodes that read ``node``'s value, through unplaced nodes (views) between."""
    out, todo, seen = [], list(node.users), set()
    while todo:
        user = todo.pop()
        if user in seen:
            continue
        seen.add(user)
        if user.op == "call_function" and user.name not in plan.placements:
            todo.extend(user.users)
        else:
            out.append(user)
    return out


def forward_transients(graph, plan, operands: dict) -> dict[str, int]:
    """Node -> its forward communication transient on one process (:func:`forward_transient_bytes`
    is the largest; the step-order peak, :mod:`estimators.step_peak`, places each at its operator).

    Example:
        >>> # not run here: needs a Trainer on a process group
        >>> forward_transients(trainer.ep.graph, trainer.plan, trainer.operands)  # doctest: +SKIP
        {'linear': 16777216}
    """
    mesh = list(plan.mesh.shape)
    roots: dict[str, str] = {}
    out: dict[str, int] = {}
    for node in graph.nodes:
        config = plan.placements.get(node.name)
        if config is None:  # a view (or an unplaced op): laid out as the tensor it reads
            args = [a for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
            roots[node.name] = roots.get(args[0].name, args[0].name) if args else node.name
            continue
        roots[node.name] = node.name
        val = node.meta.get("val")
        if node.op != "call_function" or not isinstance(val, torch.Tensor):
            continue
        here = 0
        if config.partial_axes:
            here = 2 * val.numel() * val.element_size() // _split(config.output, mesh)
        for a, o in zip(tensor_args(node), operands.get(node.name, [])):
            if o.get("role") != "input" or o["index"] >= len(config.inputs):
                continue
            source = plan.placements.get(roots.get(a.name, a.name))
            target = config.inputs[o["index"]]
            if source is None:
                continue
            axes = [axis for axis, (p, t) in enumerate(zip(source.output, target))
                    if shard_dim(p) is not None and shard_dim(t) != shard_dim(p)]
            if not axes:
                continue
            gathered = [shard_dim(source.output[axis]) for axis in axes]
            whole = ["R" if axis in axes else t for axis, t in enumerate(target)]  # S(d) -> S(e): gathered
            dtype = getattr(a.meta.get("val"), "dtype", torch.float32)
            itemsize = dtype.itemsize
            nbytes = math.prod(o["shape"]) * itemsize // _split(whole, mesh)
            here = max(here, nbytes * (2 if any(d != 0 for d in gathered) else 1))
        if here:
            out[node.name] = here
    return out


def plan_tensor_peak_bytes(graph, plan, operands: dict, optimizer: str,
                           device_kind: str = "cpu") -> int | None:
    """The tensor peak of one process of ``plan`` (a :class:`StepPlan` or an ExecPlan with rows), walked
    in step order (see the module doc): the largest of :func:`plan_peak_moments`. ``operands``: node ->
    its OpGraph operands. None for a plan with a recompute chain (a checkpointed block, a loss chunk):
    the walk does not place the rebuilt tensors and the gradients in flight through a rerun block
    (:func:`tensoropt.executor.state.peak_memory.recompute_transient_bytes` prices them on the
    executor; the planner adds the largest chain to the plan's memory).

    Example:
        >>> # not run here: needs a plan's rows and its graph
        >>> plan_tensor_peak_bytes(trainer.ep.graph, trainer.plan, trainer.operands,
        ...                        "adamw")  # doctest: +SKIP
        32288768
    """
    if any(float(r.get("recompute_chain_bytes") or 0) for r in plan.layers):
        return None
    return int(max(b for _, b in plan_peak_moments(graph, plan, operands, optimizer, device_kind)))


def plan_peak_moments(graph, plan, operands: dict, optimizer: str,
                      device_kind: str = "cpu") -> list[tuple[str, float]]:
    """Every moment of ``plan``'s step with the bytes alive then
    (:func:`estimators.step_peak.step_peak_moments` with the graph's transients).

    Example:
        >>> # not run here: needs a plan's rows and its graph
        >>> max(plan_peak_moments(trainer.ep.graph, trainer.plan, trainer.operands, "adamw"),
        ...     key=lambda m: m[1])  # doctest: +SKIP
        ('end of backward', 32288768.0)
    """
    rows = [{k: r[k] for k in _ROW_KEYS if k in r} for r in plan.layers]
    for r in rows:
        config = plan.placements.get(str(r.get("node")))
        if config is not None and config.grad_sync_axes and "grad_sync_bytes" not in r:
            r["grad_sync_bytes"] = float(r.get("grad_bytes") or 0)  # all-reduced in buckets
    params = [float(r.get("param_bytes") or 0) for r in rows] or [0.0]
    loss_forward, loss_backward = loss_turn_bytes(graph, plan)
    edges = _edges_outside_rows(plan, rows)
    moments = step_peak_moments(rows, edges,
                                forward_transients=forward_transients(graph, plan, operands),
                                backward_transients=backward_transients(graph, plan),
                                turn_bytes=max(loss_forward, loss_backward),
                                optimizer_transient_bytes=optimizer_step_transient_bytes(
                                    optimizer, int(max(params)), int(sum(params)), device_kind))
    return moments


_ROW_KEYS = ("node", "param_bytes", "grad_bytes", "optimizer_bytes", "activation_bytes", "memory_bytes",
             "grad_sync_bytes", "recompute_chain_bytes", "block")
"""What the walk reads of a row (:func:`estimators.step_peak.step_peak_moments`,
:func:`estimators.peak.recompute_excess_bytes`)."""


def _edges_outside_rows(plan, rows: list[dict]) -> tuple:
    """``plan.redistributions`` where the rows leave their memory out (rows as
    :func:`estimators.breakdown.plan_breakdown` gives them: the rows and the edges add up to the plan's
    ``memory_bytes``), else none (plan.json's rows, :func:`tensoropt.summary.plan_layers`, hold their
    saved operands: the rows alone add up to it)."""
    memory = getattr(plan, "predicted", {}).get("memory_bytes")
    edges = tuple(plan.redistributions)
    if memory is None or not edges:
        return ()
    in_rows = sum(float(r.get("memory_bytes") or 0) for r in rows)
    on_edges = sum(float(e.get("memory_bytes") or 0) for e in edges)
    return edges if abs(in_rows + on_edges - memory) < abs(in_rows - memory) else ()
