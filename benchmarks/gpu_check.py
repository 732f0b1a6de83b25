"""One GPU, one script (issue 28): tensoropt's CUDA path against plain PyTorch, and the device profile
calibrated from measurement.

For each model (HF GPT-2 medium; an HF Llama of about 1B parameters: 16 layers, width 2048, FFN
8192, 32 heads, 8 KV heads, vocabulary 32000, sequence 2048), bf16-mixed with AdamW on one device:

1. ``tensoropt plan`` at 1 device on the datasheet profile of the GPU found (``h200x8`` /
   ``h100x8``; ``cpu-local`` with ``--tiny``), roofline compute; the plan it selects is then priced
   again in this process with ``profiled`` compute (the operators timed on this GPU) and with the
   measured device profile (roofline over ``tensoropt calibrate --device``'s constants).
2. The ways of training it, one after the other, each in its own process (the GPU's memory and
   its allocator statistics start clean for each):

   * ``plain``: the module as users train it: fp32 parameters, ``torch.autocast(bfloat16)``,
     ``model(**batch).loss.backward()``, fused AdamW (:func:`plain_worker`);
   * ``replay``: ``tensoropt run --nproc 1 --executor replay`` (the traced local program);
   * ``interpret``: ``tensoropt run --nproc 1 --executor interpret`` (the DTensor interpreter);
   * ``api``: ``tensoropt run`` with ``training.max_grad_norm`` set, which trains through the
     ``tensoropt.parallelize`` loop (it clips: one norm more than the others compute);
   * ``inductor``: ``tensoropt run --nproc 1 --executor replay --compile inductor``.

   Each records the median step time (the warm-up steps left out), tokens/s, the MFU (the plan's
   FLOPs over the measured time and the dtype's datasheet peak), and the peak: on CUDA
   ``torch.cuda.max_memory_allocated`` above what was allocated before the model was built, beside
   tensoropt's predicted ``peak_bytes``.
3. ``tensoropt calibrate --device`` first (GEMMs per dtype, elementwise bandwidth, kernel launch):
   it writes ``<device>-measured.yaml`` into ``--out-dir``.

Everything is written to ``--out-dir/gpu_check.json`` after each item (a run cut short keeps what it
had), and one table is printed. A section that fails records its error and the others still run;
``--budget-s`` skips what would not finish in time. NCCL collectives need two GPUs: on one they are
not measured (the cluster profile prices them).

Usage (one command): ``python benchmarks/gpu_check.py [--tiny] [--out-dir DIR] [--budget-s 460]
[--models gpt2-medium,llama-1b] [--ways plain,replay,interpret,api,inductor] [--steps 10]``.
``--tiny`` runs tiny models on the CPU in about a minute (the tests run it).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent

MODELS = {
    "gpt2-medium": {"factory": "tensoropt.models.hf:gpt2",
                    "kwargs": {"n_layer": 24, "n_embd": 1024, "n_head": 16, "n_positions": 1024,
                               "vocab_size": 50257, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
                               "attn_pdrop": 0.0},
                    "seq": 1024, "vocab": 50257, "batch": 32},
    "llama-1b": {"factory": "tensoropt.models.hf:llama",
                 "kwargs": {"num_hidden_layers": 16, "hidden_size": 2048, "intermediate_size": 8192,
                            "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                            "max_position_embeddings": 2048},
                 "seq": 2048, "vocab": 32000, "batch": 8},
}
TINY_MODELS = {
    "gpt2-tiny": {"factory": "tensoropt.models.hf:gpt2",
                  "kwargs": {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 32, "vocab_size": 256,
                             "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
                  "seq": 32, "vocab": 256, "batch": 4},
    "llama-tiny": {"factory": "tensoropt.models.hf:llama",
                   "kwargs": {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
                              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
                              "max_position_embeddings": 32},
                   "seq": 32, "vocab": 256, "batch": 4},
}
WAYS = ("plain", "replay", "inductor", "interpret", "api")
WARMUP_STEPS = 2


def job_dict(model: dict, cluster: str, steps: int, precision: str = "bf16-mixed") -> dict:
    """The tensoropt job of one model at 1 device (a causal LM: labels are the inputs, ``loss: model``).

    Example:
        >>> job = job_dict(TINY_MODELS["gpt2-tiny"], "cpu-local", 3)
        >>> job["devices"], job["training"]["precision"], job["model"]["inputs"]["labels"]["shape"]
        ([1], 'bf16-mixed', [32])
    """
    ids = {"shape": [model["seq"]], "dtype": "int64", "high": model["vocab"]}
    return {"model": {"factory": model["factory"], "kwargs": dict(model["kwargs"]),
                      "inputs": {"input_ids": dict(ids), "labels": dict(ids)}, "loss": "model"},
            "training": {"global_batch_size": model["batch"], "optimizer": "adamw", "learning_rate": 1e-4,
                         "seed": 0, "steps": steps, "precision": precision},
            "cluster": cluster, "devices": [1], "select": "fastest"}


def plain_worker(job_file: str, steps: int, out: str) -> None:
    """Plain PyTorch on the job's module: fp32 parameters on the device, autocast to the compute dtype,
    ``model(**batch).loss.backward()``, fused AdamW (foreach on a CPU without fused kernels). Writes
    ``{"times_s", "peak_bytes", "device"}`` (peak: allocated above the level before the model)."""
    import importlib

    import torch

    job = yaml.safe_load(Path(job_file).read_text())
    module_name, function = job["model"]["factory"].split(":")
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    base = torch.cuda.memory_allocated(device) if cuda else 0
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    model = getattr(importlib.import_module(module_name), function)(**job["model"]["kwargs"]).to(device)
    model.train()
    try:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    except (RuntimeError, TypeError):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    spec = job["model"]["inputs"]["input_ids"]
    batch, seq = job["training"]["global_batch_size"], spec["shape"][0]
    compute = torch.bfloat16 if "bf16" in job["training"]["precision"] else torch.float32
    times = []
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        ids = torch.randint(0, spec["high"], (batch, seq), generator=g).to(device)
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=compute, enabled=compute != torch.float32):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated(device) - base) if cuda else None
    Path(out).write_text(json.dumps({"times_s": times, "peak_bytes": peak, "loss": float(loss)}))


class Check:
    """The results document, written after every item."""

    def __init__(self, out_dir: Path, budget_s: float):
        self.out_dir, self.budget_s, self.t0 = out_dir, budget_s, time.monotonic()
        self.doc: dict = {"models": {}, "errors": []}

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    def save(self) -> None:
        path = self.out_dir / "gpu_check.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc, indent=1, default=str))
        tmp.replace(path)

    def command(self, args: list[str], what: str, cap_s: float) -> tuple[int, str]:
        """Run ``python -m ...`` / a script in a process of its own; (return code, output tail)."""
        timeout = max(1.0, min(cap_s, self.left_s()))
        env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                   PYTHONUNBUFFERED="1")
        t0 = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=timeout)
            rc, text = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            rc, text = 124, f"timed out after {timeout:.0f} s: " + str((e.stdout or b"")[-2000:])
        print(f"[gpu_check] {what}: exit {rc} in {time.monotonic() - t0:.0f} s", flush=True)
        if rc != 0:
            self.doc["errors"].append({"what": what, "rc": rc, "tail": text[-3000:]})
        return rc, text


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _metrics_row(metrics: dict, flops: float | None, peak_flops: float, tokens: int) -> dict:
    steps = [s["time_s"] for s in metrics.get("steps", []) if s.get("time_s") is not None]
    kept = steps[WARMUP_STEPS:] or steps
    time_s = _median(kept) or metrics.get("measured", {}).get("time_s")
    meas, pred = metrics.get("measured", {}), metrics.get("predicted", {})
    return {"time_s": time_s, "tokens_per_s": tokens / time_s if time_s else None,
            "mfu": flops / time_s / peak_flops if flops and time_s else None,
            "peak_bytes": meas.get("peak_bytes"), "predicted_peak_bytes": pred.get("peak_bytes"),
            "predicted_peak_tensor_bytes": pred.get("peak_tensor_bytes"),
            "peak_tensor_bytes": meas.get("peak_tensor_bytes"), "predicted_time_s": pred.get("time_s"),
            "steps_s": steps}


def reprice(job_file: Path, plan: dict, clusters: dict) -> dict:
    """The plan's predicted (time_s, memory_bytes) under each ``label -> (cluster, compute mode)``.

    Example:
        >>> reprice  # priced in-process; see benchmarks/gpu_check.py's main  # doctest: +ELLIPSIS
        <function reprice at ...>
    """
    import dataclasses

    from tensoropt.baselines import plan_cost
    from tensoropt.config import load_job
    from tensoropt.planner import capture_job, job_cost_graph

    job = load_job(job_file)
    graph = capture_job(job)
    out = {}
    for label, (cluster, compute) in clusters.items():
        job_c = dataclasses.replace(job, planner=dataclasses.replace(job.planner, compute=compute))
        G = job_cost_graph(graph, job_c, cluster, 1)
        assignment = {n: G.nodes[n]["configs"].index(lbl) for n, lbl in plan["ops"].items() if n in G.nodes}
        missing = [n for n in G.nodes if n not in assignment]
        if missing:
            raise ValueError(f"plan has no label for {len(missing)} nodes, e.g. {missing[:3]}")
        total = plan_cost(G, assignment)
        out[label] = {"time_s": float(total[0]), "memory_bytes": float(total[1])}
    return out


def plan_model(check: Check, name: str, model: dict, base_cluster: str, measured_device: Path | None,
               steps: int) -> dict | None:
    """``tensoropt plan`` at 1 device, then the selected plan re-priced (profiled; the measured profile).
    Returns the model's context for :func:`run_way` (None when planning failed)."""
    from estimators.profiles import load_cluster, load_device

    row: dict = {"shape": model, "ways": {}}
    check.doc["models"][name] = row
    folder = check.out_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    job = job_dict(model, base_cluster, steps)
    job_file = folder / "job.yaml"
    job_file.write_text(yaml.safe_dump(job, sort_keys=False))
    rc, text = check.command(["-m", "tensoropt.cli", "plan", str(job_file), "--out", str(folder),
                              "--no-plot"], f"{name}: tensoropt plan", 300)
    plan_file = folder / "plan.json"
    if rc != 0 or not plan_file.exists():
        row["plan_error"] = text[-2000:]
        check.save()
        return None
    plan = json.loads(plan_file.read_text())
    cluster = load_cluster(base_cluster)
    peak_flops = cluster.device.peak_flops("bfloat16")
    flops = float(plan["mfu"]) * float(plan["time_s"]) * peak_flops if plan.get("mfu") else None
    tokens = model["batch"] * model["seq"]
    row.update({"plan_id": plan["id"], "summary": plan.get("summary"), "step_flops": flops,
                "tokens_per_step": tokens, "plan_time_s": plan.get("time_s"),
                "plan_memory_bytes": plan.get("memory_bytes")})
    clusters = {"roofline (datasheet)": (cluster, "roofline"), "profiled": (cluster, "profiled")}
    if measured_device is not None and measured_device.exists():
        import dataclasses

        clusters["roofline (measured profile)"] = (
            dataclasses.replace(cluster, device=load_device(str(measured_device))), "roofline")
    try:
        row["predicted"] = reprice(job_file, plan, clusters)
    except Exception as err:  # noqa: BLE001 - recorded; the runs still go
        row["predicted_error"] = f"{type(err).__name__}: {err}"[:2000]
    check.save()
    return {"row": row, "folder": folder, "job": job, "job_file": job_file, "plan_file": plan_file,
            "flops": flops, "peak_flops": peak_flops, "tokens": tokens, "steps": steps}


def run_way(check: Check, name: str, ctx: dict, way: str) -> None:
    """Train the model one way (its own process) and record the figures in its row."""
    row, folder, job_file = ctx["row"], ctx["folder"], ctx["job_file"]
    flops, peak_flops, tokens, steps = ctx["flops"], ctx["peak_flops"], ctx["tokens"], ctx["steps"]
    if check.left_s() < 20:
        row["ways"][way] = {"skipped": "budget"}
        check.save()
        return
    metrics_file = folder / f"{way}.metrics.json"
    if way == "plain":
        rc, text = check.command([str(Path(__file__).resolve()), "--plain", str(job_file), "--steps",
                                  str(steps), "--metrics", str(metrics_file)], f"{name}: {way}", 240)
        if rc == 0 and metrics_file.exists():
            m = json.loads(metrics_file.read_text())
            t = _median(m["times_s"][WARMUP_STEPS:] or m["times_s"])
            row["ways"][way] = {"time_s": t, "tokens_per_s": tokens / t, "steps_s": m["times_s"],
                                "mfu": flops / t / peak_flops if flops else None,
                                "peak_bytes": m["peak_bytes"], "loss": m["loss"]}
        else:
            row["ways"][way] = {"error": text[-1500:]}
        check.save()
        return
    run_job = job_file
    if way == "api":
        api_job = copy.deepcopy(ctx["job"])
        api_job["training"]["max_grad_norm"] = 1.0
        api_job["metrics"] = {"log_every": 1, "jsonl": str(folder / "api.metrics.jsonl")}
        run_job = folder / "job-api.yaml"
        run_job.write_text(yaml.safe_dump(api_job, sort_keys=False))
    extra = {"interpret": ["--executor", "interpret"],
             "inductor": ["--executor", "replay", "--compile", "inductor"]}.get(way, ["--executor", "replay"])
    rc, text = check.command(["-m", "tensoropt.cli", "run", str(run_job), "--plan", str(ctx["plan_file"]),
                              "--nproc", "1", "--steps", str(steps), "--metrics", str(metrics_file), *extra],
                             f"{name}: {way}", 300)
    if rc == 0 and way == "api" and (folder / "api.metrics.jsonl").exists():
        lines = [json.loads(x) for x in (folder / "api.metrics.jsonl").read_text().splitlines() if x]
        times = [x["time_s"] for x in lines]
        t = _median(times[WARMUP_STEPS:] or times)
        row["ways"][way] = {"time_s": t, "tokens_per_s": tokens / t, "steps_s": times,
                            "mfu": flops / t / peak_flops if flops else None,
                            "peak_bytes": max(x.get("peak_bytes") or 0 for x in lines) or None}
    elif rc == 0 and metrics_file.exists():
        row["ways"][way] = _metrics_row(json.loads(metrics_file.read_text()), flops, peak_flops, tokens)
    else:
        row["ways"][way] = {"error": text[-1500:]}
    check.save()


def print_table(doc: dict) -> None:
    """The table: per model and way, step time, x plain, tokens/s, MFU, peak against the prediction."""
    print(f"\ndevice: {doc.get('device', {}).get('name')}  torch {doc.get('device', {}).get('torch')}  "
          f"driver {doc.get('device', {}).get('driver')}")
    header = (f"{'model':<12}{'way':<10}{'step ms':>9}{'x plain':>8}{'tok/s':>10}{'MFU':>7}"
              f"{'peak GiB':>9}{'pred GiB':>9}{'err':>7}")
    print(header)
    for name, row in doc["models"].items():
        plain = row["ways"].get("plain", {}).get("time_s")
        for way, r in row["ways"].items():
            if "time_s" not in r or r["time_s"] is None:
                print(f"{name:<12}{way:<10}  {r.get('skipped') or 'failed'}")
                continue
            ratio = f"{r['time_s'] / plain:.3f}" if plain else "-"
            peak, pred = r.get("peak_bytes"), r.get("predicted_peak_bytes")
            err = f"{(pred - peak) / peak:+.1%}" if peak and pred else "-"
            mfu = f"{r['mfu']:.1%}" if r.get("mfu") else "-"
            print(f"{name:<12}{way:<10}{r['time_s'] * 1e3:>9.1f}{ratio:>8}{r['tokens_per_s']:>10.0f}{mfu:>7}"
                  f"{(peak or 0) / 2**30:>9.2f}{(pred or 0) / 2**30:>9.2f}{err:>7}")
        for label, p in row.get("predicted", {}).items():
            meas = row["ways"].get("replay", {}).get("time_s")
            err = f"{(p['time_s'] - meas) / meas:+.1%}" if meas else "-"
            print(f"{name:<12}predicted step, {label}: {p['time_s'] * 1e3:.1f} ms ({err} against replay)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny models on whatever device there is (the CPU)")
    p.add_argument("--out-dir", default="out/gpu_check")
    p.add_argument("--budget-s", type=float, default=460.0, help="stop starting new items after this")
    p.add_argument("--models", default=None, help="comma-separated names (default: all of the size)")
    p.add_argument("--ways", default=",".join(WAYS))
    p.add_argument("--steps", type=int, default=None, help="steps per way (default 8; 4 with --tiny)")
    p.add_argument("--no-calibrate", action="store_true")
    p.add_argument("--plain", default=None, help=argparse.SUPPRESS)
    p.add_argument("--metrics", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    steps = args.steps or (4 if args.tiny else 8)
    if args.plain:
        plain_worker(args.plain, steps, args.metrics)
        return 0
    from tensoropt.commands.calibrate_device import base_device_name, device_description

    out_dir = Path(args.out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TENSOROPT_CACHE", str(out_dir / "cache"))
    check = Check(out_dir, args.budget_s)
    desc = device_description()
    check.doc["device"] = desc
    base_cluster = {"h200-sxm-141gb": "h200x8", "h100-sxm-80gb": "h100x8"}.get(
        base_device_name(desc), "h100x8") if desc["kind"] == "gpu" else "cpu-local"
    check.doc["cluster"] = base_cluster
    check.save()
    measured = None
    if not args.no_calibrate:
        measured = out_dir / f"{base_device_name(desc)}-measured.yaml"
        rc, text = check.command(["-m", "tensoropt.cli", "calibrate", "--device", "--out", str(measured),
                                  *(["--tiny"] if args.tiny else [])], "calibrate --device", 120)
        check.doc["calibrate"] = text[-4000:]
        print(text, flush=True)
        check.save()
    catalogue = TINY_MODELS if args.tiny else MODELS
    names = args.models.split(",") if args.models else list(catalogue)
    ways = [w for w in args.ways.split(",") if w]
    bad = [w for w in ways if w not in WAYS] + [n for n in names if n not in catalogue]
    if bad:
        p.error(f"unknown way or model {bad}; ways: {', '.join(WAYS)}; models: {', '.join(catalogue)}")
    contexts = {name: plan_model(check, name, catalogue[name], base_cluster, measured, steps)
                for name in names}
    for way in ways:  # the ways in the order given (the first ones matter most), every model each
        for name in names:
            if contexts[name] is not None:
                run_way(check, name, contexts[name], way)
    check.doc["elapsed_s"] = time.monotonic() - check.t0
    check.save()
    print_table(check.doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
