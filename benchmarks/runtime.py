"""The executor's runtime against DDP, model by model, at 2 gloo processes (issue 16's benchmark).

For each model (zoo ``gpt``, HuggingFace GPT-2 / BERT / Llama from small configs, a conv + batch
norm + pool + fc CNN, the big-fc MLP, the issue's pre-norm transformer block with an MSE loss) the
planner prices every configuration on ``--cluster`` (default ``cpu-local``) with profiled compute
and solves the exact frontier at 2 devices. Then one torchrun launch (2 processes, one thread
each) runs, per model, in interleaved rounds (each round ``--steps`` steps of every system, in a
rotated order, the first step of each round left out):

* ``ddp``: plain ``DistributedDataParallel`` on the same module, same global batch, AdamW;
* ``dp``: the data-parallel plan (every node ``batch=2``), replayed local program;
* ``fast``: the frontier's fastest predicted plan, replayed (when it is the data-parallel plan, it
  is not run twice: its figures are ``dp``'s, and the summary says so);
* ``sel``: the plan ``tensoropt select`` selects (rule ``fastest`` with the margin, issue 29: the
  simpler plan unless the fastest predicts a larger gain than the estimator's measured error for the
  model's family, ``configs/time_errors.yaml``); run apart only when it is neither ``dp`` nor ``fast``;
* ``fast-interp``: the same plan through the DTensor interpreter (the replay's speed-up);
* ``fast-inductor``: the same plan replayed and compiled by Inductor (``--compile``; models named
  by ``--compile-models``).

Printed per model: DP plan / DDP, fastest / DDP, replay vs interpreter speed-up, the replayed
program's node count and its host overhead per node against DDP ((replayed DP step - DDP step) /
program nodes), predicted vs measured step time of the plans run, and the compiled time; then the
per-round ratios (each round's median step time over DDP's in the same round, median [min, max]
over the rounds: the machine's drift between rounds cancels within a pair). The load average
before and after is printed with the figures (this machine is shared).

``--write-errors FILE`` adds the launch's error on each plan's predicted gain over the data-parallel
plan (:func:`gain_errors`) to that table per model family (``configs/time_errors.yaml``: the
margin ``select`` keeps); ``--errors-from JSON`` does the same from a launch's ``--json`` file.

Usage (one command): ``.venv/bin/python benchmarks/runtime.py [--models gpt,block,...] [--steps 5]
[--rounds 3] [--compile] [--compile-models big-fc,block] [--batch-norm synchronized|local] [--skip-interp]
[--margin auto] [--write-errors FILE]
[--json out.json]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
NPROC = 2
LR = 1e-3

MODELS = {
    # name: (TrainSpec model, kwargs, inputs [(shape, dtype, high)], global batch)
    "gpt": ("gpt", {"layers": 4, "width": 256, "heads": 4, "seq_len": 128, "vocab_size": 8192,
                    "dropout": 0.0}, [((128,), "int64", 8192), ((128,), "int64", 8192)], 8),
    "hf-gpt2": ("runtime_models:hf", {"kind": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 4,
                                      "vocab_size": 2048, "n_positions": 64, "resid_pdrop": 0.0,
                                      "embd_pdrop": 0.0, "attn_pdrop": 0.0},
                [((64,), "int64", 2048), ((64,), "int64", 2048)], 8),
    "hf-bert": ("runtime_models:hf", {"kind": "bert", "num_hidden_layers": 2, "hidden_size": 128,
                                      "num_attention_heads": 4, "intermediate_size": 512, "vocab_size": 2048,
                                      "max_position_embeddings": 64, "hidden_dropout_prob": 0.0,
                                      "attention_probs_dropout_prob": 0.0},
                [((64,), "int64", 2048), ((64,), "int64", 2048)], 8),
    "hf-llama": ("runtime_models:hf", {"kind": "llama", "num_hidden_layers": 2, "hidden_size": 128,
                                       "num_attention_heads": 4, "num_key_value_heads": 2,
                                       "intermediate_size": 256, "vocab_size": 2048,
                                       "max_position_embeddings": 64},
                 [((64,), "int64", 2048), ((64,), "int64", 2048)], 8),
    "cnn": ("runtime_models:cnn", {"channels": 32, "num_classes": 10, "image": 16},
            [((3, 16, 16), "float32", None), ((), "int64", 10)], 32),
    "big-fc": ("mlp", {"in_features": 1024, "hidden": [4096, 4096], "num_classes": 1024},
               [((1024,), "float32", None), ((), "int64", 1024)], 16),
    "block": ("runtime_models:block", {"width": 512, "heads": 8, "ffn": 2048},
              [((128, 512), "float32", None), ((128, 512), "float32", None)], 16),
}
"""The model set; the zoo ``gpt`` uses a vocabulary of 8192 (the preset's 50257 makes the head
dominate every plan on this CPU)."""


def spec_of(name: str, steps: int = 5, models: dict | None = None):
    """The :class:`TrainSpec` of model ``name`` of ``models`` (default :data:`MODELS`; AdamW, lr 1e-3,
    seed 0).

    Example:
        >>> spec_of("cnn").global_batch_size
        32
    """
    from tensoropt.executor.job.data import InputSpec
    from tensoropt.executor.job.spec import TrainSpec

    model, kwargs, inputs, batch = (MODELS if models is None else models)[name]
    return TrainSpec(model, tuple(InputSpec(s, d, h) for s, d, h in inputs), batch, dict(kwargs),
                     optimizer="adamw", lr=LR, steps=steps)


def plan_model(name: str, cluster: str, compute: str, batch_norm: str = "synchronized",
               margin: float | str | None = "auto", models: dict | None = None,
               keep_graph: bool = False) -> dict[str, dict]:
    """Plan documents of model ``name`` at 2 devices: ``dp`` (all ``batch=2``), ``fast`` (the
    frontier's fastest) and ``sel`` (what ``tensoropt select`` selects with ``margin``), each with its
    predicted ``time_s`` / ``memory_bytes``, and the frontier size. ``batch_norm``: the job's
    ``training.batch_norm`` the plans are priced for. ``same``: the fastest plan is the data-parallel
    plan (every node in the same configuration): it runs once, as ``dp``. ``selected``: which of
    ``dp``, ``fast`` or ``sel`` the selection is; ``selection``: its record (margin, family, gain)."""
    import frontier
    from tensoropt.baselines import data_parallel_assignment, plan_cost
    from tensoropt.capture import capture
    from tensoropt.capture.fingerprint import node_rows
    from tensoropt.cost_graph import cost_graph
    from tensoropt.executor.job.data import synthetic_batch
    from tensoropt.planner import attach_data_parallel, frontier_from_points
    from tensoropt.plans import FrontierFile
    from tensoropt.selector import select

    spec = spec_of(name, models=models)
    batch = synthetic_batch(list(spec.inputs), spec.global_batch_size, spec.seed, 0)
    graph = capture(spec.build_model(), batch)
    cg = cost_graph(graph, cluster, NPROC, batch_size=spec.global_batch_size, optimizer="adamw",
                    compute_mode=compute, batch_norm_stats=batch_norm)
    points = frontier.solve(cg)

    def doc(plan_id: str, assignment: dict) -> dict:
        total = plan_cost(cg, assignment)
        return {"id": plan_id, "devices": NPROC, "mesh": cg.graph["mesh"].to_json(),
                "time_s": float(total[0]), "memory_bytes": float(total[1]),
                "placements": {n: cg.nodes[n]["configurations"][c].to_json() for n, c in assignment.items()}}

    dp = data_parallel_assignment(cg)
    fastest = dict(min(points, key=lambda p: p.cost[0]).assignment)
    leanest = dict(min(points, key=lambda p: (p.cost[1], p.cost[0])).assignment)
    plans = frontier_from_points(cg, graph, sorted(points, key=lambda p: float(p.cost[0])),
                                 spec.global_batch_size)
    attach_data_parallel(plans, {1: (cg, graph)}, spec.global_batch_size)
    ff = FrontierFile(job={"cluster": cluster}, frontiers=[plans], graph={"nodes": node_rows(graph)})
    selection = select(ff, devices=NPROC, margin=margin)
    chosen = {n: cg.nodes[n]["configs"].index(label) for n, label in selection.plan.ops.items()}
    selected = "dp" if chosen == dp else "fast" if chosen == fastest else "sel"
    out = {"dp": doc("dp", dp), "fast": doc("fast", fastest), "lean": doc("lean", leanest),
           "frontier": len(points), "same": fastest == dp,
           "selected": selected, "selection": selection.to_json()}
    if selected == "sel":
        out["sel"] = doc("sel", chosen)
    if keep_graph:
        out["cost_graph"] = cg
    return out


def worker(options: dict) -> None:
    """torchrun entry: every system of every model, interleaved rounds; rank 0 writes the step times."""
    import torch.distributed as dist
    from executor_vs_ddp import ddp_round_s  # the same DDP step as the executor-vs-DDP benchmark
    from torch.nn.parallel import DistributedDataParallel

    from tensoropt.executor.job.plan import ExecPlan
    from tensoropt.executor.state.worker import end_process_group, init_process_group
    from tensoropt.training.trainer import Trainer

    init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    steps, rounds = options["steps"], options["rounds"]
    systems, kept, info, errors, aliases = [], {}, {}, {}, []
    per_round: dict[str, list[float]] = {}  # system -> median step ms of each round
    holders = []  # DDP modules: released before the process group
    for name, plans in options["plans"].items():
        spec = dataclasses.replace(spec_of(name, steps), batch_norm=options.get("batch_norm", "synchronized"))
        runs = [("dp", plans["dp"], "replay", "none"), ("fast", plans["fast"], "replay", "none")]
        if not options.get("skip_interp"):
            runs.append(("fast-interp", plans["fast"], "interpret", "none"))
        if plans.get("same"):  # one plan: its two samples would differ by the machine's noise only
            runs.pop(1)
            aliases.append((f"{name}/fast", f"{name}/dp"))
        if plans.get("selected") == "sel":  # the selection is neither: it runs too
            runs.append(("sel", plans["sel"], "replay", "none"))
        aliases.append((f"{name}/sel", f"{name}/{plans.get('selected', 'fast')}"))
        if name in options["compile_models"]:
            runs.append(("fast-inductor", plans["fast"], "replay", "inductor"))
        for label, plan_json, mode, backend in runs:
            key = f"{name}/{label}"
            try:
                trainer = Trainer(spec, ExecPlan.from_json(plan_json), mode=mode, compile=backend)
                trainer.train(2, start_step=0)  # warm-up: traces (and compiles) the program
            except Exception as err:  # noqa: BLE001 - a failing system is reported, the others still run
                errors[key] = f"{type(err).__name__}: {str(err)[:300]}"
                continue

            def one_round(r, key=key, trainer=trainer):
                res = trainer.train(steps, start_step=2 + r * steps)
                kept.setdefault(key, []).extend(s["time_s"] for s in res.steps[1:])
                per_round.setdefault(key, []).append(_median_ms([s["time_s"] for s in res.steps[1:]]))
                info[key] = trainer.runtime_info()
            systems.append((key, one_round))
        model = DistributedDataParallel(spec.build_model())
        opt = spec.make_optimizer(list(model.parameters()))
        holders.append((model, opt))

        def ddp_round(r, name=name, spec=spec, model=model, opt=opt):
            times = ddp_round_s(spec, model, opt, 2 + r * steps, steps, rank, world)
            kept.setdefault(f"{name}/ddp", []).extend(times[1:])
            per_round.setdefault(f"{name}/ddp", []).append(_median_ms(times[1:]))
        systems.append((f"{name}/ddp", ddp_round))
    for r in range(rounds):
        order = systems[r % len(systems):] + systems[:r % len(systems)]
        for _key, one_round in (order[::-1] if r % 2 else order):
            dist.barrier()
            one_round(r)
    for alias, source in aliases:
        for table in (kept, per_round, info):
            if source in table and alias != source:
                table[alias] = table[source]
    if rank == 0:
        Path(options["out"]).write_text(json.dumps({"times": kept, "per_round": per_round, "info": info,
                                                    "errors": errors}))
    systems.clear()
    holders.clear()
    dist.barrier()
    end_process_group()


def _launch(options: dict, out: Path) -> dict:
    from worker_launch import launch_workers

    return launch_workers(__file__, options, out, NPROC, timeout_s=7200)


def _median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1e3 if times else float("nan")


def main(argv: list[str] | None = None) -> int:
    """Plan every model, run the interleaved launch, print and optionally write the figures."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--steps", type=int, default=5, help="steps per system per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--cluster", default="cpu-local", help="cluster profile the plans are priced with")
    parser.add_argument("--compute", choices=("roofline", "profiled"), default="profiled")
    parser.add_argument("--compile", action="store_true",
                        help="also run the fastest plan compiled (Inductor)")
    parser.add_argument("--compile-models", default="big-fc,block",
                        help="models whose fastest plan is compiled with --compile")
    parser.add_argument("--batch-norm", choices=("synchronized", "local"), default="synchronized",
                        help="training.batch_norm of the executor's plans, priced so (plain DDP keeps each "
                             "rank's statistics: 'local' compares like with like)")
    parser.add_argument("--skip-interp", action="store_true",
                        help="do not run the fastest plan through the DTensor interpreter (shorter launches)")
    parser.add_argument("--margin", default="auto",
                        help="the selection's margin: 'auto' (configs/time_errors.yaml) or a fraction "
                             "(0: off)")
    parser.add_argument("--write-errors", default=None,
                        help="write this launch's step-time error per model family into this table "
                             "(configs/time_errors.yaml)")
    parser.add_argument("--errors-from", default=None,
                        help="with --write-errors: take the rows of this --json file of an earlier launch "
                             "instead of running one")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.errors_from:
        if not args.write_errors:
            parser.error("--errors-from needs --write-errors FILE")
        saved = json.loads(Path(args.errors_from).read_text())
        table = write_errors(Path(args.write_errors), saved["rows"], saved.get("cluster", args.cluster),
                             f"benchmarks/runtime.py --errors-from {Path(args.errors_from).name} "
                             f"({saved.get('source', '')})")
        print(f"wrote {args.write_errors}: default {table.default_error:.1%}")
        return 0
    margin = args.margin if args.margin == "auto" else float(args.margin)
    sys.path.insert(0, str(HERE))
    torch.set_num_threads(1)
    start = time.perf_counter()
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f"--models: unknown {unknown}; choose from {', '.join(MODELS)}")
    plans, plan_errors = {}, {}
    for name in names:
        try:
            plans[name] = plan_model(name, args.cluster, args.compute, batch_norm=args.batch_norm,
                                     margin=margin)
        except Exception as err:  # noqa: BLE001 - report and go on with the other models
            plan_errors[name] = f"{type(err).__name__}: {str(err)[:300]}"
            continue
        print(f"planned {name}: {plans[name]['frontier']} frontier plans, fastest predicted "
              f"{plans[name]['fast']['time_s'] * 1e3:.1f} ms, dp {plans[name]['dp']['time_s'] * 1e3:.1f} ms; "
              f"selected {plans[name]['selected']} ({_margin_text(plans[name]['selection'])}) "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
    compile_models = [m for m in args.compile_models.split(",") if m] if args.compile else []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        got = _launch({"plans": plans, "steps": args.steps, "rounds": args.rounds,
                       "compile_models": compile_models, "skip_interp": args.skip_interp,
                       "batch_norm": args.batch_norm}, Path(tmp))
    load_after = os.getloadavg()
    t = {k: _median_ms(v) for k, v in got["times"].items()}
    rows = []
    print(f"\n{'model':9} {'DDP ms':>8} {'DP ms':>8} {'DP/DDP':>7} {'fast ms':>8} {'fast/DDP':>8} "
          f"{'interp ms':>9} {'replay x':>8} {'nodes':>6} {'us/node':>8} {'pred fast':>9} {'pred DP':>8} "
          f"{'inductor':>8}")
    for name in plans:
        ddp, dp, fast = t.get(f"{name}/ddp"), t.get(f"{name}/dp"), t.get(f"{name}/fast")
        interp, ind = t.get(f"{name}/fast-interp"), t.get(f"{name}/fast-inductor")
        nodes = got["info"].get(f"{name}/dp", {}).get("nodes")
        row = {"model": name, "ddp_ms": ddp, "dp_ms": dp, "fast_ms": fast, "interp_ms": interp,
               "inductor_ms": ind, "dp_over_ddp": dp / ddp if dp and ddp else None,
               "fast_over_ddp": fast / ddp if fast and ddp else None,
               "replay_speedup": interp / fast if interp and fast else None, "dp_nodes": nodes,
               "overhead_us_per_node": (dp - ddp) * 1e3 / nodes if dp and ddp and nodes else None,
               "predicted_fast_ms": plans[name]["fast"]["time_s"] * 1e3,
               "predicted_dp_ms": plans[name]["dp"]["time_s"] * 1e3,
               "fast_summary": _summary(plans[name]["fast"]) + (" (the DP plan)" if plans[name].get("same")
                                                                  else ""),
               "dp_over_ddp_rounds": _paired(got.get("per_round", {}), f"{name}/dp", f"{name}/ddp"),
               "fast_over_ddp_rounds": _paired(got.get("per_round", {}), f"{name}/fast", f"{name}/ddp"),
               "selected": plans[name]["selected"], "selection": plans[name]["selection"],
               "sel_ms": t.get(f"{name}/sel"),
               "sel_over_ddp": t[f"{name}/sel"] / ddp if t.get(f"{name}/sel") and ddp else None,
               "sel_over_ddp_rounds": _paired(got.get("per_round", {}), f"{name}/sel", f"{name}/ddp"),
               "predicted_sel_ms": plans[name][plans[name]["selected"]]["time_s"] * 1e3,
               "family": plans[name]["selection"]["margin"]["family"]
               if plans[name]["selection"].get("margin") else ""}
        if plans[name]["selected"] == "sel":
            row["fast_summary"] += f"; selected: {_summary(plans[name]['sel'])}"
        rows.append(row)

        def f(v, fmt="8.1f"):
            return format(v, fmt) if isinstance(v, (int, float)) and v == v else "-".rjust(int(fmt[0]))
        print(f"{name:9} {f(ddp)} {f(dp)} {f(row['dp_over_ddp'], '7.2f')} {f(fast)} "
              f"{f(row['fast_over_ddp'], '8.2f')} {f(interp, '9.1f')} {f(row['replay_speedup'], '8.2f')} "
              f"{f(nodes, '6d') if nodes else '     -'} {f(row['overhead_us_per_node'], '8.1f')} "
              f"{f(row['predicted_fast_ms'], '9.1f')} {f(row['predicted_dp_ms'])} {f(ind)}")
    errs = [abs(r[m] - r[p]) / r[p] for r in rows for m, p in _measured_pairs(r)
            if r[m] and r[p] and r[m] == r[m]]
    print("\nselected plan / DDP (the margin rule, issue 29): " + "; ".join(
        f"{r['model']} {r['selected']} {_f2(r['sel_over_ddp'])} "
        f"(per round {_spread(r['sel_over_ddp_rounds'])}; "
        f"{_margin_text(r['selection'])})" for r in rows))
    print("\nper-round ratios (each round's median over DDP's in the same round; median [min, max] over "
          "rounds): " + "; ".join(f"{r['model']} DP {_spread(r['dp_over_ddp_rounds'])}, fastest "
                                  f"{_spread(r['fast_over_ddp_rounds'])}" for r in rows))
    print("\nfastest plans: " + "; ".join(f"{r['model']}: {r['fast_summary']}" for r in rows))
    if errs:
        print(f"time prediction: median |measured - predicted| / predicted over the {len(errs)} plans run: "
              f"{statistics.median(errs):.0%}")
    for key, err in {**plan_errors, **got["errors"]}.items():
        print(f"FAILED {key}: {err}")
    print(f"load average (1, 5, 15 min) before {' '.join(f'{x:.2f}' for x in load_before)}, after "
          f"{' '.join(f'{x:.2f}' for x in load_after)}; {args.rounds} rounds x {args.steps} steps "
          f"(medians over {args.rounds * (args.steps - 1)} steps per system); "
          f"{time.perf_counter() - start:.0f} s")
    source = (f"benchmarks/runtime.py --steps {args.steps} --rounds {args.rounds} "
              f"--batch-norm {args.batch_norm}, "
              f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, "
              f"load {load_before[0]:.1f}-{load_after[0]:.1f}")
    print("error on the predicted gain over DP: " + "; ".join(
        f"{r['model']} {', '.join(f'{e:.1%}' for e in gain_errors(r)) or '-'}" for r in rows))
    if args.write_errors:
        table = write_errors(Path(args.write_errors), rows, args.cluster, source)
        print(f"wrote {args.write_errors}: " + ", ".join(
            f"{f} {e.error:.1%} ({e.plans} plans)" for f, e in table.clusters.get(args.cluster, {}).items())
            + f"; default {table.default_error:.1%}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "errors": {**plan_errors, **got["errors"]},
                                               "load_before": load_before, "load_after": load_after,
                                               "steps": args.steps, "rounds": args.rounds, "source": source,
                                               "batch_norm": args.batch_norm,
                                               "cluster": args.cluster, "compute": args.compute}, indent=2))
    return 0


def _measured_pairs(row: dict) -> list[tuple[str, str]]:
    """(measured, predicted) keys of the distinct plans a row ran: DP, the fastest unless it is DP, the
    selected plan when it is neither.

    Example:
        >>> _measured_pairs({"selected": "dp", "fast_summary": "batch=2 x3 (the DP plan)"})
        [('dp_ms', 'predicted_dp_ms')]
    """
    pairs = [("dp_ms", "predicted_dp_ms")]
    if not row.get("fast_summary", "").endswith("(the DP plan)"):
        pairs.append(("fast_ms", "predicted_fast_ms"))
    if row.get("selected") == "sel":
        pairs.append(("sel_ms", "predicted_sel_ms"))
    return pairs


def gain_errors(row: dict) -> list[float]:
    """The estimator's error on the gain of each plan a row ran over its data-parallel plan:
    ``|(measured / measured DP) / (predicted / predicted DP) - 1|``, for the fastest (unless it is
    DP) and the selected plan (when it is neither). A ratio of two plans timed in one launch: what
    the machine's load and the profiled cache's scale do to every plan alike cancels, what is left is
    the error of the predicted difference, the quantity the selection margin weighs.

    Example:
        >>> gain_errors({"dp_ms": 20.0, "predicted_dp_ms": 10.0, "fast_ms": 22.0, "predicted_fast_ms": 10.0,
        ...              "fast_summary": "out=2 x1", "selected": "fast"})
        [0.1]
    """
    dp, pdp = row.get("dp_ms"), row.get("predicted_dp_ms")
    if not dp or not pdp or dp != dp:
        return []
    out = []
    for m, p in _measured_pairs(row)[1:]:
        if row.get(m) and row.get(p) and row[m] == row[m]:
            out.append(round(abs((row[m] / dp) / (row[p] / pdp) - 1), 9))
    return out


MAX_SOURCES = 4
"""Launches a family's ``source`` names (the newest last, ``; ``-joined): its samples come from them."""


def write_errors(path: Path, rows: list[dict], cluster: str, source: str):
    """Merge this launch's gain errors per family (:func:`gain_errors`) into the table at ``path``:
    each family keeps its last :data:`estimators.time_errors.MAX_SAMPLES` samples, its error their
    median, and the launches they came from (its ``source``, the last :data:`MAX_SOURCES`); other
    clusters and families are kept; ``default_error``: the median of every sample in the table.
    Returns the table.

    Example:
        >>> import tempfile
        >>> rows = [{"model": "m", "family": "mlp", "selected": "fast", "fast_summary": "out=2 x1",
        ...          "dp_ms": 20.0, "predicted_dp_ms": 10.0, "fast_ms": 11.0, "predicted_fast_ms": 5.0}]
        >>> t = write_errors(Path(tempfile.mkdtemp()) / "e.yaml", rows, "cpu-local", "test")
        >>> round(t.clusters["cpu-local"]["mlp"].error, 6), t.clusters["cpu-local"]["mlp"].plans
        (0.1, 1)
        >>> write_errors(Path(t.path), rows, "cpu-local", "again").clusters["cpu-local"]["mlp"].source
        'test; again'

    """
    import yaml

    from estimators.time_errors import MAX_SAMPLES, FamilyError, TimeErrors, load_time_errors

    old = load_time_errors(path) if path.is_file() else TimeErrors()
    per_family: dict[str, list[float]] = {}
    models: dict[str, list[str]] = {}
    for r in rows:
        errs = gain_errors(r)
        if errs and r.get("family"):
            per_family.setdefault(r["family"], []).extend(errs)
            models.setdefault(r["family"], [])
            if r["model"] not in models[r["family"]]:
                models[r["family"]].append(r["model"])
    if not per_family:
        return old
    clusters = {c: dict(f) for c, f in old.clusters.items()}
    for family, errs in per_family.items():
        before = clusters.get(cluster, {}).get(family)
        samples = (tuple(before.samples) if before else ()) + tuple(errs)
        samples = samples[-MAX_SAMPLES:]
        names = tuple(dict.fromkeys((*(before.models if before else ()), *models[family])))
        sources = [*(before.source.split("; ") if before and before.source else ()), source]
        clusters.setdefault(cluster, {})[family] = FamilyError(
            statistics.median(samples), len(samples), names,
            "; ".join(list(dict.fromkeys(sources))[-MAX_SOURCES:]), samples)
    every = [x for fams in clusters.values() for e in fams.values() for x in (e.samples or (e.error,))]
    table = TimeErrors(statistics.median(every), clusters, str(path))
    header = ("# The estimator's measured error on a plan's gain over data parallelism, per model family\n"
              "# and cluster: the margin `tensoropt select` keeps (estimators/time_errors.py). Written by\n"
              "# benchmarks/runtime.py --write-errors; default_error: the median of every sample here.\n")
    path.write_text(header + yaml.safe_dump(table.to_dict(), sort_keys=False))
    return table


def _margin_text(selection: dict) -> str:
    """The margin and gain of a selection record, short.

    Example:
        >>> _margin_text({"margin": {"fraction": 0.08, "family": "lm"}, "gain": 0.02})
        'lm margin 8.0 %, fastest gain 2.0 %'
    """
    m = selection.get("margin")
    if not m:
        return "no margin"
    text = f"{m.get('family') or 'given'} margin {100 * m['fraction']:.1f} %"
    gain = selection.get("gain")
    return text + (f", fastest gain {100 * gain:.1f} %" if gain is not None else "")


def _f2(value) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) and value == value else "-"


def _paired(per_round: dict[str, list[float]], system: str, baseline: str) -> list[float]:
    """``system``'s median step time over ``baseline``'s, round by round (the rounds where both ran).

    Example:
        >>> _paired({"a": [2.0, 3.0], "ddp": [2.0, 2.0]}, "a", "ddp")
        [1.0, 1.5]
    """
    pairs = zip(per_round.get(system, []), per_round.get(baseline, []))
    return [a / b for a, b in pairs if a == a and b == b and b > 0]


def _spread(ratios: list[float]) -> str:
    """``median [min, max]`` of per-round ratios, or ``-`` when there are none.

    Example:
        >>> _spread([0.9, 1.1, 1.0])
        '1.00 [0.90, 1.10]'
    """
    if not ratios:
        return "-"
    return f"{statistics.median(ratios):.2f} [{min(ratios):.2f}, {max(ratios):.2f}]"


def _summary(plan: dict) -> str:
    """The distinct configuration labels of a plan, most used first (e.g. ``batch=2 x14, out=2 x2``)."""
    counts: dict[str, int] = {}
    for conf in plan["placements"].values():
        label = conf.get("label", "?") if isinstance(conf, dict) else "?"
        counts[label] = counts.get(label, 0) + 1
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


if __name__ == "__main__":
    from worker_launch import run_worker_if_asked

    run_worker_if_asked(worker)
    sys.exit(main())
