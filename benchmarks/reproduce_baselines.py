"""Baseline plan spaces for the reproduction study: data parallelism and Megatron-style tensor parallelism.

A baseline is a *restricted configuration space*: each operator keeps only the configurations the
strategy allows, and the FT solver then finds the best plans inside that space (so a baseline is
the best plan of its kind under our cost model, never a strawman). The same cost tables price
every strategy, so the comparison isolates the search space.

* Data parallelism: every operator whose configurations include "batch split over every device"
  keeps only that one; operators without a batch dim (e.g. a position embedding) keep all
  configurations.
* Megatron-style tensor parallelism (Shoeybi et al., 2019): the tensor-parallel (TP) group is the
  GPUs of a node (every device when a node has one GPU); the data-parallel (DP) group is the
  rest. A linear layer is *row* parallel (input features split over TP) when its activation
  comes, through parameter-free single-input operators (GELU, dropout, attention), from a
  column-parallel linear; otherwise it is *column* parallel (output features split over TP). In
  both cases the batch is split over DP. Attention splits heads over TP and batch over DP;
  embeddings split the vocabulary over TP; other operators with parameters (convolutions, norms)
  split only the batch, over at least the DP axes; parameter-free operators keep every
  configuration (the solver picks the cheapest glue).

Example:
    >>> from tensoropt.configspace.configuration import Mesh
    >>> tp_dp_axes(Mesh.for_cluster(32, devices_per_node=8))
    ((2, 3, 4), (0, 1))
"""

from __future__ import annotations

from collections.abc import Callable

import networkx as nx
import numpy as np

import frontier as ft
from frontier.point import Point
from tensoropt.baselines import plan_cost  # noqa: F401  (re-exported: the reproduce tests import it here)

Allowed = Callable[[str, dict], list[int] | None]
"""``allowed(node, node_attrs) -> configuration indices to keep`` (None or empty: keep all)."""

PASS_THROUGH_KINDS = ("elementwise", "dropout", "sdpa")
"""Parameter-free kinds a column-parallel activation flows through unchanged (when single-sourced)."""


def restricted_graph(G: nx.DiGraph, allowed: Allowed) -> tuple[nx.DiGraph, dict[str, np.ndarray]]:
    """A copy of cost graph ``G`` keeping, per node, the configurations ``allowed`` returns.

    Returns:
        ``(H, keep)``: the restricted cost graph and, per node, the kept indices into ``G``'s rows.

    Example:
        >>> G = nx.DiGraph(); G.add_node("a", cost=np.array([[1.0, 2.0], [2.0, 1.0]]), configs=["x", "y"])
        >>> H, keep = restricted_graph(G, lambda n, d: [1])
        >>> H.nodes["a"]["configs"], keep["a"].tolist()
        (['y'], [1])
    """
    H = nx.DiGraph()
    H.graph.update(G.graph)
    keep = {}
    for n, d in G.nodes(data=True):
        idx = allowed(n, d) or list(range(len(d["cost"])))
        keep[n] = np.asarray(idx, dtype=np.int64)
        H.add_node(n, cost=d["cost"][keep[n]], configs=[d["configs"][i] for i in idx])
    for u, v, d in G.edges(data=True):
        H.add_edge(u, v, cost=d["cost"][np.ix_(keep[u], keep[v])])
    return H, keep


def solve_in_space(G: nx.DiGraph, allowed: Allowed) -> list[Point]:
    """The exact Pareto frontier of the plans of ``G`` that ``allowed`` admits (assignments index ``G``).

    Example:
        >>> G = nx.DiGraph(); G.add_node("a", cost=np.array([[1.0, 2.0], [2.0, 1.0]]), configs=["x", "y"])
        >>> [(p.cost.tolist(), p.assignment) for p in solve_in_space(G, lambda n, d: [1])]
        [([2.0, 1.0], {'a': 1})]
    """
    H, keep = restricted_graph(G, allowed)
    return [
        Point(cost=p.cost, assignment={n: int(keep[n][c]) for n, c in p.assignment.items()})
        for p in ft.solve(H)
    ]


def tp_dp_axes(mesh) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(TP axes, DP axes): the GPU-level axes and the node-level ones; every axis is TP without GPU axes.

    Example:
        >>> from tensoropt.configspace.configuration import Mesh
        >>> tp_dp_axes(Mesh.for_cluster(16, devices_per_node=1))
        ((0, 1, 2, 3), ())
    """
    gpu = tuple(a for a, level in enumerate(mesh.levels) if level == "gpu")
    if not gpu:
        return tuple(range(len(mesh.shape))), ()
    return gpu, tuple(a for a, level in enumerate(mesh.levels) if level != "gpu")


def _with_splits(d: dict, target: dict[str, tuple[int, ...]]) -> list[int]:
    """Indices of the configurations whose splits are exactly ``target`` (empty dims dropped)."""
    want = {k: tuple(v) for k, v in target.items() if v}
    return [i for i, c in enumerate(d["configurations"]) if dict(c.splits) == want]


def data_parallel_space(G: nx.DiGraph) -> Allowed:
    """Data parallelism: the batch split over every mesh axis wherever an operator has a batch dim.

    Example:
        >>> from tensoropt.configspace.configuration import Configuration, Mesh
        >>> G = nx.DiGraph(mesh=Mesh((2,), ("gpu",)))
        >>> dp = Configuration("batch=2", (("batch", (0,)),), (), (), ("S(0)",))
        >>> data_parallel_space(G)("fc", {"configurations": [dp]})
        [0]
    """
    every = tuple(range(len(G.graph["mesh"].shape)))
    return lambda n, d: _with_splits(d, {"batch": every})


def megatron_roles(graph: nx.DiGraph) -> dict[str, str]:
    """``"col"`` or ``"row"`` for every linear node of an OpGraph's networkx graph (see the module docstring).

    Example:
        >>> g = nx.DiGraph()
        >>> g.add_node("x", kind="input", inputs=[])
        >>> g.add_node("fc1", kind="linear", inputs=[{"source": "x"}])
        >>> g.add_node("act", kind="elementwise", inputs=[{"source": "fc1"}])
        >>> g.add_node("fc2", kind="linear", inputs=[{"source": "act"}])
        >>> megatron_roles(g)
        {'fc1': 'col', 'fc2': 'row'}
    """
    roles: dict[str, str] = {}
    for n in nx.topological_sort(graph):
        d = graph.nodes[n]
        if d["kind"] != "linear":
            continue
        source = d["inputs"][0]["source"] if d["inputs"] else None
        while source is not None and graph.nodes[source]["kind"] in PASS_THROUGH_KINDS:
            sources = {e["source"] for e in graph.nodes[source]["inputs"]}
            if len(sources) != 1 or graph.nodes[source].get("params"):
                source = None
                break
            source = sources.pop()
        roles[n] = "row" if source is not None and roles.get(source) == "col" else "col"
    return roles


def megatron_space(G: nx.DiGraph, graph: nx.DiGraph) -> Allowed:
    """Megatron-style tensor parallelism over the node's GPUs, data parallelism across nodes.

    Args:
        G: the cost graph (its ``mesh`` graph attribute sets the TP and DP axes).
        graph: the OpGraph's networkx graph (operator kinds, inputs and parameters).
    """
    tp, dp = tp_dp_axes(G.graph["mesh"])
    roles = megatron_roles(graph)
    split = {"col": "out", "row": "in"}

    def allowed(n: str, d: dict) -> list[int] | None:
        kind = graph.nodes[n]["kind"] if n in graph else d.get("kind")
        if kind == "linear":
            return _with_splits(d, {"batch": dp, split[roles[n]]: tp})
        if kind == "sdpa":
            return _with_splits(d, {"batch": dp, "heads": tp})
        if kind == "embedding":
            return _with_splits(d, {"batch": dp, "vocab": tp}) or _with_splits(d, {"vocab": tp})
        if n in graph and graph.nodes[n].get("params"):
            return [
                i
                for i, c in enumerate(d["configurations"])
                if set(dict(c.splits)) == {"batch"} and set(dp) <= set(dict(c.splits)["batch"])
            ] or _with_splits(d, {})
        return None

    return allowed


def fastest_under(points: list[Point], budget_bytes: float) -> Point | None:
    """The fastest point whose memory fits ``budget_bytes`` (objective 0 time, 1 memory), or None.

    Example:
        >>> pts = [Point(np.array([1.0, 9.0]), {}), Point(np.array([2.0, 3.0]), {})]
        >>> fastest_under(pts, 5.0).cost.tolist()
        [2.0, 3.0]
    """
    fits = [p for p in points if p.cost[1] <= budget_bytes]
    return min(fits, key=lambda p: (p.cost[0], p.cost[1])) if fits else None


def leanest_within(points: list[Point], time_s: float) -> Point | None:
    """The smallest-memory point at most as slow as ``time_s`` (with a 1e-9 relative slack), or None.

    Example:
        >>> pts = [Point(np.array([1.0, 9.0]), {}), Point(np.array([2.0, 3.0]), {})]
        >>> leanest_within(pts, 1.5).cost.tolist()
        [1.0, 9.0]
    """
    fits = [p for p in points if p.cost[0] <= time_s * (1 + 1e-9)]
    return min(fits, key=lambda p: (p.cost[1], p.cost[0])) if fits else None


def capture_zoo(name: str, cluster: str, devices: int, batch_size: int, optimizer: str = "adamw", **model):
    """Capture a zoo model on the meta device the way the planner does.

    Returns:
        ``(graph, job, cluster)``: the OpGraph, the resolved :class:`tensoropt.config.Job` and
        the loaded cluster profile, ready for :func:`tensoropt.planner.plan_devices` or
        :func:`tensoropt.cost_graph.cost_graph`.

    Example:
        >>> graph, job, cl = capture_zoo("mlp", "cpu-local", 2, 8)  # doctest: +SKIP
    """
    from tensoropt.config import Job
    from tensoropt.planner import build_job_model, capture_job, load_job_cluster, resolve_job

    job = Job(
        model={"name": name, **model},
        cluster=cluster,
        devices=[devices],
        training={"global_batch_size": batch_size, "optimizer": optimizer},
    )
    cl = load_job_cluster(job)
    module, spec = build_job_model(job, "meta")
    job = resolve_job(job, spec, cl)
    return capture_job(job, (module, spec)), job, cl
