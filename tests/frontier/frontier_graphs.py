"""Random cost graphs for the solver's property tests (small enough for brute force)."""

from __future__ import annotations

import networkx as nx
import numpy as np
from hypothesis import strategies as st

FAMILIES = ("chain", "series_parallel", "skip", "random", "multisource", "disconnected", "dense", "diamonds")


def _structure(rng: np.random.Generator, family: str, n: int) -> nx.DiGraph:
    """Edges of a DAG of the given family over nodes 0..n-1 (topologically numbered)."""
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    if family == "chain":
        g.add_edges_from((i, i + 1) for i in range(n - 1))
    elif family == "series_parallel":
        edges = [(0, 1)] if n > 1 else []
        for new in range(2, n):
            u, v = edges[rng.integers(len(edges))]
            if rng.random() < 0.5:  # series: subdivide u -> v
                edges.remove((u, v))
            edges += [(u, new), (new, v)]  # parallel when (u, v) kept
        g.add_edges_from(edges)
        order = list(nx.topological_sort(g))
        g = nx.relabel_nodes(g, {old: i for i, old in enumerate(order)})
    elif family == "skip":
        g.add_edges_from((i, i + 1) for i in range(n - 1))
        g.add_edges_from((i, j) for i in range(n) for j in range(i + 2, n) if rng.random() < 0.25)
    elif family == "diamonds":
        g.add_edges_from((i, i + 1) for i in range(n - 1))
        for i in range(0, n - 3, 3):
            g.add_edge(i, i + 2)
            g.add_edge(i + 1, i + 3)
    elif family == "multisource":
        sources = max(2, n // 2)
        g.add_edges_from((i, j) for i in range(sources) for j in range(sources, n) if rng.random() < 0.5)
        g.add_edges_from((i, j) for i in range(sources, n) for j in range(i + 1, n) if rng.random() < 0.4)
    elif family == "disconnected":
        g.add_edges_from(
            (i, j) for i in range(n) for j in range(i + 1, n) if (i % 2 == j % 2) and rng.random() < 0.6
        )
    else:
        p = 0.75 if family == "dense" else 0.4
        g.add_edges_from((i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < p)
    return g


def build_graph(
    seed: int, family: str, n: int, max_configs: int, k: int, integer: bool = True, inf_prob: float = 0.0
) -> nx.DiGraph:
    """A random cost graph: structure from ``family``, costs from ``seed``.

    Integer costs in 0..6 (many ties) or uniform floats; ``inf_prob`` marks entries +inf.
    Node names are strings inserted in a shuffled order.
    """
    rng = np.random.default_rng(seed)
    s = _structure(rng, family, n)
    g = nx.DiGraph()
    sizes = {v: int(rng.integers(1, max_configs + 1)) for v in s.nodes}

    def draw(shape):
        c = rng.integers(0, 7, shape).astype(float) if integer else rng.random(shape) * 10
        if inf_prob:
            c[rng.random(shape[:-1]) < inf_prob] = np.inf
        return c

    for v in rng.permutation(list(s.nodes)).tolist():
        cost = draw((sizes[v], k))
        if not np.isfinite(cost).all(axis=1).any():  # a node needs one feasible configuration
            cost[0] = rng.integers(0, 7, k)
        g.add_node(f"n{v}", cost=cost)
    for u, v in s.edges:
        c = draw((sizes[u], sizes[v], k))
        if rng.random() < 0.5:  # layout-like: free on the diagonal
            d = min(sizes[u], sizes[v])
            c[np.arange(d), np.arange(d)] = 0.0
        g.add_edge(f"n{u}", f"n{v}", cost=c)
    return g


@st.composite
def cost_graphs(draw, k=None, max_nodes: int = 7, max_configs: int = 5, max_plans: int = 20000, **kw):
    """Hypothesis strategy: a random small cost graph (all plans enumerable)."""
    family = draw(st.sampled_from(FAMILIES))
    n = draw(st.integers(1, max_nodes))
    mc = draw(st.integers(1, max_configs))
    while n > 1 and mc**n > max_plans:
        mc -= 1
    kk = k if k is not None else draw(st.sampled_from([2, 3]))
    seed = draw(st.integers(0, 2**32 - 1))
    integer = kw.get("integer", draw(st.booleans()))
    inf_prob = kw.get("inf_prob", draw(st.sampled_from([0.0, 0.0, 0.15])))
    return build_graph(seed, family, n, mc, kk, integer=integer, inf_prob=inf_prob)
