"""Benchmark of the FT solver against NSGA-II, MCMC and the integer program.

Graphs: chains and transformer-like graphs (blocks of 12 operators with an attention
diamond and two residual skips) with 8-64 configurations per node and structured random
(time_s, memory_bytes) costs: each configuration shards parameters and activations by
some degree (less memory) at the price of communication time, and redistribution edges
are free when the producer's output layout matches the consumer's input layout.

    .venv/bin/python benchmarks/frontier_bench.py --quick   # CI smoke, < 60 s
    .venv/bin/python benchmarks/frontier_bench.py           # the full table

For each graph: FT wall time (exact, and epsilon=0.01 where asked), frontier size, reuse
of identical blocks, NSGA-II and MCMC given the same wall time with their hypervolume as
a fraction of FT's exact frontier's, and the integer program's time for one budget point.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import frontier  # noqa: E402
from frontier.reference import hypervolume_2d, ilp_min_cost, mcmc_frontier, nsga2_frontier  # noqa: E402

#: Operators of one block: (name, relative compute time, relative parameter bytes, relative activation bytes).
BLOCK_OPS = [
    ("ln1", 0.05, 0.0, 1.0),
    ("q", 1.0, 1.0, 1.0),
    ("k", 1.0, 1.0, 1.0),
    ("v", 1.0, 1.0, 1.0),
    ("scores", 1.5, 0.0, 4.0),
    ("av", 1.5, 0.0, 1.0),
    ("proj", 1.0, 1.0, 1.0),
    ("add1", 0.02, 0.0, 0.0),
    ("ln2", 0.05, 0.0, 1.0),
    ("fc1", 4.0, 4.0, 1.0),
    ("fc2", 4.0, 4.0, 4.0),
    ("add2", 0.02, 0.0, 0.0),
]
BLOCK_EDGES = [
    ("ln1", "q"), ("ln1", "k"), ("ln1", "v"), ("q", "scores"), ("k", "scores"), ("scores", "av"),
    ("v", "av"), ("av", "proj"), ("proj", "add1"), ("add1", "ln2"), ("ln2", "fc1"), ("fc1", "fc2"),
    ("fc2", "add2"), ("add1", "add2"),
]  # fmt: skip
N_LAYOUTS = 4


@dataclass
class OpCosts:
    """Cost arrays of one operator kind: node (C, 2), and its input/output layout per config."""

    node: np.ndarray
    layout_in: np.ndarray
    layout_out: np.ndarray
    act_bytes: float


def _op_costs(rng: np.random.Generator, configs: int, compute_s: float, param_b: float, act_b: float) -> OpCosts:
    """Configurations trading memory (sharding degree) for time (communication, lower efficiency)."""
    shard = 2.0 ** rng.integers(0, 4, configs)  # parameter sharding degree 1..8
    act_shard = 2.0 ** rng.integers(0, 3, configs)
    eff = rng.uniform(0.7, 1.0, configs)
    time_s = compute_s * 1e-3 / eff + (shard - 1) / shard * param_b * 2e-4 + (act_shard - 1) * act_b * 1e-4
    memory_bytes = (param_b * 4 / shard + act_b / act_shard) * 2**26
    node = np.stack([time_s, memory_bytes], axis=1)
    return OpCosts(node, rng.integers(0, N_LAYOUTS, configs), rng.integers(0, N_LAYOUTS, configs), act_b)


def _edge_cost(src: OpCosts, dst: OpCosts, redistribution_s: np.ndarray) -> np.ndarray:
    """Redistribution time when layouts differ (zero when they match); no memory."""
    t = redistribution_s[src.layout_out[:, None], dst.layout_in[None, :]] * max(src.act_bytes, 0.25)
    return np.stack([t, np.zeros_like(t)], axis=2)


def transformer_graph(blocks: int, configs: int, seed: int = 0) -> nx.DiGraph:
    """Embedding -> ``blocks`` identical transformer blocks -> head; ~12 nodes per block.

    Example:
        >>> G = transformer_graph(2, 4)
        >>> G.number_of_nodes(), G.number_of_edges()
        (26, 31)
    """
    rng = np.random.default_rng(seed)
    redis = rng.uniform(0.5, 1.5, (N_LAYOUTS, N_LAYOUTS)) * 3e-4
    np.fill_diagonal(redis, 0.0)
    ops = {name: _op_costs(rng, configs, *rest) for name, *rest in BLOCK_OPS}
    embed = _op_costs(rng, configs, 0.2, 8.0, 1.0)
    head = _op_costs(rng, configs, 4.0, 8.0, 2.0)
    G = nx.DiGraph()
    G.add_node("embed", cost=embed.node)
    prev, prev_costs = "embed", embed
    for b in range(blocks):
        for name, *_ in BLOCK_OPS:
            G.add_node(f"b{b}.{name}", cost=ops[name].node)
        for u, v in BLOCK_EDGES:
            G.add_edge(f"b{b}.{u}", f"b{b}.{v}", cost=_edge_cost(ops[u], ops[v], redis))
        G.add_edge(prev, f"b{b}.ln1", cost=_edge_cost(prev_costs, ops["ln1"], redis))
        G.add_edge(prev, f"b{b}.add1", cost=_edge_cost(prev_costs, ops["add1"], redis))
        prev, prev_costs = f"b{b}.add2", ops["add2"]
    G.add_node("head", cost=head.node)
    G.add_edge(prev, "head", cost=_edge_cost(prev_costs, head, redis))
    return G


def chain_graph(length: int, configs: int, seed: int = 0) -> nx.DiGraph:
    """A chain of ``length`` operators of a few repeating kinds.

    Example:
        >>> chain_graph(5, 3).number_of_edges()
        4
    """
    rng = np.random.default_rng(seed)
    redis = rng.uniform(0.5, 1.5, (N_LAYOUTS, N_LAYOUTS)) * 3e-4
    np.fill_diagonal(redis, 0.0)
    kinds = [_op_costs(rng, configs, *rest) for _, *rest in BLOCK_OPS[:4]]
    G = nx.DiGraph()
    for i in range(length):
        G.add_node(i, cost=kinds[i % 4].node)
        if i:
            G.add_edge(i - 1, i, cost=_edge_cost(kinds[(i - 1) % 4], kinds[i % 4], redis))
    return G


@dataclass
class Row:
    """One line of the table."""

    graph: str
    nodes: int
    configs: int
    ft_s: float
    points: int
    reused: str
    eps_s: float | None = None
    eps_points: int | None = None
    nsga_hv: float | None = None
    mcmc_hv: float | None = None
    ilp_s: float | None = None
    ilp_ok: str = ""


def run_case(name: str, G: nx.DiGraph, configs: int, baselines: bool, ilp: bool, eps: bool) -> Row:
    """Solve ``G`` with FT (and the baselines when asked) and fill a :class:`Row`."""
    report = frontier.SolveReport()
    t0 = time.perf_counter()
    points = frontier.solve(G, report=report)
    ft_s = time.perf_counter() - t0
    row = Row(name, G.number_of_nodes(), configs, ft_s, len(points), f"{report.stats.reused}/{report.stats.calls}")
    if eps:
        t0 = time.perf_counter()
        row.eps_points = len(frontier.solve(G, epsilon=0.01))
        row.eps_s = time.perf_counter() - t0
    exact = np.array([p.cost for p in points])
    if baselines:
        ref = exact.max(axis=0) * 1.1
        hv = hypervolume_2d(exact, ref)
        budget = max(ft_s, 0.5)
        row.nsga_hv = hypervolume_2d(np.array([p.cost for p in nsga2_frontier(G, budget)]), ref) / hv
        row.mcmc_hv = hypervolume_2d(np.array([p.cost for p in mcmc_frontier(G, budget)]), ref) / hv
    if ilp:
        mid = points[len(points) // 2]
        t0 = time.perf_counter()
        best = ilp_min_cost(G, objective=0, budgets={1: float(mid.cost[1])}, time_limit_s=300)
        row.ilp_s = time.perf_counter() - t0
        want = min(p.cost[0] for p in points if p.cost[1] <= mid.cost[1])
        row.ilp_ok = "yes" if best is not None and np.isclose(best.cost[0], want, rtol=1e-6) else "NO"
    return row


def format_table(rows: list[Row]) -> str:
    """The rows as a Markdown table."""
    head = (
        "| graph | nodes | configs/node | FT exact (s) | frontier points | memo reuse | FT eps=0.01 (s) | "
        "eps points | NSGA-II HV ratio | MCMC HV ratio | ILP one budget (s) | ILP = FT |"
    )
    lines = [head, "|" + "---|" * 12]
    f = lambda x, spec: "-" if x is None else format(x, spec)
    for r in rows:
        lines.append(
            f"| {r.graph} | {r.nodes} | {r.configs} | {r.ft_s:.2f} | {r.points} | {r.reused} | {f(r.eps_s, '.2f')} | "
            f"{f(r.eps_points, 'd')} | {f(r.nsga_hv, '.3f')} | {f(r.mcmc_hv, '.3f')} | {f(r.ilp_s, '.2f')} | "
            f"{r.ilp_ok or '-'} |"
        )
    return "\n".join(lines)


def cases(quick: bool) -> list[tuple[str, nx.DiGraph, int, bool, bool, bool]]:
    """(name, graph, configs, baselines?, ilp?, epsilon?) of the quick or the full table."""
    if quick:
        return [
            ("chain-100", chain_graph(100, 8), 8, True, True, False),
            ("transformer-12", transformer_graph(12, 8), 8, True, True, True),
            ("transformer-48", transformer_graph(48, 16), 16, False, False, False),
        ]
    return [
        ("chain-200", chain_graph(200, 32), 32, True, True, False),
        ("transformer-12", transformer_graph(12, 32), 32, True, True, True),
        ("transformer-48", transformer_graph(48, 8), 8, True, True, False),
        ("transformer-48", transformer_graph(48, 32), 32, True, True, True),
        ("transformer-96", transformer_graph(96, 32), 32, False, False, True),
        ("transformer-48", transformer_graph(48, 64), 64, False, False, True),
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes for CI (< 60 s)")
    args = parser.parse_args(argv)
    rows = []
    for name, G, configs, baselines, ilp, eps in cases(args.quick):
        rows.append(run_case(name, G, configs, baselines, ilp, eps))
        print(f"done {name} C={configs}: FT {rows[-1].ft_s:.2f} s, {rows[-1].points} points", file=sys.stderr)
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
