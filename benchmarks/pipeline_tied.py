"""Weights tied across pipeline stages (issue 27): what the planner prices, and what a run gives.

1. *Priced.* A tied GPT-2 (the zoo ``gpt``; ``--shape small``: GPT-2 small, 12 layers x 768, vocab
   50304, seq 1024, on ``h100-4x8-ib``; ``--shape tiny``: the tests' 2 x 32 on ``cpu-local``), cut in
   2 stages of equal blocks, each stage's data-parallel plan priced with and without the tie's terms
   (:mod:`tensoropt.pipeline.tied_stages`; "without" is the solver with no tie, what the planner priced
   before): per stage its time per micro-batch ``t``, its once-per-step ``d`` and its memory; and the
   step ``T = (m - 1) max t + sum t + max d``.
2. *Run* (``--run``). The tiny HF GPT-2 (tied embeddings) on 2 gloo processes, pp=2 under 1F1B, GPipe
   and Interleaved1F1B, 3 steps, against one process: the largest relative difference of the losses and
   of the parameters, and the largest difference between the two stages' copies of the tied weight.

Usage::

    .venv/bin/python benchmarks/pipeline_tied.py --shape small --devices 16
    .venv/bin/python benchmarks/pipeline_tied.py --shape tiny --devices 4 --run
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPES = {
    "small": ({"layers": 12, "width": 768, "heads": 12, "seq_len": 1024, "vocab_size": 50304, "dropout": 0.0},
              "h100-4x8-ib", 32),
    "tiny": ({"layers": 2, "width": 32, "heads": 2, "seq_len": 8, "vocab_size": 64}, "cpu-local", 8),
}


def priced(shape: str, devices: int, micro_batches: int) -> list[dict]:
    """Rows of part 1: per stage, with and without the tie's terms."""
    from estimators.profiles import load_cluster
    from frontier.pipeline import step_time_s
    from tensoropt.config import Job
    from tensoropt.data_parallel import data_parallel_assignment
    from tensoropt.pipeline.schedules import in_flight_micro_batches
    from tensoropt.pipeline.search import StageSolver
    from tensoropt.pipeline.stages import find_blocks
    from tensoropt.planner import capture_job, job_cost_graph, micro_batch_job

    kwargs, cluster, batch = SHAPES[shape]
    model = {"name": "gpt", "kwargs": {**kwargs, "tie_weights": True}}
    job = Job.from_dict({"model": model, "cluster": cluster, "devices": [devices],
                         "training": {"global_batch_size": batch}})
    job_m = micro_batch_job(job, micro_batches)
    graph = capture_job(job_m)
    G = job_cost_graph(graph, job_m, load_cluster(cluster), devices // 2)
    blocks = find_blocks(graph)
    solvers = {"with the tie": StageSolver(G, graph, blocks, micro_batches, lambda H: []),
               "without": StageSolver(G, graph, blocks, micro_batches, lambda H: [])}
    solvers["without"].tie_pairs = []
    half = blocks.count // 2
    ranges = [(0, half - 1), (half, blocks.count - 1)]
    k = in_flight_micro_batches("1F1B", 2, micro_batches)
    rows = []
    for name, solver in solvers.items():
        ts, ds = [], []
        for s, (first, last) in enumerate(ranges):
            H = solver._stage_graph(first, last, k[s])
            t, d, w = solver._price(H, data_parallel_assignment(H))
            ts.append(t)
            ds.append(d)
            span = f"{blocks.names[first]}..{blocks.names[last]}"
            rows.append({"pricing": name, "stage": s, "blocks": span,
                         "ties": ",".join(f"{x.key}:{x.role}" for x in solver.ties(first, last)) or "-",
                         "t_ms": 1e3 * t, "d_ms": 1e3 * d, "memory_mib": w / 2**20})
        rows.append({"pricing": name, "stage": "step", "blocks": "", "ties": "",
                     "t_ms": 1e3 * step_time_s(max(ts), sum(ts), max(ds), micro_batches),
                     "d_ms": 1e3 * max(ds), "memory_mib": float("nan")})
    return rows


def ran() -> list[dict]:
    """Rows of part 2: one launch of 2 processes, each run against one process."""
    import torch

    sys.path.insert(0, str(ROOT / "tests" / "pipeline_runtime"))
    from pipeline_jobs import plan, tied_gpt2_spec

    from tensoropt.launch import LaunchOptions, launch_module
    from tensoropt.pipeline_runtime.reference import reference_run

    runs = {"1F1B": [[0, 1], [2, 3]], "GPipe": [[0, 1], [2, 3]],
            "Interleaved1F1B": [[0, 0], [1, 1], [2, 2], [3, 3]]}
    spec, steps = tied_gpt2_spec(), 3
    out = Path(tempfile.mkdtemp(prefix="pipeline-tied-"))
    entries = []
    for schedule, blocks in runs.items():
        entry = plan(schedule, 2, schedule, blocks, 2)
        entry["pipeline"]["stages"] = 2  # 2 ranks (Interleaved1F1B: 4 virtual stages in blocks)
        entries.append({"spec": spec.to_json(), "plan": entry, "steps": steps,
                        "metrics": str(out / f"{schedule}.json"), "params_dir": str(out / schedule)})
    (out / "run.json").write_text(json.dumps({"runs": entries, "timeout_s": 120}))
    code = launch_module("tensoropt.pipeline_runtime.worker", [str(out / "run.json")],
                         LaunchOptions(2, timeout_s=600))
    if code != 0:
        raise SystemExit(f"the launch failed with exit code {code}")
    ref_losses, ref_params = reference_run(spec, steps, 2)
    rows = []
    for entry in entries:
        metrics = json.loads(Path(entry["metrics"]).read_text())
        stages = [torch.load(f) for f in sorted(Path(entry["params_dir"]).glob("stage-*.pt"))]
        params = {k: v for s in stages for k, v in s.items() if k in ref_params}
        tied = [k for k in ref_params if sum(k in s for s in stages) == 2]
        param_rel = max(float((params[k] - v).abs().max()) / float(v.abs().max())
                        for k, v in ref_params.items())
        copies = [float((stages[0][k] - stages[1][k]).abs().max()) for k in tied]
        rows.append({
            "schedule": entry["plan"]["pipeline"]["schedule"],
            "loss_rel": max(abs(a - b) / abs(b) for a, b in zip(metrics["losses"], ref_losses)),
            "param_rel": param_rel, "tied": ",".join(tied),
            "copies_diff": max(copies) if copies else float("nan"),
            "step_ms": 1e3 * metrics["measured"]["time_s"],
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--devices", type=int, default=16)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--run", action="store_true", help="also part 2: the 2-process runs")
    args = parser.parse_args(argv)
    print(f"priced: tied zoo GPT ({args.shape}), {args.devices} devices, 2 stages, 1F1B, "
          f"m={args.micro_batches}, each stage's data-parallel plan")
    print("| pricing | stage | blocks | tie | t per micro-batch ms | d ms | memory MiB |")
    print("|---|---|---|---|---|---|---|")
    for r in priced(args.shape, args.devices, args.micro_batches):
        label = "step T" if r["stage"] == "step" else r["stage"]
        print(f"| {r['pricing']} | {label} | {r['blocks']} | {r['ties']} | {r['t_ms']:.3f} | "
              f"{r['d_ms']:.3f} | {r['memory_mib']:.2f} |")
    if args.run:
        print("\nrun: tiny HF GPT-2 (tied), 2 gloo processes, pp=2, m=2, 3 steps, against one process")
        print("| schedule | largest loss rel. diff | largest parameter rel. diff | tied key | "
              "copies differ by | step ms |")
        print("|---|---|---|---|---|---|")
        for r in ran():
            print(f"| {r['schedule']} | {r['loss_rel']:.2e} | {r['param_rel']:.2e} | {r['tied']} | "
                  f"{r['copies_diff']:.1e} | {r['step_ms']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
