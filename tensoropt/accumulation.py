"""Planned gradient accumulation: a plan's step as ``m`` micro-batches, priced and merged into the frontier.

``training.micro_batches: auto | N`` (:mod:`tensoropt.config`). A plan of ``m`` micro-batches runs the
graph captured at the micro-batch's shapes (global batch ``B / m``) ``m`` times per step and steps
the optimizer once. So, per configuration of the cost graph built on that graph:

* memory is the micro-batch graph's as priced: parameters, gradients (accumulated in place) and
  optimizer state are the same, the saved activations are one micro-batch's;
* time is ``m x`` the micro-batch's kernels, redistributions and per-micro-batch collectives, plus
  once per step the part that does not repeat (``step_compute_s``: the optimizer step;
  ``step_comm_s``: the gradient all-reduce a plan defers to the last micro-batch and ZeRO-1/2's
  all-gather of the updated shards; :class:`estimators.op_costs.Cost`). ZeRO-2/3's reduce-scatter
  and ZeRO-3's gathers are not deferrable: they are paid per micro-batch.

:func:`price_micro_batches` rewrites a cost graph that way (node rows and edge tables, the time
objective and the ``compute_s``/``comm_s`` components the plan rows read); the planner solves each
count's graph and keeps the Pareto set over counts and splits together (:func:`pareto_over_counts`).

Example:
    >>> micro_batch_counts(16, "auto"), micro_batch_counts(16, 4), micro_batch_counts(12, "auto")
    ([1, 2, 4, 8, 16], [4], [1, 2, 4])
"""

from __future__ import annotations

import numpy as np

__all__ = ["STEP_TERMS", "micro_batch_counts", "pareto_over_counts", "price_micro_batches", "step_terms"]

STEP_TERMS = ("kernels", "overhead", "comm", "redistribution", "optimizer", "grad_sync")
"""The terms of a micro-batch plan's predicted step (:func:`step_terms`): the first four repeat per
micro-batch, the last two are paid once per step."""


def micro_batch_counts(global_batch_size: int, setting: int | str) -> list[int]:
    """The micro-batch counts the planner tries for ``training.micro_batches``.

    ``auto``: 1, 2, 4, ... while the count divides the global batch (each micro-batch keeps at least
    one sample; a plan's per-device micro-batch is its batch split of that, which the configuration
    space keeps whole). ``N``: only N.

    Raises:
        ValueError: ``N`` does not divide the global batch (no plan's per-device batch splits into
            N micro-batches).

    Example:
        >>> micro_batch_counts(8, "auto"), micro_batch_counts(6, 1)
        ([1, 2, 4, 8], [1])
        >>> micro_batch_counts(6, 4)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: training.micro_batches: 4 does not divide the global batch of 6 samples, ...
    """
    if setting == "auto":
        counts, m = [], 1
        while global_batch_size % m == 0 and m <= global_batch_size:
            counts.append(m)
            m *= 2
        return counts
    m = int(setting)
    if global_batch_size % m:
        raise ValueError(f"training.micro_batches: {m} does not divide the global batch of "
                         f"{global_batch_size} samples, so no plan's per-device batch splits into {m} "
                         "micro-batches "
                         f"(expected a divisor of {global_batch_size}, or auto)")
    return [m]


def price_micro_batches(G, micro_batches: int):
    """Rewrite cost graph ``G`` (built on the micro-batch graph) to price a step of ``micro_batches``.

    Node rows: ``compute_s' = m compute_s - (m - 1) step_compute_s`` and the same for ``comm_s``;
    edge tables: ``m x`` (redistributions run per micro-batch); the time column of ``cost`` follows,
    memory is unchanged. Sets ``G.graph["micro_batches"]``. Returns ``G``.

    Example:
        >>> import networkx as nx, numpy as np
        >>> G = nx.DiGraph(objectives=("time_s", "memory_bytes"))
        >>> G.add_node("fc", cost=np.array([[3.0, 8.0]]), compute_s=np.array([2.0]), comm_s=np.array([1.0]),
        ...            step_compute_s=np.array([0.5]), step_comm_s=np.array([1.0]))
        >>> G = price_micro_batches(G, 4)
        >>> G.nodes["fc"]["cost"].tolist(), G.nodes["fc"]["compute_s"].tolist()
        ([[7.5, 8.0]], [6.5])
    """
    m = int(micro_batches)
    G.graph["micro_batches"] = m
    if m == 1:
        return G
    objectives = list(G.graph.get("objectives", ("time_s", "memory_bytes")))
    for _, d in G.nodes(data=True):
        zeros = np.zeros(len(d["cost"]))
        compute = m * d.get("compute_s", zeros) - (m - 1) * d.get("step_compute_s", zeros)
        comm = m * d.get("comm_s", zeros) - (m - 1) * d.get("step_comm_s", zeros)
        if "compute_s" not in d:  # only the cost table: all of its time repeats
            compute = m * d["cost"][:, objectives.index("time_s")]
        d["compute_s"], d["comm_s"] = compute, comm
        cost = d["cost"].copy()
        for k, o in enumerate(objectives):
            if o in ("time_s", "compute_s", "comm_s"):
                cost[:, k] = {"time_s": compute + comm, "compute_s": compute, "comm_s": comm}[o]
        d["cost"] = cost
    for _, _, e in G.edges(data=True):
        cost = e["cost"].copy()
        for k, o in enumerate(objectives):
            if o in ("time_s", "compute_s", "comm_s"):
                cost[..., k] *= m
        e["cost"] = cost
        for key in ("comm_s", "compute_s"):
            if key in e:
                e[key] = e[key] * m
    return G


def step_terms(G, graph, assignment: dict, micro_batches: int, device) -> dict[str, float]:
    """A plan's predicted step, term by term (seconds per step), on its micro-batch cost graph ``G``
    *before* :func:`price_micro_batches` (the graph the planner builds for the micro-batch's shapes):

    * per micro-batch, each x ``m``: ``kernels`` (forward + backward at the micro-batch's shapes, with
      casts), ``overhead`` (the executor's host time per operator,
      :func:`estimators.overhead.node_overhead_s`, read from ``graph``'s nodes), ``comm`` (collectives
      inside operators but the deferrable gradient synchronisation), ``redistribution`` (the edges);
    * once: ``optimizer`` (``step_compute_s``) and ``grad_sync`` (``step_comm_s``);

    and ``total``, their sum: what :func:`price_micro_batches` makes of the plan's time.

    Args:
        G: the cost graph (per node ``compute_s``, ``comm_s``, ``step_compute_s``, ``step_comm_s``,
            ``configurations``; per edge ``comm_s``).
        graph: its networkx OpGraph (the node dicts the overhead rule reads).
        assignment: node -> configuration index.
        micro_batches: ``m``.
        device: the cluster's :class:`estimators.profiles.Device` (its overhead constants).

    Example:
        >>> import networkx as nx, numpy as np
        >>> from estimators.profiles import load_device
        >>> G = nx.DiGraph()
        >>> G.add_node("fc", compute_s=np.array([2.0]), comm_s=np.array([1.0]),
        ...            step_compute_s=np.array([0.5]), step_comm_s=np.array([1.0]), configurations=[None])
        >>> t = step_terms(G, nx.DiGraph([("x", "fc")]), {"fc": 0}, 4, load_device("h100-sxm-80gb"))
        >>> t["kernels"], t["optimizer"], t["grad_sync"], t["total"]
        (6.0, 0.5, 1.0, 7.5)
    """
    from estimators.overhead import node_overhead_s

    m = int(micro_batches)
    once = dict.fromkeys(STEP_TERMS, 0.0)
    for n, i in assignment.items():
        d = G.nodes[n]
        overhead = node_overhead_s(device, graph.nodes[n], d["configurations"][i])
        once["overhead"] += overhead
        once["kernels"] += float(d["compute_s"][i] - d["step_compute_s"][i]) - overhead
        once["optimizer"] += float(d["step_compute_s"][i])
        once["comm"] += float(d["comm_s"][i] - d["step_comm_s"][i])
        once["grad_sync"] += float(d["step_comm_s"][i])
    for u, v, e in G.edges(data=True):
        once["redistribution"] += float(e["comm_s"][assignment[u], assignment[v]])
    terms = {k: (m * once[k] if k in STEP_TERMS[:4] else once[k]) for k in STEP_TERMS}
    terms["total"] = sum(terms.values())
    return terms


def pareto_over_counts(candidates: list[tuple[int, object]]) -> list[tuple[int, object]]:
    """The non-dominated ``(micro_batches, point)`` pairs over every count, sorted by time.

    A point is dominated when another is no slower and no larger, and better in one; of equal costs
    the fewer micro-batches is kept.

    Example:
        >>> from types import SimpleNamespace as P
        >>> pts = [(1, P(cost=(1.0, 10.0))), (2, P(cost=(1.1, 6.0))), (4, P(cost=(1.3, 6.0)))]
        >>> [(m, p.cost) for m, p in pareto_over_counts(pts)]
        [(1, (1.0, 10.0)), (2, (1.1, 6.0))]
    """
    ranked = sorted(candidates, key=lambda mp: (float(mp[1].cost[0]), float(mp[1].cost[1]), mp[0]))
    kept, least_memory = [], float("inf")
    for m, point in ranked:
        memory = float(point.cost[1])
        if memory < least_memory:
            kept.append((m, point))
            least_memory = memory
    return kept
