"""What a plan does, in words and rows: the one-line split summary, per-operator rows, redistributions.

Example:
    >>> import networkx as nx
    >>> g = nx.DiGraph()
    >>> g.add_node("conv", kind="conv2d", flops=10); g.add_node("fc", kind="linear", flops=5)
    >>> summarize_split({"conv": "batch=8", "fc": "out=8"}, g)
    'conv: batch=8; fc: out=8'
"""

from __future__ import annotations

import weakref
from collections import Counter

import networkx as nx

from estimators.breakdown import configuration_index, plan_breakdown
from estimators.memory_parts import MEMORY_PARTS, TRANSIENT_PARTS
from tensoropt.plans import Layer, Redistribution

SHORT_KINDS = {
    "conv2d": "conv",
    "linear": "fc",
    "matmul": "matmul",
    "sdpa": "attention",
    "embedding": "embedding",
}
"""Kinds named in summaries (the ones that hold the model's parameters and FLOPs), and their short names."""


def summarize_split(ops: dict[str, str], nx_graph: nx.DiGraph, max_labels: int = 3) -> str:
    """One line on how a plan splits the model, grouped by operator kind.

    Kinds in :data:`SHORT_KINDS` are listed in order of first appearance; when a kind's
    operators use several labels, each label gets its count, most used first, e.g.
    ``"fc: out=8 x3 / in=8 x3"``. A model with none of those kinds lists every kind.

    Example:
        >>> import networkx as nx
        >>> g = nx.DiGraph()
        >>> for n in ("fc1", "fc2", "fc3"): g.add_node(n, kind="linear")
        >>> summarize_split({"fc1": "out=4", "fc2": "in=4", "fc3": "out=4"}, g)
        'fc: out=4 x2 / in=4 x1'
    """
    kinds = {n: nx_graph.nodes[n].get("kind", "opaque") for n in ops if n in nx_graph}
    named = {n: k for n, k in kinds.items() if k in SHORT_KINDS}
    if not named:
        named = {n: k for n, k in kinds.items() if k != "input"}
    groups: dict[str, Counter] = {}
    for node in _topological_order(nx_graph):
        if node in named:
            groups.setdefault(SHORT_KINDS.get(named[node], named[node]), Counter())[ops[node]] += 1
    parts = []
    for kind, counts in groups.items():
        ranked = counts.most_common()
        if len(ranked) == 1:
            parts.append(f"{kind}: {ranked[0][0]}")
            continue
        shown = " / ".join(f"{label} x{count}" for label, count in ranked[:max_labels])
        more = f" / +{len(ranked) - max_labels} more" if len(ranked) > max_labels else ""
        parts.append(f"{kind}: {shown}{more}")
    return "; ".join(parts)


_ORDERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Graph -> (node count, edge count, topological order): every plan of a frontier is summarised on
the same graph (hundreds of plans of thousands of operators for Llama-3-8B)."""


def _topological_order(g: nx.DiGraph) -> list:
    """``nx.topological_sort(g)`` as a list, computed again only when ``g``'s size changed.

    Example:
        >>> _topological_order(nx.DiGraph([("b", "c"), ("a", "b")]))
        ['a', 'b', 'c']
    """
    size = (g.number_of_nodes(), g.number_of_edges())
    cached = _ORDERS.get(g)
    if cached is None or cached[0] != size:
        cached = (size, list(nx.topological_sort(g)))
        _ORDERS[g] = cached
    return cached[1]


def plan_summary(graph, ops: dict[str, str]) -> str:
    """:func:`summarize_split` of an OpGraph (or a networkx graph)."""
    return summarize_split(ops, getattr(graph, "nx", graph))


def plan_layers(G: nx.DiGraph, graph, assignment: dict[str, int]) -> tuple[list[Layer], list[Redistribution]]:
    """A plan's rows for plan.json: :func:`estimators.breakdown.plan_breakdown` as ``Layer``s and
    ``Redistribution``s, in graph order (input nodes left out).

    A layer's memory is its node's plus what the cost graph charges to its incoming edges (its
    inputs saved for backward in the layout it computes with), so layer memory adds up to the
    plan's memory; a redistribution is an edge that costs time or changes layout. Layer times
    plus redistribution times add up to the plan's time.

    Example:
        >>> import torch, tensoropt
        >>> from tensoropt.cost_graph import cost_graph
        >>> mlp = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> g = tensoropt.capture(mlp, (torch.randn(2, 4),))
        >>> one_device = cost_graph(g, "cpu-local", 1, configurations={})
        >>> rows, moves = plan_layers(one_device, g, dict.fromkeys(g.nx, 0))
        >>> [(row.op, row.config) for row in rows], moves
        ([('aten.linear.default', 'replicate'), ('aten.relu.default', 'replicate')], [])
    """
    nx_graph = getattr(graph, "nx", graph)
    b = plan_breakdown(G, assignment)
    edge_memory: dict[str, float] = {}
    for r in b["redistributions"]:
        edge_memory[r["dst"]] = edge_memory.get(r["dst"], 0.0) + r["memory_bytes"]
    buffers = {n: float(G.nodes[n]["buffer_bytes"][configuration_index(G, n, assignment[n])])
               for n in G if "buffer_bytes" in G.nodes[n]}
    layers = []
    for row in b["layers"]:
        node, kind, op, module = row["node"], row["kind"], row["op"], row["module"]
        if not (kind and op) and node in nx_graph:  # a cost graph without the OpGraph's attributes
            attrs = nx_graph.nodes[node]
            kind = kind or attrs.get("kind")
            op, module = op or str(attrs.get("op", "")), module or str(attrs.get("module", ""))
        if kind == "input":
            continue
        saved_operands = edge_memory.get(node, 0.0)
        parts = {k: row.get(k, 0.0) for k in (*MEMORY_PARTS, *TRANSIENT_PARTS)}
        parts["activation_bytes"] += saved_operands
        parts["buffer_bytes"] = buffers.get(node, 0.0)
        layers.append(Layer(node=node, op=op, module=module, config=row["config"],
                            compute_s=row["compute_s"], comm_s=row["comm_s"],
                            memory_bytes=row["memory_bytes"] + saved_operands, **parts))
    moves = [Redistribution(r["src"], r["dst"], r["from_layout"], r["to_layout"], r["comm_s"],
                            r["memory_bytes"], r.get("tied_param", ""))
             for r in b["redistributions"] if r["comm_s"] > 0 or r["from_layout"] != r["to_layout"]]
    return layers, moves
