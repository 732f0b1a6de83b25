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


def _op_costs(
    rng: np.random.Generator, configs: int, compute_s: float, param_b: float, act_b: float
) -> OpCosts:
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
        (26, 33)
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
    """One line of the table (times in seconds; cpu = process time, wall = elapsed)."""

    graph: str
    nodes: int
    configs: int
    ft_wall_s: float
    ft_cpu_s: float
    points: int
    reused: str
    noreuse_cpu_s: float | None = None
    eps_cpu_s: float | None = None
    eps_points: int | None = None
    budget_s: float | None = None
    nsga_hv: float | None = None
    mcmc_hv: float | None = None
    ilp_s: float | None = None
    ilp_ok: str = ""


def _timed(fn, *args, **kwargs):
    """(result, wall seconds, cpu seconds) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def run_case(
    name: str,
    G: nx.DiGraph,
    configs: int,
    baselines: bool,
    ilp: bool,
    eps: bool,
    noreuse: bool = False,
    budget_s: float | None = None,
    max_budget_s: float = 30.0,
    ilp_limit_s: float = 300.0,
) -> Row:
    """Solve ``G`` with FT (and the baselines when asked) and fill a :class:`Row`.

    NSGA-II and MCMC get FT's exact wall time (at least 0.5 s, at most ``max_budget_s``)
    unless ``budget_s`` is given; hypervolumes use the reference point 1.1 x FT's nadir.

    Example:
        >>> run_case("chain", chain_graph(6, 3), 3, False, False, False).points > 0
        True
    """
    report = frontier.SolveReport()
    points, wall, cpu = _timed(frontier.solve, G, report=report)
    row = Row(
        name,
        G.number_of_nodes(),
        configs,
        wall,
        cpu,
        len(points),
        f"{report.stats.reused}/{report.stats.calls}",
    )
    if noreuse:
        row.noreuse_cpu_s = _timed(frontier.solve, G, reuse=False)[2]
    if eps:
        approx, _, row.eps_cpu_s = _timed(frontier.solve, G, epsilon=0.01)
        row.eps_points = len(approx)
    exact = np.array([p.cost for p in points])
    if baselines:
        ref = exact.max(axis=0) * 1.1
        hv = hypervolume_2d(exact, ref)
        row.budget_s = budget_s if budget_s is not None else min(max(wall, 0.5), max_budget_s)
        row.nsga_hv = hypervolume_2d(np.array([p.cost for p in nsga2_frontier(G, row.budget_s)]), ref) / hv
        row.mcmc_hv = hypervolume_2d(np.array([p.cost for p in mcmc_frontier(G, row.budget_s)]), ref) / hv
    if ilp:
        mid = points[len(points) // 2]
        best, row.ilp_s, _ = _timed(
            ilp_min_cost, G, objective=0, budgets={1: float(mid.cost[1])}, time_limit_s=ilp_limit_s
        )
        want = min(p.cost[0] for p in points if p.cost[1] <= mid.cost[1])
        row.ilp_ok = "yes" if best is not None and np.isclose(best.cost[0], want, rtol=1e-6) else "NO"
        if row.ilp_s >= 0.99 * ilp_limit_s:
            row.ilp_ok += " (hit time limit)"
    return row


def format_table(rows: list[Row]) -> str:
    """The rows as a Markdown table."""
    cols = [
        ("graph", lambda r: r.graph),
        ("nodes", lambda r: r.nodes),
        ("configs/node", lambda r: r.configs),
        ("FT exact cpu (s)", lambda r: f"{r.ft_cpu_s:.2f}"),
        ("FT exact wall (s)", lambda r: f"{r.ft_wall_s:.2f}"),
        ("frontier points", lambda r: r.points),
        ("memo reused/combines", lambda r: r.reused),
        ("FT no reuse cpu (s)", lambda r: _fmt(r.noreuse_cpu_s, ".2f")),
        ("FT eps=0.01 cpu (s)", lambda r: _fmt(r.eps_cpu_s, ".2f")),
        ("eps points", lambda r: _fmt(r.eps_points, "d")),
        ("baseline budget (s)", lambda r: _fmt(r.budget_s, ".1f")),
        ("NSGA-II HV ratio", lambda r: _fmt(r.nsga_hv, ".3f")),
        ("MCMC HV ratio", lambda r: _fmt(r.mcmc_hv, ".3f")),
        ("ILP one budget wall (s)", lambda r: _fmt(r.ilp_s, ".2f")),
        ("ILP = FT", lambda r: r.ilp_ok or "-"),
    ]
    lines = ["| " + " | ".join(c for c, _ in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(f(r)) for _, f in cols) + " |" for r in rows]
    return "\n".join(lines)


def _fmt(x, spec: str) -> str:
    """``x`` formatted, or "-" when absent."""
    return "-" if x is None else format(x, spec)


#: GPT-2 XL's shape (1.56B parameters): 48 blocks of width 1600, 25 heads.
XL_SHAPE = {"layers": 48, "width": 1600, "heads": 25}


def real_gpt_graph(num_devices: int = 8, batch: int = 16, **model_overrides):
    """A GPT's cost graph from tensoropt's cost model (None when it cannot be built).

    Default GPT-2 small; ``layers=48, width=1600, heads=25`` gives GPT-2 XL's shape.
    """
    try:
        from tensoropt.capture import capture
        from tensoropt.cost_graph import cost_graph
        from tensoropt.models import build_model, example_inputs

        model, spec = build_model("gpt2-small", device="meta", **model_overrides)
        graph = capture(model, example_inputs(spec, batch, device="meta"))
        return cost_graph(graph, "h100x8", num_devices, batch_size=batch)
    except Exception as exc:  # the benchmark still runs without the torch side
        print(f"skipping the real GPT cost graph: {exc}", file=sys.stderr)
        return None


def cases(quick: bool) -> list[tuple]:
    """(name, graph, configs, options) of the quick or the full table."""
    quick_budget = dict(baselines=True, max_budget_s=2.0)
    if quick:
        return [
            ("chain-100", chain_graph(100, 8), 8, quick_budget),
            ("transformer-12", transformer_graph(12, 8), 8, dict(quick_budget, eps=True, noreuse=True)),
            ("transformer-2", transformer_graph(2, 8), 8, dict(ilp=True)),
            ("transformer-48", transformer_graph(48, 4), 4, dict()),
        ]
    out = [
        ("chain-200", chain_graph(200, 32), 32, dict(baselines=True)),
        ("transformer-12", transformer_graph(12, 8), 8, dict(ilp=True)),
        ("transformer-12", transformer_graph(12, 16), 16, dict(baselines=True, eps=True, noreuse=True)),
        ("transformer-12", transformer_graph(12, 32), 32, dict(baselines=True, ilp=True)),
        ("transformer-48", transformer_graph(48, 8), 8, dict(baselines=True, ilp=True)),
        ("transformer-48", transformer_graph(48, 16), 16, dict(baselines=True)),
        ("transformer-96", transformer_graph(96, 8), 8, dict()),
        ("transformer-48", transformer_graph(48, 32), 32, dict(eps=True)),
    ]
    real = [
        ("gpt2-small real costs, 8 GPUs", {}, dict(baselines=True, ilp=True)),
        ("gpt2-xl shape (48 blocks) real costs, 8 GPUs", XL_SHAPE, dict()),
    ]
    for i, (name, overrides, options) in enumerate(real):
        G = real_gpt_graph(**overrides)
        if G is not None:
            sizes = [len(G.nodes[n]["cost"]) for n in G.nodes]
            out.insert(i, (name, G, f"{min(sizes)}-{max(sizes)}", options))
    return out


def _selected(name: str, configs, only: list[str] | None) -> bool:
    """Whether row ``name`` with ``configs`` per node is among ``only`` (None: every row).

    Example:
        >>> _selected("transformer-48", 32, ["transformer-48:32"])
        True
        >>> _selected("chain-200", 32, ["transformer"])
        False
    """
    if only is None:
        return True
    for pattern in only:
        prefix, _, size = pattern.partition(":")
        if name.startswith(prefix) and (not size or str(configs) == size):
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes for CI (< 60 s)")
    parser.add_argument("--only", nargs="+", metavar="NAME[:CONFIGS]", default=None,
                        help="run only these rows, e.g. transformer-48:32 'gpt2-xl' (name prefix, "
                             "optionally ':' and the configurations per node)")
    parser.add_argument("--ft-only", action="store_true",
                        help="FT's own figures only (exact, no-reuse and epsilon solves): skip NSGA-II, MCMC "
                             "and the integer program")
    args = parser.parse_args(argv)
    frontier.solve(transformer_graph(2, 4))  # load (or compile, once per checkout) the kernels
    rows = []
    selected = [c for c in cases(args.quick) if _selected(c[0], c[2], args.only)]
    if not selected:
        parser.error(f"--only {' '.join(args.only)} matches no row; rows are "
                     + ", ".join(f"{n}:{c}" for n, _, c, _ in cases(args.quick)))
    for name, G, configs, options in selected:
        options = {"baselines": False, "ilp": False, "eps": False, **options}
        if args.ft_only:
            options.update(baselines=False, ilp=False)
        rows.append(run_case(name, G, configs, **options))
        r = rows[-1]
        print(
            f"done {name} C={configs}: FT {r.ft_cpu_s:.2f} s cpu, {r.points} points",
            file=sys.stderr,
            flush=True,
        )
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
