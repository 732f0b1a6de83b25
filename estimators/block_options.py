"""Whole-block activation checkpointing as planned options: ``block_recompute`` and ``block_selective``.

A *block* is a module whose operators are checkpointed together (torch-free; the executor's side is
:mod:`tensoropt.executor.state.block_checkpoint`): the repeated modules the capture finds (a
transformer's layers ``model.layers.0`` .. ``model.layers.31``, a ResNet's residual stages
``layer1.0``, ...; :func:`repeated_blocks`) or the modules a job names in
``training.checkpoint_modules`` (:func:`find_blocks`). Two memory options multiply the
configurations of a block's operators (:func:`with_block_options`); labels append them
(``"batch=8,zero3,block_recompute"``):

* ``block_recompute`` (full checkpoint): the block runs under ``torch.utils.checkpoint``
  (non-reentrant) and keeps only its inputs; its forward runs again in backward.
* ``block_selective`` (torchtitan's op-level selective checkpoint): the same, with the outputs of
  the matmul-class operators and attention (:data:`SAVED_KINDS`) saved by the checkpoint's policy
  (``create_selective_checkpoint_contexts``); the rest is recomputed.

Every operator of a block takes the same block option or none: an edge inside a block between two
configurations that disagree costs ``+inf`` (the solver never picks it), so the per-block choice
sits in the same exact frontier as the per-operator options, and identical layers keep identical
tables (the solver reuses one interior elimination for all of them).

Prices (additive; :func:`block_node_cost`, :func:`block_edge_table`):

* time: + the operator's forward (full), or + its forward where it is not in :data:`SAVED_KINDS`
  (selective): the block's forward runs once more, or its non-saved part;
* memory: an operator keeps no saved activation (selective: a saved-kind operator keeps its
  output and the extra tensors it saves, e.g. attention's logsumexp); the block's inputs are kept
  by the checkpoint, each once per block (on the edge to its first consumer in the block, in the
  layout its producer made it); in a mixed precision the compute-dtype copies of the parameters
  are the checkpoint's inputs too (cast outside the block: kept, as a recomputing operator keeps
  them; under zero3 the cast shards, the gather running inside the block);
* the recompute transient: the block's activations rebuilt during its backward (each operator's
  output, where something saves it, and the extra tensors it saves) is each operator's
  ``recompute_bytes``; :func:`estimators.breakdown.recompute_chains` adds the largest block's sum
  once to a plan's peak (a transient, not in the additive objective).

The approximations: the forward redistributions inside a block, recomputed in backward, are not
charged again; an output that a block operator charged at the node (two or more consumers save
it) and that a consumer outside the block saves is charged on that consumer's edge again.

Example:
    >>> blocks = repeated_blocks({"a": "layers.0.fc", "b": "layers.1.fc", "c": "head"})
    >>> sorted(blocks.items())
    [('layers.0', ['a']), ('layers.1', ['b'])]
"""

from __future__ import annotations

import dataclasses
import re
from collections import ChainMap
from collections.abc import Iterable, Sequence

import networkx as nx
import numpy as np

from estimators.configuration import Configuration

BLOCK_OPTIONS: tuple[str, ...] = ("block_recompute", "block_selective")
"""The block memory options (at most one per configuration)."""

SAVED_KINDS: frozenset[str] = frozenset({"linear", "matmul", "conv2d", "sdpa"})
"""Operator kinds whose outputs ``block_selective`` saves (matmul-class and attention: torchtitan's
op-level policy saves ``mm``, ``addmm``, ``bmm`` and the attention kernels' outputs)."""

_INDEX = re.compile(r"^\d+$")


class BlockError(ValueError):
    """A ``training.checkpoint_modules`` entry that cannot be checkpointed (the message names it)."""


def block_option(config: Configuration) -> str | None:
    """The block option a configuration carries, or None.

    Example:
        >>> c = Configuration("replicate,block_recompute", (), (), (), (), options=("block_recompute",))
        >>> block_option(c), block_option(Configuration("replicate", (), (), (), ()))
        ('block_recompute', None)
    """
    for o in config.options:
        if o in BLOCK_OPTIONS:
            return o
    return None


def without_block_option(config: Configuration) -> Configuration:
    """``config`` with its block option removed (label and options).

    Example:
        >>> c = Configuration("batch=2,zero3,block_selective", (), (), (), (),
        ...                   options=("zero3", "block_selective"))
        >>> without_block_option(c).label
        'batch=2,zero3'
    """
    option = block_option(config)
    if option is None:
        return config
    label = ",".join(t for t in config.label.split(",") if t != option)
    return dataclasses.replace(config, label=label, options=tuple(o for o in config.options if o != option))


def repeated_blocks(modules: dict[str, str]) -> dict[str, list[str]]:
    """Block path -> its nodes, for the repeated modules of a model (the default blocks).

    A module path's first component that is an index (``model.layers.3``, ``transformer.h.0``,
    ``layer2.1``) under a parent with two or more indexed children makes a block.

    Args:
        modules: node name -> its owning module path (``""``: the root), in graph order.

    Example:
        >>> repeated_blocks({"x": "h.0.attn", "y": "h.0.mlp", "z": "h.1.attn", "w": ""})
        {'h.0': ['x', 'y'], 'h.1': ['z']}
    """
    candidates: dict[str, list[str]] = {}
    children: dict[str, set[str]] = {}
    for node, path in modules.items():
        parts = path.split(".") if path else []
        for i, part in enumerate(parts):
            if _INDEX.match(part):
                parent = ".".join(parts[:i])
                block = ".".join(parts[: i + 1])
                candidates.setdefault(block, []).append(node)
                children.setdefault(parent, set()).add(block)
                break
    keep = {b for kids in children.values() if len(kids) >= 2 for b in kids}
    return {b: nodes for b, nodes in candidates.items() if b in keep}


def find_blocks(modules: dict[str, str],
                checkpoint_modules: Sequence[str] | None = None) -> dict[str, list[str]]:
    """Block path -> its nodes: the named modules, or the repeated ones (:func:`repeated_blocks`).

    A named module that is a container of indexed children (``model.layers``) names each child.

    Args:
        modules: node name -> owning module path, in graph order.
        checkpoint_modules: the job's ``training.checkpoint_modules`` (None or empty: the repeated
            modules).

    Raises:
        BlockError: a named module the model lacks (the message lists the repeated modules).

    Example:
        >>> mods = {"x": "h.0.attn", "y": "h.1.attn", "z": "head"}
        >>> find_blocks(mods, ["h"]), find_blocks(mods, ["head"])
        ({'h.0': ['x'], 'h.1': ['y']}, {'head': ['z']})
    """
    if not checkpoint_modules:
        return repeated_blocks(modules)
    out: dict[str, list[str]] = {}
    for name in checkpoint_modules:
        inside = {n: p for n, p in modules.items() if p == name or p.startswith(name + ".")}
        if not inside:
            known = sorted(repeated_blocks(modules))
            shown = known[:3] + (["..."] if len(known) > 3 else [])
            hint = f"; its repeated modules are {shown}" if known else ""
            raise BlockError(f"training.checkpoint_modules: the model has no module {name!r} with operators"
                             f"{hint}; name a module path as in the model's named_modules()")
        indexed: dict[str, list[str]] = {}
        for n, p in inside.items():
            rest = p[len(name) + 1:].split(".") if p != name else []
            if rest and _INDEX.match(rest[0]):
                indexed.setdefault(f"{name}.{rest[0]}", []).append(n)
            else:
                indexed = {}
                break
        for block, nodes in (indexed or {name: list(inside)}).items():
            if block in out:
                raise BlockError(f"training.checkpoint_modules: module {block!r} is named twice (or inside "
                                 "another named module); name each block once")
            out[block] = nodes
    return out


def graph_blocks(g: nx.DiGraph, checkpoint_modules: Sequence[str] | None = None) -> dict[str, list[str]]:
    """Block path -> its compute nodes in an OpGraph's networkx graph (see :func:`find_blocks`).

    Only operators that take part in backward count; a block whose operators do not form one
    connected piece through its own edges is left out when found by repetition, and refused when
    named (its inputs would be split between separately checkpointed pieces).

    Raises:
        BlockError: a named module the model lacks or that cannot be checkpointed as one piece.

    Example:
        >>> g = nx.DiGraph()
        >>> g.add_node("x", kind="input", module="")
        >>> g.add_node("a", kind="linear", module="h.0"); g.add_node("b", kind="linear", module="h.1")
        >>> g.add_edge("x", "a"); g.add_edge("a", "b")
        >>> graph_blocks(g)
        {'h.0': ['a'], 'h.1': ['b']}
    """
    modules = {n: str(g.nodes[n].get("module") or "") for n in nx.topological_sort(g)
               if g.nodes[n].get("kind") != "input"}
    blocks = find_blocks(modules, checkpoint_modules)
    out = {}
    for block, nodes in blocks.items():
        pieces = nx.number_weakly_connected_components(g.subgraph(nodes))
        if pieces == 1:
            out[block] = nodes
        elif checkpoint_modules:
            raise BlockError(f"training.checkpoint_modules: module {block!r} has {pieces} separate groups of "
                             "operators (its inputs are split between them): it cannot be checkpointed as "
                             "one block; name a module whose operators connect, or leave the key out")
    return out


def node_blocks(blocks: dict[str, list[str]]) -> dict[str, str]:
    """Node -> the block it belongs to.

    Example:
        >>> node_blocks({"h.0": ["a", "b"]})
        {'a': 'h.0', 'b': 'h.0'}
    """
    return {n: b for b, nodes in blocks.items() for n in nodes}


def with_block_options(
    configurations: dict[str, list[Configuration]], blocks: dict[str, list[str]], options: Iterable[str]
) -> dict[str, list[Configuration]]:
    """Every block operator's configurations plus their block variants (the others unchanged).

    Each configuration without ``recompute`` gains one variant per block option in ``options``;
    inside a block the block options replace the per-operator ``recompute`` (its variants are
    dropped there: a whole block keeps less than any chain inside it; with both block options the
    solve of the Llama-3-8B shape takes 1.24 x the time without them, docs/results.md ``selsolve2``).

    Example:
        >>> c = Configuration("replicate", (), (), (), ())
        >>> r = Configuration("replicate,recompute", (), (), (), (), options=("recompute",))
        >>> opts = ["block_recompute", "recompute"]
        >>> out = with_block_options({"a": [c, r], "b": [c, r]}, {"h.0": ["a"]}, opts)
        >>> [x.label for x in out["a"]], [x.label for x in out["b"]]
        (['replicate', 'replicate,block_recompute'], ['replicate', 'replicate,recompute'])
    """
    chosen = [o for o in BLOCK_OPTIONS if o in set(options)]
    if not chosen:
        return configurations
    inside = node_blocks(blocks)
    out = {}
    for name, confs in configurations.items():
        if name not in inside:
            out[name] = confs
            continue
        plain = [c for c in confs if "recompute" not in c.options]
        out[name] = plain + [_with_block(c, o) for o in chosen for c in plain]
    return out


def _with_block(config: Configuration, option: str) -> Configuration:
    return dataclasses.replace(config, label=f"{config.label},{option}", options=(*config.options, option))


def keeps_output(kind: str, option: str | None) -> bool:
    """Whether an operator of ``kind`` under block ``option`` keeps its own output after forward.

    Example:
        >>> keeps_output("linear", "block_selective"), keeps_output("linear", "block_recompute")
        (True, False)
    """
    return option == "block_selective" and kind in SAVED_KINDS


# -- prices ------------------------------------------------------------------------------------


def block_node_cost(model, info, name: str, node: dict, config: Configuration, plain_cost, forward_s: float):
    """The :class:`estimators.op_costs.Cost` of ``node`` under a block option.

    Args:
        model, info: the cost model and graph facts (:mod:`estimators.op_costs`).
        name, node: the operator.
        config: its configuration (with a block option).
        plain_cost: the cost of the same configuration without the block option.
        forward_s: the operator's forward time in that layout.

    Example:
        >>> # worked cases: tests/estimators/test_block_options.py
        >>> True
        True
    """
    from estimators.configuration import local_shape
    from estimators.memory import extra_saved_bytes, itemsize, numel
    from estimators.op_costs import local_op

    option = block_option(config)
    base = without_block_option(config)
    state = plain_cost.param_bytes + plain_cost.grad_bytes + plain_cost.optimizer_bytes
    op = local_op(node, base, model.mesh, info)
    out_local = local_shape(tuple(node["out_shape"]), base.output, model.mesh.shape)
    out_bytes = numel(out_local) * itemsize(str(node.get("out_dtype", "float32")))
    extra = extra_saved_bytes(node, list(op.in_shapes), out_local, model.rules) \
        if info.computes_grad.get(name, True) else 0
    saved_anywhere = info.output_charged.get(name) or info.saving_consumers.get(name, 0) > 0
    rebuilt = extra + (out_bytes if saved_anywhere else 0)
    kept = 0.0
    compute_s = plain_cost.compute_s
    if keeps_output(node["kind"], option):
        kept = float(out_bytes + _kept_extra(node, list(op.in_shapes), out_local, model, extra))
    else:
        compute_s += forward_s
    param = plain_cost.param_bytes
    if model.precision.mixed:  # the compute-dtype copies, cast outside the block, are its inputs
        param += _kept_copies(model, info, node, config, base)
        state = param + plain_cost.grad_bytes + plain_cost.optimizer_bytes
    return dataclasses.replace(plain_cost, compute_s=compute_s, memory_bytes=float(state + kept),
                               param_bytes=float(param), recompute_bytes=float(0.0 if kept else rebuilt))


def _kept_extra(node: dict, in_shapes: list, out_local: tuple, model, extra: float) -> float:
    """What a selective checkpoint keeps of the extra tensors a saved-kind operator saves: the ones
    the operator itself returns (attention's logsumexp), not an additive mask made from a boolean one
    (a ``where`` before the kernel: not a saved op, so the policy recomputes it, and it is rebuilt
    in backward with the block's other recomputed tensors; measured on HF Llama and GPT-2, 1 MiB per
    block at width 256: docs/results.md, "the activation gradients in flight")."""
    from estimators.memory import extra_saved_bytes

    attrs = node.get("attrs") or {}
    if node.get("kind") != "sdpa" or not attrs.get("has_mask") or not extra:
        return float(extra)
    unmasked = {**node, "attrs": {**attrs, "has_mask": False}}
    return float(min(extra, extra_saved_bytes(unmasked, in_shapes, out_local, model.rules)))


def _kept_copies(model, info, node: dict, config: Configuration, base: Configuration) -> float:
    """Bytes of the compute-dtype parameter copies a checkpointed block keeps for ``node`` beyond
    what its plain cost charges: every copy (a recomputing operator's rule), or under zero3 the
    cast shards (the gather runs inside the block; the plain zero3 cost keeps no copy)."""
    from estimators.op_costs import param_bytes
    from estimators.options import _copies_kept_for_recompute

    if "zero3" not in config.options:
        return float(_copies_kept_for_recompute(model, info, node, base))
    stored, shared = dict(config.params), set(node.get("shared_params") or ())
    dtype = str(node.get("out_dtype", "float32"))
    return float(sum(param_bytes(model, shape, stored[key], dtype).compute
                     for key, shape in node["params"].items() if key not in shared and key in stored))


def edge_role(g: nx.DiGraph, inside: dict[str, str], u: str, v: str,
              order: dict[str, int] | None = None) -> str:
    """How edge ``(u, v)`` meets the blocks: ``inner`` (one block), ``entry-first`` (``u`` enters
    ``v``'s block and ``v`` is its first consumer there), ``entry`` (another consumer there),
    ``exit`` (``u`` in a block, ``v`` not) or ``""``.

    Args:
        g, inside: the graph and node -> block (:func:`node_blocks`).
        u, v: the edge.
        order: node -> topological position (computed when not given).

    Example:
        >>> g = nx.DiGraph([("x", "a"), ("x", "b"), ("a", "b")])
        >>> inside = {"a": "h.0", "b": "h.0"}
        >>> [edge_role(g, inside, *e) for e in (("x", "a"), ("x", "b"), ("a", "b"))]
        ['entry-first', 'entry', 'inner']
    """
    bu, bv = inside.get(u), inside.get(v)
    if bv is not None and bu == bv:
        return "inner"
    if bv is not None:
        if order is None:
            order = {n: i for i, n in enumerate(nx.topological_sort(g))}
        consumers = [w for w in g.successors(u) if inside.get(w) == bv and not g.edges[u, w].get("tied")]
        return "entry-first" if min(consumers, key=order.__getitem__) == v else "entry"
    return "exit" if bu is not None else ""


def block_edge_table(model, info, g: nx.DiGraph, u: str, v: str, confs_u, confs_v, role: str,
                     table) -> dict[str, np.ndarray]:
    """An edge's ``C_u x C_v`` cost arrays where block options meet it (see the module docstring).

    Args:
        model, info, g, u, v: as :func:`estimators.op_costs.edge_cost_table`.
        confs_u, confs_v: the two nodes' configurations (block options among them).
        role: :func:`edge_role`.
        table: prices configurations without block options (``(model, info, g, u, v, cu, cv) ->
            arrays``: :func:`estimators.options.option_edge_table` over the plain table).

    Example:
        >>> # worked cases: tests/estimators/test_block_options.py
        >>> True
        True
    """
    from estimators.op_costs import _bytes

    opt_u = [block_option(c) for c in confs_u]
    opt_v = [block_option(c) for c in confs_v]
    plain_u = [without_block_option(c) for c in confs_u]
    plain_v = [without_block_option(c) for c in confs_v]
    out = table(model, info, g, u, v, plain_u, plain_v)
    if not any(opt_u) and not any(opt_v):
        return out
    kind_u = g.nodes[u]["kind"]
    drops = [i for i, o in enumerate(opt_u) if o and not keeps_output(kind_u, o)]
    memory, comm = out["memory_bytes"].copy(), out["comm_s"].copy()
    if drops and info.output_charged.get(u):  # u keeps nothing: a consumer that saves it keeps it
        uncharged = dataclasses.replace(info, output_charged=ChainMap({u: False}, info.output_charged))
        again = table(model, uncharged, g, u, v, [plain_u[i] for i in drops], plain_v)
        memory[drops, :] = again["memory_bytes"]
    if role == "inner":
        same = np.array([[a == b for b in opt_v] for a in opt_u], dtype=bool)
        both = np.array([[a is not None and a == b for b in opt_v] for a in opt_u], dtype=bool)
        memory = np.where(both, 0.0, memory)
        memory = np.where(same, memory, np.inf)
        comm = np.where(same, comm, np.inf)
    elif role.startswith("entry"):
        cols = [j for j, o in enumerate(opt_v) if o]
        du = g.nodes[u]
        memory[:, cols] = 0.0
        if role == "entry-first":  # the checkpoint keeps u's output, unless u's node charges it
            dtype = str(du.get("out_dtype", "float32"))
            charged = bool(info.output_charged.get(u))
            kept = np.array([0.0 if charged and i not in drops else _bytes(du["out_shape"], c.output,
                                                                             model.mesh, dtype)
                             for i, c in enumerate(plain_u)], dtype=np.float64)
            for j in cols:
                memory[:, j] = kept
    return dict(out, memory_bytes=memory, comm_s=comm)


def priced_node_cost(model, info, name: str, node: dict, config: Configuration):
    """:func:`estimators.options.option_node_cost`, with the block options priced by :func:`block_node_cost`.

    Example:
        >>> # worked cases: tests/estimators/test_block_options.py
        >>> True
        True
    """
    from estimators.memory_options import base_configuration
    from estimators.options import _forward_s, option_node_cost

    if block_option(config) is None:
        return option_node_cost(model, info, name, node, config)
    plain = without_block_option(config)
    cost = option_node_cost(model, info, name, node, plain)
    forward_s = _forward_s(model, info, name, node, base_configuration(plain))
    return block_node_cost(model, info, name, node, config, cost, forward_s)


__all__ = [
    "BLOCK_OPTIONS",
    "SAVED_KINDS",
    "BlockError",
    "block_edge_table",
    "block_node_cost",
    "block_option",
    "edge_role",
    "find_blocks",
    "graph_blocks",
    "keeps_output",
    "node_blocks",
    "priced_node_cost",
    "repeated_blocks",
    "with_block_options",
    "without_block_option",
]
