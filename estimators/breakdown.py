"""Per-operator breakdown of one plan on a cost graph: the one walk behind plan files, ``explain``
and the plot (``tensoropt.summary.plan_layers`` turns it into a plan's rows).

Works on the graph :func:`tensoropt.cost_graph.cost_graph` returns (its nodes carry the
per-configuration ``compute_s``, ``comm_s``, ``memory_bytes`` and ``buffer_bytes`` arrays; a
graph with only the ``cost`` tables is read from their ``time_s`` and ``memory_bytes`` columns),
with an assignment node -> configuration index (``frontier.Point.assignment``) or node -> label.
What the walk needs of the graph (topological order, each edge's operand and layouts) is computed
once per cost graph and kept on it: the planner breaks down every frontier point. So are the
rows of each (node, configuration) and (edge, configuration pair) met: frontier plans share most
of their choices (100 plans of Llama-3-8B's 1100 operators took 5 s per device count before).
"""

from __future__ import annotations

import networkx as nx

from estimators.memory_parts import COST_PARTS, STATE_PARTS

_WALK_KEY = "_plan_breakdown_walk"
_ROWS_KEY = "_plan_breakdown_rows"


def configuration_index(cg: nx.DiGraph, node: str, choice) -> int:
    """Row of ``choice`` (a configuration label or an index) among ``node``'s configurations; an
    unknown label is an error naming the node and its labels.

    Example:
        >>> import networkx as nx
        >>> g = nx.DiGraph(); g.add_node("mm", configs=["replicate", "batch=2"])
        >>> configuration_index(g, "mm", "batch=2"), configuration_index(g, "mm", 0)
        (1, 0)
    """
    if isinstance(choice, str):
        labels = cg.nodes[node]["configs"]
        if choice not in labels:
            raise ValueError(f"node {node!r} has no configuration {choice!r}; it has {labels}")
        return labels.index(choice)
    return int(choice)


def _walk(cg: nx.DiGraph) -> tuple[list, list]:
    """Nodes in topological order as ``(name, attrs)``, edges in that order as ``(u, v, attrs,
    operand index in v's inputs, u's configurations, v's configurations)``.

    Cached on ``cg.graph`` (a cost graph is not changed after it is built).
    """
    cached = cg.graph.get(_WALK_KEY)
    if cached is not None:
        return cached
    order = list(nx.topological_sort(cg))
    nodes = [(n, cg.nodes[n]) for n in order]
    edges = [(u, v, cg.edges[u, v], (cg.edges[u, v].get("operands") or [0])[0],
              cg.nodes[u].get("configurations"), cg.nodes[v].get("configurations"))
             for u in order for v in cg.successors(u)]
    cg.graph[_WALK_KEY] = (nodes, edges)
    return nodes, edges


def _columns(cg: nx.DiGraph) -> tuple[int, int]:
    objectives = list(cg.graph.get("objectives", ("time_s", "memory_bytes")))
    return objectives.index("time_s"), objectives.index("memory_bytes")


def _node_costs(cg: nx.DiGraph, d: dict, i: int) -> tuple[float, float, float, float]:
    """(compute_s, comm_s, memory_bytes, buffer_bytes) of configuration ``i`` of a node."""
    if "compute_s" in d:
        return (float(d["compute_s"][i]), float(d["comm_s"][i]), float(d["memory_bytes"][i]),
                float(d["buffer_bytes"][i]) if "buffer_bytes" in d else 0.0)
    t, m = _columns(cg)
    return float(d["cost"][i][t]), 0.0, float(d["cost"][i][m]), 0.0


def _memory_parts(d: dict, i: int, memory_bytes: float) -> dict[str, float]:
    """Parts of a node configuration's memory (:mod:`estimators.memory_parts`): parameters,
    gradients, optimizer state, the saved activations (the rest) and what a recomputing
    configuration rebuilds in backward (0 when the cost graph does not carry the parts)."""
    parts = {k: float(d[k][i]) if k in d else 0.0 for k in COST_PARTS}
    state = sum(parts[k] for k in STATE_PARTS)
    parts["activation_bytes"] = memory_bytes - state if any(k in d for k in COST_PARTS) else 0.0
    return parts


def _edge_costs(cg: nx.DiGraph, e: dict, i: int, j: int) -> tuple[float, float, float]:
    """(comm_s, memory_bytes, buffer_bytes) of an edge between configurations ``i`` and ``j``."""
    if "comm_s" in e:
        return (float(e["comm_s"][i, j]), float(e["memory_bytes"][i, j]),
                float(e["buffer_bytes"][i, j]) if "buffer_bytes" in e else 0.0)
    t, m = _columns(cg)
    return float(e["cost"][i, j, t]), float(e["cost"][i, j, m]), 0.0


def _layouts(cu, cv, i: int, j: int, operand: int) -> tuple[tuple, tuple]:
    """The producer's output layout and the one the consumer computes operand ``operand`` with
    (``cu``, ``cv``: the two nodes' configurations, None when the graph has none)."""
    src = tuple(cu[i].output) if cu is not None else ()
    dst_inputs = cv[j].inputs if cv is not None else ()
    return src, tuple(dst_inputs[operand]) if operand < len(dst_inputs) else ()


def plan_breakdown(cg: nx.DiGraph, assignment: dict) -> dict:
    """Per-operator and per-edge costs of one plan, and the totals.

    Args:
        cg: a cost graph.
        assignment: node -> configuration index or label (every node of ``cg``).

    Returns:
        ``{"layers": [{"node", "op", "module", "kind", "config", "compute_s", "comm_s",
        "memory_bytes"}, ...]`` (every operator, and the inputs that hold memory),
        ``"redistributions": [{"src", "dst", "src_config", "dst_config", "from_layout",
        "to_layout", "comm_s", "memory_bytes"}, ...]`` (the edges that move data, cost time, hold
        memory or change layout), ``"time_s"``, ``"memory_bytes"`` (the additive objective),
        ``"recompute_transient_bytes"`` (the largest recompute chain's rebuilt tensors,
        :func:`recompute_chains`) and ``"peak_memory_bytes"`` (memory plus the largest transient
        communication buffer plus that chain, each added once)}. A layer's ``memory_bytes`` is its
        node's own (split into ``param_bytes``, ``grad_bytes``, ``optimizer_bytes`` and
        ``activation_bytes``, with ``recompute_bytes`` rebuilt in backward and
        ``recompute_chain_bytes`` by its chain); the memory charged to its incoming edges (saved
        activations) is in the redistributions.

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
    idx = {n: configuration_index(cg, n, assignment[n]) for n in cg}
    nodes, edge_order = _walk(cg)
    layers, edges = [], []
    time_s = memory = buffer = 0.0
    node_rows, edge_rows = cg.graph.setdefault(_ROWS_KEY, ({}, {}))
    for n, d in nodes:
        i = idx[n]
        if (n, i) not in node_rows:
            node_rows[n, i] = _node_row(cg, n, d, i)
        compute, comm, mem, buf, row = node_rows[n, i]
        time_s += compute + comm
        memory += mem
        buffer = max(buffer, buf)
        if row is not None:
            layers.append(dict(row))  # a copy: the caller's rows are its own
    for u, v, e, operand, cu, cv in edge_order:
        i, j = idx[u], idx[v]
        if (u, v, i, j) not in edge_rows:
            edge_rows[u, v, i, j] = _edge_row(cg, u, v, e, operand, cu, cv, i, j)
        comm, mem, buf, row = edge_rows[u, v, i, j]
        time_s += comm
        memory += mem
        buffer = max(buffer, buf)
        if row is not None:
            edges.append({**row, "from_layout": list(row["from_layout"]),
                          "to_layout": list(row["to_layout"])})
    chains = recompute_chains(cg, idx, edge_order)
    for row in layers:
        row["recompute_chain_bytes"] = chains.get(row["node"], 0.0)
    transient = max(chains.values(), default=0.0)
    return {
        "layers": layers,
        "redistributions": edges,
        "time_s": time_s,
        "memory_bytes": memory,
        "recompute_transient_bytes": transient,
        "peak_memory_bytes": memory + buffer + transient,
    }


def _node_row(cg: nx.DiGraph, n: str, d: dict, i: int) -> tuple:
    """(compute_s, comm_s, memory_bytes, buffer_bytes, layer row or None) of ``n`` in configuration ``i``."""
    compute, comm, mem, buf = _node_costs(cg, d, i)
    kind = d.get("kind", "")
    row = None
    if kind != "input" or mem:
        row = {"node": n, "op": str(d.get("op", "")), "module": str(d.get("module", "")),
               "kind": kind, "config": str(d["configs"][i]), "compute_s": compute,
               "comm_s": comm, "memory_bytes": mem, **_memory_parts(d, i, mem)}
        if d.get("block") and any(t in ("block_recompute", "block_selective")
                                  for t in row["config"].split(",")):
            row["block"] = str(d["block"])  # the checkpointed block it is in (estimators.peak groups by it)
    return compute, comm, mem, buf, row


def _param_layouts(cu, cv, i: int, j: int, key: str) -> tuple[tuple, tuple]:
    """A tied parameter's layout at its first user (where it is stored) and at another user."""
    if cu is None or cv is None:
        return (), ()
    return tuple(dict(cu[i].params).get(key, ())), tuple(dict(cv[j].params).get(key, ()))


def _edge_row(cg: nx.DiGraph, u: str, v: str, e: dict, operand: int, cu, cv, i: int, j: int) -> tuple:
    """(comm_s, memory_bytes, buffer_bytes, redistribution row or None) of ``u -> v`` in ``(i, j)``.

    An edge that prices only a tied parameter (``tied``: :mod:`estimators.tied`) reports that
    parameter's layouts and names it (``tied_param``)."""
    comm, mem, buf = _edge_costs(cg, e, i, j)
    tied = e.get("tied_params") if e.get("tied") else None
    src, dst = _param_layouts(cu, cv, i, j, tied[0]) if tied else _layouts(cu, cv, i, j, operand)
    row = None
    if comm or mem or src != dst:
        row = {"src": u, "dst": v, "src_config": cg.nodes[u]["configs"][i],
               "dst_config": cg.nodes[v]["configs"][j], "from_layout": list(src),
               "to_layout": list(dst), "comm_s": comm, "memory_bytes": mem}
        if tied:
            row["tied_param"] = str(tied[0])
    return comm, mem, buf, row


def _plain_index(cg: nx.DiGraph, n: str, i: int) -> int:
    """The configuration of ``n`` with configuration ``i``'s split and options but no block option."""
    labels = cg.nodes[n]["configs"]
    label = ",".join(t for t in str(labels[i]).split(",") if t not in ("block_recompute", "block_selective"))
    return labels.index(label) if label in labels else i


def _activation_bytes(d: dict, i: int) -> float:
    """Saved activations of configuration ``i`` of a node (its memory less parameters and state)."""
    memory = float(d["memory_bytes"][i]) if "memory_bytes" in d else 0.0
    return memory - sum(float(d[k][i]) for k in STATE_PARTS if k in d)


def _kept_by_block(cg: nx.DiGraph, n: str, i: int) -> bool:
    """Whether node ``n`` under configuration ``i`` keeps its output through its block's checkpoint
    (a matmul-class operator or attention under ``block_selective``)."""
    from estimators.block_options import keeps_output

    tokens = str(cg.nodes[n]["configs"][i]).split(",")
    option = next((t for t in tokens if t in ("block_recompute", "block_selective")), None)
    return keeps_output(cg.nodes[n].get("kind", ""), option)


def recompute_chains(cg: nx.DiGraph, idx: dict[str, int], edge_order: list) -> dict[str, float]:
    """Node -> bytes its recompute chain rebuilds in backward, for every recomputing node.

    A chain is a connected set of recomputing nodes (an edge between two of them joins them): the
    executor rebuilds a recomputed value from its producer's recipe, itself rebuilt from its own
    producer's, and keeps each result until every consumer's backward has read it, so the whole
    chain's rebuilt tensors (each node's ``recompute_bytes``) are alive at once during its
    backward: a transient, the largest chain added once to the plan's peak. A checkpointed block
    (its nodes under ``block_recompute`` or ``block_selective``, :mod:`estimators.block_options`)
    is one chain: its forward is rerun as a whole during its backward, and its transient is what
    its operators and the edges inside it save without the option (one block's activations).

    Example:
        >>> # worked case: tests/estimators/test_options.py (test_recompute_chain_transient)
        >>> True
        True
    """
    def chain_key(n: str):
        tokens = str(cg.nodes[n]["configs"][idx[n]]).split(",")
        if "recompute" in tokens:
            return "recompute"
        if "block_recompute" in tokens or "block_selective" in tokens:
            return ("block", cg.nodes[n].get("block", ""))
        if "chunked_loss" in tokens:  # the fused head + loss: one chunk's logits (its recompute_bytes)
            return "chunked_loss"
        return None

    keys = {n: k for n in cg if (k := chain_key(n)) is not None}
    parent = {n: n for n in keys}

    def find(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for u, v, e, *_ in edge_order:
        if u in parent and v in parent and keys[u] == keys[v] and not e.get("tied"):  # a tie carries
            parent[find(u)] = find(v)  # no recomputed value
    totals: dict[str, float] = {}
    plain = {n: _plain_index(cg, n, idx[n]) for n in parent if keys[n] not in ("recompute", "chunked_loss")}
    for n in parent:
        d = cg.nodes[n]
        if n in plain:  # a checkpointed block rebuilds what its operators save without the option
            rebuilt = max(0.0, _activation_bytes(d, plain[n]) - _activation_bytes(d, idx[n]))  # (less what
            # a selective checkpoint keeps, already in the plan's memory)
        else:
            rebuilt = float(d["recompute_bytes"][idx[n]]) if "recompute_bytes" in d else 0.0
        totals[find(n)] = totals.get(find(n), 0.0) + rebuilt
    for u, v, e, *_ in edge_order:  # and what the edges inside it charge (not for an output the
        # selective checkpoint keeps: it is in the plan's memory, not rebuilt)
        if u in plain and v in plain and keys[u] == keys[v] and "memory_bytes" in e \
                and not _kept_by_block(cg, u, idx[u]):
            totals[find(u)] += float(e["memory_bytes"][plain[u], plain[v]])
    return {n: totals[find(n)] for n in parent}
