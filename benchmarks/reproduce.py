"""Reproduce the papers' comparisons: FT's plans against data parallelism, Megatron and FlexFlow-style MCMC.

For each model (AlexNet, VGG-16, ResNet-50, GPT-2 small, GPT 1.3B) on each cluster profile (16 x 1
V100 on 25 Gb/s Ethernet, 1 x 8 H100 NVLink, 4 x 8 H100 with InfiniBand), with every GPU of the
cluster and a memory budget of one device's memory, the estimated step time and per-device memory
of

* DP: pure data parallelism (best plan of that space, see ``reproduce_baselines``);
* Megatron: linear layers column/row tensor parallel over a node's GPUs, the rest data parallel;
* MCMC: FlexFlow-style Metropolis search (``frontier.reference.mcmc_frontier``) over the full space;
* FT: the fastest plan of FT's exact frontier under the budget;

then FT's speed-up over each, the memory FT saves at equal time (the leanest FT plan at most as
slow as the baseline), and the search times. All four are priced by the same cost tables
(roofline compute, alpha-beta collectives, no overlap), so the comparison isolates the search.

    .venv/bin/python benchmarks/reproduce.py --quick    # 3 models x 2 clusters at 8 GPUs, a few minutes
    .venv/bin/python benchmarks/reproduce.py            # the full table (see docs/results.md)
    .venv/bin/python benchmarks/reproduce.py --plots docs/images --json out/reproduce.json

Batch sizes: 32 images per GPU for the CNNs, one sequence per GPU (GPT-2 small: 1024 tokens,
GPT 1.3B: 2048 tokens), so every strategy, data parallelism included, can use every GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reproduce_baselines import (  # noqa: E402
    capture_zoo,
    data_parallel_space,
    fastest_under,
    leanest_within,
    megatron_space,
    solve_in_space,
)

import frontier as ft  # noqa: E402
from frontier.reference import mcmc_frontier  # noqa: E402
from tensoropt.cost_graph import cost_graph  # noqa: E402

MODELS = {  # name -> (samples per GPU, optimizer)
    "alexnet": (32, "momentum"),
    "vgg16": (32, "momentum"),
    "resnet50": (32, "momentum"),
    "gpt2-small": (1, "adamw"),
    "gpt-1.3b": (1, "adamw"),
}
CLUSTERS = {"v100-16x1-25gbe": 16, "h100x8": 8, "h100-4x8-ib": 32}
FEWER_DEVICES = {("resnet50", "v100-16x1-25gbe"): 8, ("gpt2-small", "v100-16x1-25gbe"): 8,
                 ("gpt-1.3b", "v100-16x1-25gbe"): 8}
"""Cases planned on part of the cluster: their exact 16-GPU frontiers (one mesh level of four
interchangeable axes, 35-55 configurations per operator) take several CPU minutes each."""
VARIANTS = {"vgg16-cifar10": ("vgg16", {"input_shape": [3, 32, 32], "num_classes": 10})}
"""Extra rows: SplitBrain's setting (VGG-16 on 32 x 32 CIFAR-10 images), on the V100 cluster only."""
VARIANT_CLUSTERS = {"vgg16-cifar10": ("v100-16x1-25gbe",)}
QUICK_MODELS = ("alexnet", "vgg16", "gpt2-small")
QUICK_CLUSTERS = {"v100-16x1-25gbe": 8, "h100x8": 8}
STRATEGIES = ("dp", "megatron", "mcmc", "ft")
FULL_SPACE_MAX_DEVICES = 16
"""Above this many GPUs every strategy searches the hierarchical space (``whole_levels``: the nodes'
axes split one dim, the GPUs' axes one dim: DP x TP hybrids) to keep the run under 15 minutes."""


EPSILON = 0.01
"""FT's approximation for ResNet-50 above 8 GPUs (its 16 residual merges keep wide exact frontiers)."""


def default_epsilon(model: str, devices: int) -> float:
    """The approximation factor this benchmark uses for a model and device count (0: exact).

    Example:
        >>> default_epsilon("vgg16", 16), default_epsilon("resnet50", 16)
        (0.0, 0.01)
    """
    return EPSILON if model == "resnet50" and devices > 8 else 0.0


@dataclass
class Case:
    """The measured figures of one (model, cluster) pair; times in seconds, memory in bytes."""

    model: str
    cluster: str
    devices: int
    batch: int
    budget_bytes: float
    points: dict[str, list[list[float]]] = field(default_factory=dict)
    """strategy -> its frontier [(time_s, memory_bytes), ...] (DP/Megatron: the restricted space's)."""
    chosen: dict[str, list[float] | None] = field(default_factory=dict)
    """strategy -> (time_s, memory_bytes) of its fastest plan under the budget, None if none fits."""
    ft_summary: str = ""
    epsilon: float = 0.0
    """FT's approximation factor (0: exact frontier)."""
    capture_s: float = 0.0
    cost_graph_s: float = 0.0
    ft_solve_s: float = 0.0
    mcmc_s: float = 0.0

    def speedup(self, baseline: str) -> float | None:
        """FT's speed-up over ``baseline`` (None when either has no plan under the budget)."""
        ft_c, b = self.chosen.get("ft"), self.chosen.get(baseline)
        return b[0] / ft_c[0] if ft_c and b else None

    def memory_saved(self, baseline: str) -> float | None:
        """Fraction of ``baseline``'s memory FT saves with a plan at most as slow (None if n/a)."""
        b = self.chosen.get(baseline)
        if not b:
            return None
        lean = leanest_within([ft.Point(cost=c, assignment={}) for c in map(_arr, self.points["ft"])], b[0])
        return 1.0 - lean.cost[1] / b[1] if lean is not None else None


def _arr(x):
    import numpy as np

    return np.asarray(x, dtype=float)


def run_case(model: str, cluster: str, devices: int, mcmc_s: float, log=print, epsilon: float = 0.0) -> Case:
    """Capture, price, solve and compare one (model, cluster, device count)."""
    zoo_name, overrides = VARIANTS.get(model, (model, {}))
    per_gpu, optimizer = MODELS[zoo_name]
    batch = per_gpu * devices
    t0 = time.perf_counter()
    graph, job, cl = capture_zoo(zoo_name, cluster, devices, batch, optimizer=optimizer, **overrides)
    t1 = time.perf_counter()
    configurations = None
    if devices > FULL_SPACE_MAX_DEVICES:
        from tensoropt.configspace import configurations as enumerate_configurations
        from tensoropt.configspace.configuration import Mesh

        mesh = Mesh.for_cluster(devices, cl.devices_per_node)
        configurations = enumerate_configurations(graph, mesh, whole_levels=True)
    G = cost_graph(graph, cl, devices, batch_size=batch, optimizer=optimizer, configurations=configurations)
    t2 = time.perf_counter()
    ft_points = ft.solve(G, epsilon=epsilon)
    t3 = time.perf_counter()
    case = Case(model, cluster, devices, batch, float(cl.device.memory_bytes), epsilon=epsilon,
                capture_s=t1 - t0, cost_graph_s=t2 - t1, ft_solve_s=t3 - t2, mcmc_s=mcmc_s)
    log(f"  {model} on {cluster} x{devices}: {len(ft_points)} FT plans, cost graph {t2 - t1:.1f}s, "
        f"solve {t3 - t2:.1f}s; baselines...")
    fronts = {
        "ft": ft_points,
        "dp": solve_in_space(G, data_parallel_space(G)),
        "megatron": solve_in_space(G, megatron_space(G, graph.nx)),
        "mcmc": mcmc_frontier(G, time_budget_s=mcmc_s, seed=0),
    }
    for name, pts in fronts.items():
        case.points[name] = [[float(p.cost[0]), float(p.cost[1])] for p in pts]
        best = fastest_under(pts, case.budget_bytes)
        case.chosen[name] = [float(best.cost[0]), float(best.cost[1])] if best else None
        if name == "ft" and best is not None:
            from tensoropt.summary import plan_summary

            ops = {n: G.nodes[n]["configs"][c] for n, c in best.assignment.items()}
            case.ft_summary = plan_summary(graph, ops)
    return case


def _ms(c) -> str:
    return f"{c[0] * 1e3:.1f}" if c else "OOM"


def _gib(c) -> str:
    return f"{c[1] / 2**30:.2f}" if c else "-"


def _x(v) -> str:
    return f"{v:.2f}x" if v is not None else "-"


def _pct(v) -> str:
    return f"{100 * v:.0f}%" if v is not None else "-"


def tables(cases: list[Case]) -> str:
    """The markdown tables: step time and memory per strategy; speed-ups, savings, search times."""
    lines = [
        "| model | cluster | GPUs | batch | DP ms (GiB) | Megatron ms (GiB) | MCMC ms (GiB) | FT ms (GiB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        cells = [f"{_ms(c.chosen[s])} ({_gib(c.chosen[s])})" for s in STRATEGIES]
        if c.epsilon:
            cells[-1] += f" eps={c.epsilon:g}"
        lines.append(f"| {c.model} | {c.cluster} | {c.devices} | {c.batch} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| model | cluster | FT vs DP | FT vs Megatron | FT vs MCMC | memory saved vs DP | "
        "vs Megatron | FT search s (cost graph + solve) | MCMC s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        lines.append(
            f"| {c.model} | {c.cluster} | {_x(c.speedup('dp'))} | {_x(c.speedup('megatron'))} | "
            f"{_x(c.speedup('mcmc'))} | {_pct(c.memory_saved('dp'))} | {_pct(c.memory_saved('megatron'))} | "
            f"{c.cost_graph_s + c.ft_solve_s:.1f} ({c.cost_graph_s:.1f} + {c.ft_solve_s:.1f}) | "
            f"{c.mcmc_s:.0f} |"
        )
    lines += ["", "| model | cluster | FT's fastest plan under the budget |", "|---|---|---|"]
    lines += [f"| {c.model} | {c.cluster} | {c.ft_summary} |" for c in cases]
    return "\n".join(lines)


def plot(cases: list[Case], out_dir: Path) -> list[Path]:
    """One PNG per model: a panel per cluster with FT's frontier and the baselines' plans."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    style = {"dp": ("s", "tab:red", "data parallel"), "megatron": ("^", "tab:green", "Megatron-style"),
             "mcmc": ("x", "tab:purple", "MCMC (FlexFlow-style)")}
    for model in dict.fromkeys(c.model for c in cases):
        mine = [c for c in cases if c.model == model]
        fig, axes = plt.subplots(1, len(mine), figsize=(5.2 * len(mine), 4.2), squeeze=False)
        for ax, c in zip(axes[0], mine):
            pts = sorted(c.points["ft"], key=lambda p: p[1])
            ax.plot([p[1] / 2**30 for p in pts], [p[0] * 1e3 for p in pts], color="tab:blue", marker=".",
                    markersize=3, linewidth=1, label=f"FT frontier ({len(pts)} plans)")
            for s, (marker, color, label) in style.items():
                pt = c.chosen.get(s)
                if pt:
                    ax.scatter([pt[1] / 2**30], [pt[0] * 1e3], marker=marker, color=color, s=70, label=label,
                               zorder=3)
            if c.budget_bytes < 3 * max(p[1] for p in pts):
                ax.axvline(c.budget_bytes / 2**30, color="grey", linestyle="--", linewidth=1,
                           label="device memory")
            ax.set_xscale("log")
            ax.set_yscale("log")
            for axis in (ax.xaxis, ax.yaxis):  # plain numbers; label minor ticks when within a decade
                axis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
                minor = matplotlib.ticker.LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4))
                axis.set_minor_formatter(minor)
            ax.set_xlabel("memory per GPU (GiB)")
            ax.set_ylabel("estimated step time (ms)")
            ax.set_title(f"{model}: {c.cluster}, {c.devices} GPUs, batch {c.batch}", fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"reproduce_{model.replace('.', '_').replace('-', '_')}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    """Run the study and print the tables (``--help`` for options)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="AlexNet, VGG-16, GPT-2 small; 8 GPUs of two clusters"
    )
    ap.add_argument("--models", nargs="*", choices=sorted(MODELS) + sorted(VARIANTS),
                    help="subset of models")
    ap.add_argument("--clusters", nargs="*", choices=sorted(CLUSTERS), help="subset of clusters")
    ap.add_argument("--mcmc-s", type=float, default=None, help="MCMC seconds per case (default 20, quick 3)")
    ap.add_argument("--plots", type=Path, help="write reproduce_<model>.png frontier plots into this folder")
    ap.add_argument("--json", type=Path, help="write every figure and frontier as JSON")
    ap.add_argument("--epsilon", type=float, default=None,
                    help=f"FT's approximation (default {EPSILON} for ResNet-50 above 8 GPUs, else exact)")
    ap.add_argument("--load", type=Path, nargs="*", help="print tables and plots of earlier --json files")
    args = ap.parse_args(argv)
    models = args.models or (QUICK_MODELS if args.quick else tuple(MODELS) + tuple(VARIANTS))
    clusters = QUICK_CLUSTERS if args.quick else CLUSTERS
    if args.clusters:
        clusters = {k: v for k, v in CLUSTERS.items() if k in args.clusters}
    mcmc_s = args.mcmc_s if args.mcmc_s is not None else (3.0 if args.quick else 20.0)
    start, cpu = time.perf_counter(), time.process_time()
    cases = [Case(**c) for path in args.load or [] for c in json.loads(path.read_text())]
    order = list(MODELS) + list(VARIANTS)
    cases.sort(key=lambda c: (order.index(c.model), list(CLUSTERS).index(c.cluster)))
    todo = [] if args.load else [(m, c, FEWER_DEVICES.get((m, c), p)) for m in models
                                 for c, p in clusters.items() if c in VARIANT_CLUSTERS.get(m, (c,))]
    for i, (model, cluster, devices) in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {model} on {cluster} ({devices} GPUs)", flush=True)
        eps = args.epsilon if args.epsilon is not None else default_epsilon(model, devices)
        log = lambda s: print(s, flush=True)
        cases.append(run_case(model, cluster, devices, mcmc_s, log=log, epsilon=eps))
        if args.json:  # after every case, so an interrupted run keeps what it measured
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps([asdict(c) for c in cases], indent=1))
    print()
    print(tables(cases))
    print(f"\ntotal {time.perf_counter() - start:.0f} s wall, {time.process_time() - cpu:.0f} s CPU")
    if args.plots:
        for path in plot(cases, args.plots):
            print(f"wrote {path}")
    if args.json and todo:
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
