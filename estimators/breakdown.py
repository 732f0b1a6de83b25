"""Per-operator breakdown of one plan on a cost graph (for plan files, ``explain`` and the plot).

Works on the graph :func:`tensoropt.cost_graph.cost_graph` returns (its nodes carry the
per-configuration ``compute_s``, ``comm_s``, ``memory_bytes`` and ``buffer_bytes`` arrays), with
an assignment node -> configuration index (``frontier.Point.assignment``) or node -> label.
"""

from __future__ import annotations

import networkx as nx


def _index(cg: nx.DiGraph, node: str, choice) -> int:
    if isinstance(choice, str):
        labels = cg.nodes[node]["configs"]
        if choice not in labels:
            raise ValueError(f"node {node!r} has no configuration {choice!r}; it has {labels}")
        return labels.index(choice)
    return int(choice)


def plan_breakdown(cg: nx.DiGraph, assignment: dict) -> dict:
    """Per-operator and per-edge costs of one plan, and the totals.

    Args:
        cg: a cost graph.
        assignment: node -> configuration index or label (every node of ``cg``).

    Returns:
        ``{"layers": [{"node", "op", "module", "config", "compute_s", "comm_s", "memory_bytes"}, ...],
        "redistributions": [{"src", "dst", "src_config", "dst_config", "comm_s", "memory_bytes"}, ...]``
        (only edges that move data or hold memory), ``"time_s"``, ``"memory_bytes"`` (the additive
        objective) and ``"peak_memory_bytes"`` (memory plus the largest transient communication
        buffer, added once)}.

    Example:
        >>> import torch
        >>> from tensoropt.capture import capture
        >>> from tensoropt.cost_graph import cost_graph
        >>> g = capture(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
        >>> cg = cost_graph(g, "cpu-local", 1, configurations={})
        >>> b = plan_breakdown(cg, {n: 0 for n in cg})
        >>> [layer["node"] for layer in b["layers"]], b["memory_bytes"]
        (['linear'], 208.0)
    """
    missing = [n for n in cg if n not in assignment]
    if missing:
        raise ValueError(f"assignment has no configuration for node(s) {missing[:5]}")
    idx = {n: _index(cg, n, assignment[n]) for n in cg}
    layers, edges = [], []
    time_s = memory = buffer = 0.0
    for n in nx.topological_sort(cg):
        d, i = cg.nodes[n], idx[n]
        compute, comm, mem = (float(d[k][i]) for k in ("compute_s", "comm_s", "memory_bytes"))
        time_s += compute + comm
        memory += mem
        buffer = max(buffer, float(d["buffer_bytes"][i]))
        if d.get("kind") != "input":
            layers.append(
                {
                    "node": n,
                    "op": d["op"],
                    "module": d.get("module", ""),
                    "config": d["configs"][i],
                    "compute_s": compute,
                    "comm_s": comm,
                    "memory_bytes": mem,
                }
            )
        elif mem:
            layers.append(
                {
                    "node": n,
                    "op": d["op"],
                    "module": "",
                    "config": d["configs"][i],
                    "compute_s": 0.0,
                    "comm_s": 0.0,
                    "memory_bytes": mem,
                }
            )
    for u, v in cg.edges:
        e, i, j = cg.edges[u, v], idx[u], idx[v]
        comm, mem = float(e["comm_s"][i, j]), float(e["memory_bytes"][i, j])
        time_s += comm
        memory += mem
        buffer = max(buffer, float(e["buffer_bytes"][i, j]))
        if comm or mem:
            edges.append(
                {
                    "src": u,
                    "dst": v,
                    "src_config": cg.nodes[u]["configs"][i],
                    "dst_config": cg.nodes[v]["configs"][j],
                    "comm_s": comm,
                    "memory_bytes": mem,
                }
            )
    return {
        "layers": layers,
        "redistributions": edges,
        "time_s": time_s,
        "memory_bytes": memory,
        "peak_memory_bytes": memory + buffer,
    }
