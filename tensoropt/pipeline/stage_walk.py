"""A pipeline stage's backward transient, walked over its operators in backward order.

One micro-batch's backward on a stage (the replayed backward program,
:mod:`tensoropt.pipeline_runtime.replay`) adds to what the stage holds, at operator ``n`` (the
stage's operators in reverse topological order; :func:`estimators.step_peak.backward_excess_bytes`
does the walk, as it does for a plan without a pipeline)::

    excess(n) = grad_out(n) + grad_operands(n) + sum(G_i, i >= n) - sum(saved_i, i > n)

* ``grad_out(n)``: the gradient of ``n``'s output (its local output bytes), except where it is torch's
  receive buffer for the gradient the next stage sends back (held, ``buffer_bytes``): the sent
  operator's, and through the operators that pass a gradient on unchanged (:func:`passes_gradient`:
  a residual ``add``, a dropout of ``p = 0``) to an operand they are the only reader of;
* ``grad_operands(n)``: the gradients ``n`` makes for its activation operands (their producers' local
  outputs, the received tensor's included; none where it passes its own on unchanged); a cross
  entropy's backward holds the gradients of the log-probabilities and of the logits at once beside
  the saved log-probabilities: twice its logits (measured exactly, docs/results.md);
* ``G_i``: operator ``i``'s parameter gradients: the replayed backward returns them all at its end;
* ``saved_i``: what operator ``i`` saves for backward, freed after it: its activations (its memory
  beyond the state) and its incoming edges' (an operand saved in its layout). A tensor that two
  operators save is charged at its producer (:mod:`estimators.op_costs`), so the walk frees it after
  the producer's backward, which follows both: never before its last use (at worst later). What
  the edges from the received tensor (the receive buffer itself) and from the graph inputs (the
  micro-batch's input) save is not freed, nor what an edge pricing a tied weight's other user
  holds (:mod:`estimators.tied`).

The stage's backward transient is the largest ``excess(n)``. On the zoo GPT's MLP (hidden ``L``,
second linear's weight gradient ``P``): at GELU's backward ``2 L + P - L`` (the same micro-batch's GELU
output, saved by the second linear, is freed), against the ``2 L`` the largest-output bound gives.

Example:
    >>> import networkx as nx
    >>> import numpy as np
    >>> def op(kind, out, saved=0.0, grad=0.0, o="aten.linear.default"):
    ...     return dict(kind=kind, op=o, out=out, memory_bytes=np.array([saved + 2 * grad]),
    ...                 param_bytes=np.array([grad]), grad_bytes=np.array([grad]),
    ...                 optimizer_bytes=np.zeros(1))
    >>> G = nx.DiGraph()
    >>> G.add_node("fc1", **op("linear", 4.0, grad=1.0))
    >>> G.add_node("gelu", **op("elementwise", 4.0, o="aten.gelu.default"))
    >>> G.add_node("fc2", **op("linear", 1.0, grad=1.0))
    >>> for u, v, saved in [("fc1", "gelu", 4.0), ("gelu", "fc2", 4.0)]:  # each saves its input
    ...     G.add_edge(u, v, cost=np.array([[[0.0, saved]]]))
    >>> out = lambda n: np.array([G.nodes[n]["out"]])
    >>> backward_excess_bytes(G, ["fc1", "gelu", "fc2"], dict.fromkeys(G, 0), out, sent="fc2")
    5.0
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import networkx as nx
import numpy as np

from estimators.memory_parts import STATE_PARTS
from estimators.step_peak import backward_excess_bytes as walk_rows


def passes_gradient(node: dict, operand_shape: tuple) -> bool:
    """Whether an operator's backward hands its output's gradient unchanged (no new tensor) to an
    operand of ``operand_shape``: an ``add`` to an operand of its output's shape (a residual
    connection; a broadcast operand gets a new, reduced one), a dropout that drops nothing
    (``p = 0`` or not training: the identity).

    Example:
        >>> add = {"op": "aten.add.Tensor", "out_shape": (2, 3)}
        >>> passes_gradient(add, (2, 3)), passes_gradient(add, (3,))  # the broadcast one: summed
        (True, False)
        >>> passes_gradient({"op": "aten.dropout.default", "attrs": {"p": 0.0, "train": True}}, (2, 3))
        True
    """
    if node.get("op") == "aten.dropout.default":
        attrs = node.get("attrs") or {}
        return attrs.get("p", 1.0) == 0 or attrs.get("train") is False
    return node.get("op") == "aten.add.Tensor" and tuple(node.get("out_shape", ())) == tuple(operand_shape)


def backward_excess_bytes(G: nx.DiGraph, order: Sequence[str], assignment: dict[str, int],
                          out_bytes: Callable[[str], np.ndarray], received: str | None = None,
                          sent: str | None = None, grads_of: nx.DiGraph | None = None,
                          graph: nx.DiGraph | None = None) -> float:
    """The largest ``excess(n)`` of the module docstring: what one micro-batch's backward adds to
    what a stage holds.

    Args:
        G: the cost graph (node ``memory_bytes`` and its state parts, edge ``cost[..., 1]``, ``kind``).
        order: the stage's nodes in a topological order (the received tensor's producer and the
            graph inputs may be among them: skipped).
        assignment: node -> configuration index.
        out_bytes: node -> its local output bytes per configuration.
        received / sent: the operator whose output the stage receives / sends (None: none).
        grads_of: where to read ``grad_bytes`` (a stage graph with a tied copy's gradient), else ``G``.
        graph: where to read ``op``, ``out_shape`` and ``inputs`` (the captured graph), else ``G``.
    """
    grads_of = G if grads_of is None else grads_of
    graph = G if graph is None else graph
    stage = [n for n in order if n != received and G.nodes[n]["kind"] != "input"]
    inside = set(stage)
    readers = {n: sum(1 for v in G.succ[n] if v in inside) for n in stage}
    # the gradients that are torch's receive buffer: the sent output's (read by the next stage only),
    # and an operand's that a residual add passes it to, where that add is its only reader
    buffer = {sent} if sent in inside and not readers[sent] else set()
    def passes(n, u):
        return passes_gradient(graph.nodes[n], graph.nodes[u].get("out_shape", ()))

    for n in reversed(stage):
        if n in buffer:
            buffer.update(u for u in G.pred[n] if u in inside and readers[u] == 1 and passes(n, u))
    rows, transients = [], {}
    for n in stage:
        d, c = G.nodes[n], assignment[n]
        saved = max(float(d["memory_bytes"][c]) - float(sum(d[p][c] for p in STATE_PARTS)), 0.0)
        operands = 0.0
        for u, e in G.pred[n].items():
            if (u not in inside and u != received) or e.get("tied"):  # a graph input; a tied weight's edge
                continue
            if not passes(n, u):
                operands += float(out_bytes(u)[assignment[u]])
            if u != received:
                saved += float(e["cost"][assignment[u], c, 1])
        if str(graph.nodes[n].get("op", "")).startswith("aten.cross_entropy_loss"):
            operands *= 2
        made = 0.0 if n in buffer else float(out_bytes(n)[c])
        grads = float(grads_of.nodes[n]["grad_bytes"][c])
        rows.append({"node": n, "activation_bytes": saved, "grad_bytes": grads})
        transients[n] = made + operands
    return walk_rows(rows, transients)
