"""What a plan does, in words and rows: the one-line split summary, per-operator rows, redistributions.

Example:
    >>> import networkx as nx
    >>> g = nx.DiGraph()
    >>> g.add_node("conv", kind="conv2d", flops=10); g.add_node("fc", kind="linear", flops=5)
    >>> summarize_split({"conv": "batch=8", "fc": "out=8"}, g)
    'conv: batch=8; fc: out=8'
"""

from __future__ import annotations

from collections import Counter

import networkx as nx

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
    for node in nx.topological_sort(nx_graph):
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


def plan_summary(graph, ops: dict[str, str]) -> str:
    """:func:`summarize_split` of an OpGraph (or a networkx graph)."""
    return summarize_split(ops, getattr(graph, "nx", graph))


def plan_breakdown(
    G: nx.DiGraph, graph, assignment: dict[str, int]
) -> tuple[list[Layer], list[Redistribution]]:
    """Per-operator rows and the redistributions of a plan, in graph order (input nodes left out).

    A layer's compute, communication and memory are its node's cost components for the chosen
    configuration (node attributes ``compute_s``, ``comm_s``, ``memory_bytes``), plus the memory
    the cost graph charges to its incoming edges (its inputs saved for backward in the layout it
    computes with). A redistribution is an edge whose chosen layouts differ or whose time is not
    zero; the layouts are the producer's ``output`` and the consumer's ``inputs[i]`` for the
    operand the edge feeds. Layer times plus redistribution times add up to the plan's time,
    layer memory to its memory.

    Returns:
        ``(layers, redistributions)``.
    """
    nx_graph = getattr(graph, "nx", graph)
    nodes, edges, t_col, m_col = _walk(G, nx_graph)
    edge_memory: dict[str, float] = {}
    redistributions = []
    for u, v, cost_table, operand, confs_u, confs_v in edges:
        a, b = assignment[u], assignment[v]
        time_s, memory = float(cost_table[a, b, t_col]), float(cost_table[a, b, m_col])
        edge_memory[v] = edge_memory.get(v, 0.0) + memory
        src = confs_u[a].output if confs_u is not None else ()
        dst_inputs = confs_v[b].inputs if confs_v is not None else ()
        dst = dst_inputs[operand] if operand < len(dst_inputs) else ()
        if time_s > 0 or src != dst:
            redistributions.append(Redistribution(u, v, list(src), list(dst), time_s, memory))
    layers = []
    for node, data, op, module in nodes:
        c = assignment.get(node)
        if c is None:
            continue
        if "compute_s" in data:
            compute_s, comm_s, memory = data["compute_s"][c], data["comm_s"][c], data["memory_bytes"][c]
        else:
            compute_s, comm_s, memory = data["cost"][c][t_col], 0.0, data["cost"][c][m_col]
        layers.append(
            Layer(
                node=node,
                op=op,
                module=module,
                config=str(data["configs"][c]),
                compute_s=float(compute_s),
                comm_s=float(comm_s),
                memory_bytes=float(memory) + edge_memory.get(node, 0.0),
            )
        )
    return layers, redistributions


def _walk(G: nx.DiGraph, nx_graph: nx.DiGraph) -> tuple[list, list, int, int]:
    """What every plan's breakdown walks, computed once per cost graph (cached on ``G.graph``).

    Returns ``(nodes, edges, time column, memory column)``: non-input nodes in topological order
    as ``(name, attrs, op, module)``, and edges in that order as ``(u, v, cost table, operand index
    in v's inputs, u's configurations, v's configurations)``.
    """
    cached = G.graph.get("_breakdown_walk")
    if cached is not None:
        return cached
    objectives = list(G.graph.get("objectives", ("time_s", "memory_bytes")))
    nodes, edges = [], []
    for node in nx.topological_sort(G):
        data = G.nodes[node]
        attrs = nx_graph.nodes[node] if node in nx_graph else {}
        if data.get("kind", attrs.get("kind")) != "input":
            nodes.append(
                (
                    node,
                    data,
                    str(data.get("op", attrs.get("op", ""))),
                    str(data.get("module", attrs.get("module", ""))),
                )
            )
        for v in G.successors(node):
            edge = G.edges[node, v]
            if "operands" not in edge and nx_graph.has_edge(node, v):
                edge = nx_graph.edges[node, v]
            operand = (edge.get("operands") or [0])[0]
            edges.append(
                (
                    node,
                    v,
                    G.edges[node, v]["cost"],
                    operand,
                    data.get("configurations"),
                    G.nodes[v].get("configurations"),
                )
            )
    walk = (nodes, edges, objectives.index("time_s"), objectives.index("memory_bytes"))
    G.graph["_breakdown_walk"] = walk
    return walk
