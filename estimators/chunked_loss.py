"""The chunked head + loss as a planned option: ``chunked_loss`` (torch-free).

A causal LM's loss reads the head's logits, ``tokens x vocabulary``, and a cross entropy keeps a
float32 copy of them for backward (its log-probabilities): at 32k tokens and a 128k vocabulary
15.7 GiB per device whichever way 8 devices split them. ``chunked_loss`` fuses the head's matmul
(a linear whose only consumer is a cross entropy, through views and casts only: HuggingFace's
``ForCausalLMLoss`` chain, or ``loss: cross_entropy`` on a model's logits) with the loss and runs
both over chunks of ``training.loss_chunk_tokens`` tokens: forward computes each chunk's logits,
its loss sum, and frees them; backward computes each chunk's logits again, their gradient, the
head input's and weight's gradients, and frees them (the executor's side:
:mod:`tensoropt.executor.ops.chunked_loss`). Only one chunk's logits are ever alive.

The pair (head, loss) is a *loss block* (:func:`loss_blocks`). Both operators take the option or
neither does (an edge between them that disagrees costs ``+inf``); it is offered where the fused
op computes on whole local rows (:func:`head_offers`, :func:`loss_offers`): the head's output
and its input laid out alike on every mesh axis, replicated or split on the token dim 0 (the
weight whole: no vocabulary or partial-sum split), the loss's logits and labels laid out as the
head's output (:func:`pair_fits`), no class weights and no label smoothing.

Prices (:func:`chunked_node_cost`, :func:`chunked_edge_table`):

* time: + the head's forward and the loss's forward (both run again in backward, per chunk);
* memory: the loss keeps no logits (its saved log-probabilities are gone, the edge between head
  and loss keeps nothing); the head's input, the labels and the weight (its compute-dtype copy in
  a mixed precision; regathered in backward under zero3) stay as the plain plan keeps them;
* the transient: one chunk's logits during the loss's backward (and forward), as float32
  probabilities and one float32 temporary of the same size (:func:`chunk_transient_bytes`),
  added once to a plan's peak (:func:`estimators.breakdown.recompute_chains`).

Example:
    >>> chunk_transient_bytes(rows=32768, classes=128256, chunk_tokens=2048) / 2**30
    1.95703125
"""

from __future__ import annotations

import dataclasses

import networkx as nx
import numpy as np

from estimators.configuration import Configuration, local_shape

CHUNKED_LOSS = "chunked_loss"
"""The option's name in ``training.memory_options`` and in configuration labels."""

DEFAULT_CHUNK_TOKENS = 2048
"""``training.loss_chunk_tokens``'s default: tokens (rows of the logits) per chunk."""

_ROW_LAYOUTS = ("R", "S(0)")


def chunk_transient_bytes(rows: int, classes: int, chunk_tokens: int) -> int:
    """Bytes alive for one chunk: its float32 logits-turned-probabilities and one float32 temporary.

    Args:
        rows: the rows (tokens) of this device's logits.
        classes: the vocabulary size.
        chunk_tokens: ``training.loss_chunk_tokens``.

    Example:
        >>> chunk_transient_bytes(rows=100, classes=10, chunk_tokens=64)
        5120
        >>> chunk_transient_bytes(rows=10, classes=10, chunk_tokens=64)
        800
    """
    return 2 * min(int(rows), int(chunk_tokens)) * int(classes) * 4


def _is_loss(node: dict) -> bool:
    return str(node.get("op", "")).startswith("aten.cross_entropy_loss")


def _plain_loss(node: dict) -> bool:
    attrs = node.get("attrs") or {}
    return (not attrs.get("weighted") and not attrs.get("label_smoothing")
            and attrs.get("reduction", "mean") in ("mean", "sum") and attrs.get("class_dim", 1) == 1)


def loss_blocks(g: nx.DiGraph) -> dict[str, str]:
    """Loss node -> its head (the linear whose logits it reads), for every fusable pair.

    A pair fuses where the loss is a 2-D cross entropy without class weights or label smoothing
    (mean or sum), its logits (operand 0) come from a linear with a 2-D weight whose only
    consumer it is, and the labels from elsewhere.

    Example:
        >>> g = nx.DiGraph()
        >>> g.add_node("head", kind="linear", op="aten.linear.default", params={"w": (10, 4)})
        >>> g.add_node("y", kind="input", op="")
        >>> g.add_node("ce", kind="cross_entropy", op="aten.cross_entropy_loss.default",
        ...            inputs=[{"source": "head", "shape": (6, 10)}, {"source": "y", "shape": (6,)}],
        ...            attrs={"reduction": "mean"})
        >>> g.add_edge("head", "ce"); g.add_edge("y", "ce")
        >>> loss_blocks(g)
        {'ce': 'head'}
    """
    out = {}
    for v in g.nodes:
        d = g.nodes[v]
        inputs = d.get("inputs") or []
        if not _is_loss(d) or not _plain_loss(d) or len(inputs) < 2 or len(inputs[0].get("shape", ())) != 2:
            continue
        u = inputs[0].get("source")
        if u is None or u not in g or inputs[1].get("source") == u:
            continue
        head = g.nodes[u]
        params = list((head.get("params") or {}).values())
        users = [w for w in g.successors(u) if not g.edges[u, w].get("tied")]
        if head.get("kind") == "linear" and params and len(params[0]) == 2 and users == [v]:
            out[v] = u
    return out


def _rows_layout(layout) -> bool:
    return all(p in _ROW_LAYOUTS for p in layout)


def head_offers(config: Configuration) -> bool:
    """Whether a head configuration can take ``chunked_loss``: whole weight, rows replicated or split.

    Example:
        >>> head_offers(Configuration("batch=2", (("batch", (0,)),), (("S(0)",),), (("w", ("R",)),),
        ...                           ("S(0)",)))
        True
        >>> head_offers(Configuration("out=2", (("out", (0,)),), (("R",),), (("w", ("S(0)",)),), ("S(2)",)))
        False
    """
    if "recompute" in config.options or config.partial_axes or not config.inputs:
        return False
    return _rows_layout(config.output) and tuple(config.inputs[0]) == tuple(config.output)


def loss_offers(config: Configuration) -> bool:
    """Whether a loss configuration can take ``chunked_loss``: logits and labels alike, rows split or not.

    Example:
        >>> loss_offers(Configuration("batch=2", (("batch", (0,)),), (("S(0)",), ("S(0)",)), (), ("R",)))
        True
        >>> loss_offers(Configuration("out=2", (("out", (0,)),), (("S(1)",), ("R",)), (), ("R",)))
        False
    """
    if "recompute" in config.options or len(config.inputs) < 2:
        return False
    return _rows_layout(config.inputs[0]) and tuple(config.inputs[1]) == tuple(config.inputs[0])


def pair_fits(head: Configuration, loss: Configuration) -> bool:
    """Whether a head and a loss configuration, both chunked, need no move between them.

    Example:
        >>> h = Configuration("batch=2", (), (("S(0)",),), (), ("S(0)",))
        >>> ce = Configuration("batch=2", (), (("S(0)",), ("S(0)",)), (), ("R",))
        >>> pair_fits(h, ce), pair_fits(h, dataclasses.replace(ce, inputs=(("R",), ("R",))))
        (True, False)
    """
    return tuple(head.output) == tuple(loss.inputs[0])


def _with(config: Configuration) -> Configuration:
    return dataclasses.replace(config, label=f"{config.label},{CHUNKED_LOSS}",
                               options=(*config.options, CHUNKED_LOSS))


def with_chunked_loss(configurations: dict[str, list[Configuration]], blocks: dict[str, str],
                      options) -> dict[str, list[Configuration]]:
    """The configurations plus a ``chunked_loss`` variant of each one that offers it, on loss blocks.

    Args:
        configurations: node -> configurations (with the other memory options already).
        blocks: :func:`loss_blocks`.
        options: the job's memory options (nothing changes without ``chunked_loss``).

    Example:
        >>> h = Configuration("batch=2", (), (("S(0)",),), (), ("S(0)",))
        >>> ce = Configuration("batch=2", (), (("S(0)",), ("S(0)",)), (), ("R",))
        >>> out = with_chunked_loss({"head": [h], "ce": [ce]}, {"ce": "head"}, ["chunked_loss"])
        >>> [c.label for c in out["head"]], [c.label for c in out["ce"]]
        (['batch=2', 'batch=2,chunked_loss'], ['batch=2', 'batch=2,chunked_loss'])
    """
    if CHUNKED_LOSS not in set(options) or not blocks:
        return configurations
    out = dict(configurations)
    for loss, head in blocks.items():
        heads = [c for c in configurations.get(head, []) if head_offers(c)]
        losses = [c for c in configurations.get(loss, []) if loss_offers(c)]
        if not any(pair_fits(h, c) for h in heads for c in losses):
            continue
        out[head] = list(configurations[head]) + [_with(c) for c in heads]
        out[loss] = list(configurations[loss]) + [_with(c) for c in losses]
    return out


def chunked(config: Configuration) -> bool:
    """Whether a configuration carries ``chunked_loss``.

    Example:
        >>> chunked(Configuration("batch=2,chunked_loss", (), (), (), (), options=("chunked_loss",)))
        True
    """
    return CHUNKED_LOSS in config.options


def chunked_node_cost(model, info, name: str, node: dict, config: Configuration, chunk_tokens: int):
    """The :class:`estimators.op_costs.Cost` of a head or loss node under ``chunked_loss``.

    The plain cost of the same configuration (its other options included), plus the operator's
    forward once more; the node keeps no activation; the loss's transient is one chunk
    (:func:`chunk_transient_bytes`).

    Example:
        >>> # worked cases: tests/estimators/test_chunked_loss.py
        >>> True
        True
    """
    from estimators.memory_options import base_configuration
    from estimators.options import _forward_s, option_node_cost

    plain = option_node_cost(model, info, name, node, config)
    forward_s = _forward_s(model, info, name, node, base_configuration(config))
    state = plain.param_bytes + plain.grad_bytes + plain.optimizer_bytes
    transient = 0.0
    if _is_loss(node):
        rows, classes = local_shape(tuple(node["inputs"][0]["shape"]), config.inputs[0], model.mesh.shape)
        transient = float(chunk_transient_bytes(rows, classes, chunk_tokens))
    return dataclasses.replace(plain, compute_s=plain.compute_s + forward_s, memory_bytes=float(state),
                               recompute_bytes=transient)


def chunked_edge_table(comps: dict[str, np.ndarray], confs_head, confs_loss) -> dict[str, np.ndarray]:
    """The head -> loss edge's arrays with the option's rule: both chunked (and laid out alike,
    :func:`pair_fits`) keeps nothing and moves nothing; one chunked and not the other is ``+inf``.

    Example:
        >>> h = [Configuration("b", (), (("S(0)",),), (), ("S(0)",)),
        ...      Configuration("b,chunked_loss", (), (("S(0)",),), (), ("S(0)",), options=("chunked_loss",))]
        >>> ce = [Configuration("b", (), (("S(0)",), ("S(0)",)), (), ("R",)),
        ...       Configuration("b,chunked_loss", (), (("S(0)",), ("S(0)",)), (), ("R",),
        ...                     options=("chunked_loss",))]
        >>> t = chunked_edge_table({"memory_bytes": np.ones((2, 2)), "comm_s": np.zeros((2, 2))}, h, ce)
        >>> t["memory_bytes"].tolist()
        [[1.0, inf], [inf, 0.0]]
    """
    a = np.array([chunked(c) for c in confs_head], dtype=bool)[:, None]
    b = np.array([chunked(c) for c in confs_loss], dtype=bool)[None, :]
    fits = np.array([[pair_fits(h, c) for c in confs_loss] for h in confs_head], dtype=bool)
    both = a & b
    bad = (a != b) | (both & ~fits)
    out = dict(comps)
    for key, array in comps.items():
        if not isinstance(array, np.ndarray) or array.shape != bad.shape:
            continue
        value = np.where(both, 0.0, array)
        if key in ("memory_bytes", "comm_s"):
            value = np.where(bad, np.inf, value)
        out[key] = value
    return out


__all__ = [
    "CHUNKED_LOSS",
    "DEFAULT_CHUNK_TOKENS",
    "chunk_transient_bytes",
    "chunked",
    "chunked_edge_table",
    "chunked_node_cost",
    "head_offers",
    "loss_blocks",
    "loss_offers",
    "pair_fits",
    "with_chunked_loss",
]
