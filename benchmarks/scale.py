"""Planning at the scale of real models (issue 18): Llama-3-8B and -70B shapes, every memory option.

Writes a job per case (HF ``LlamaForCausalLM`` with the published shape, built on ``meta``:
nothing is allocated or downloaded), runs ``tensoropt plan`` on it in a subprocess with a time
limit, and prints one table: wall time of the whole command, the solver's peak memory (the
child's peak resident set), per device count the plans kept, the proven bound printed by the
planner, the fastest plan and the leanest plan's memory per device, and whether a plan fits the
budget.

Cases (all: global batch 64 x 2048 tokens, AdamW, bf16-mixed, cluster h100-128x8-ib, budget
80 GiB, memory options recompute, zero1, zero2, zero3, planner defaults):

* ``8b``: Llama-3-8B shape (32 layers, width 4096, 32 heads, 8 KV heads, FFN 14336, vocab 128256)
  on 8, 16, 32, 64 GPUs; target: < 60 s wall, <= 100 plans per count, a 64-GPU plan within 80 GiB,
  solver memory < 8 GiB;
* ``70b``: Llama-3-70B shape (80 layers, width 8192, 64 heads, 8 KV heads, FFN 28672) on 64, 128,
  256, 512 GPUs; target: < 5 minutes, a plan within 80 GiB at 512.
* ``8b-small``: the 8B shape with 4 layers (a quick check of the pipeline).
* ``8b-32k``, ``8b-8k`` (issue 26): the 8B shape at 32768 tokens (global batch 8) and 8192 tokens
  (global batch 16) on 8 H100 (h100x8) with ``block_recompute`` beside the four options; targets:
  a 32k plan within 80 GiB, the 8k leanest plan <= 40 GiB; ``-before``: without it;
  ``8b-32k-chunked``: the 32k case with ``chunked_loss`` too (the head + loss over chunks of
  2048 tokens, issue 26's loss at long context).
* ``7b-152k`` (issue 26's "other 7-8B shapes"): a Qwen2-7B shape as a Llama (28 layers, width
  3584, 28 heads, 4 KV heads, FFN 18944, vocab 152064) at 4096 tokens, global batch 64, on 8, 16,
  32, 64 H100 (h100-128x8-ib) with ``block_recompute``; target: under 60 s wall.

``--memory`` prints instead the memory model's components of the 8B shape
(benchmarks/memory_scale.py: two layers, one device, batch 1 x 2048, bf16-mixed, AdamW): per
layer parameters, gradients, optimizer state, saved activations and the recompute transient,
with and without recompute, and the largest items; docs/results.md compares them with a hand
derivation.

Usage (one command; ``--case`` repeats)::

    .venv/bin/python benchmarks/scale.py [--case 8b --case 70b] [--timeout-s 900] [--out /tmp/scale]
    .venv/bin/python benchmarks/scale.py --case 8b --set planner.epsilon=0   # any job field
    .venv/bin/python benchmarks/scale.py --memory
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent

LLAMA_8B = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
            "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
            "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-5}
LLAMA_70B = dict(LLAMA_8B, num_hidden_layers=80, hidden_size=8192, num_attention_heads=64,
                 intermediate_size=28672)
QWEN2_7B_AS_LLAMA = dict(LLAMA_8B, num_hidden_layers=28, hidden_size=3584, num_attention_heads=28,
                         num_key_value_heads=4, intermediate_size=18944, vocab_size=152064,
                         max_position_embeddings=4096, rope_theta=1000000.0, rms_norm_eps=1e-6)
SEQ_LEN = 2048

CASES = {
    "8b": (LLAMA_8B, [8, 16, 32, 64]),
    "70b": (LLAMA_70B, [64, 128, 256, 512]),
    "8b-small": (dict(LLAMA_8B, num_hidden_layers=4), [8, 16]),
}

BLOCK_OPTIONS = ["recompute", "zero1", "zero2", "zero3", "block_recompute"]
LONG_CASES = {  # issue 26: name -> (model kwargs, devices, tokens per sample, global batch, options)
    "8b-32k": (dict(LLAMA_8B, max_position_embeddings=32768), [8], 32768, 8, BLOCK_OPTIONS),
    "8b-32k-before": (dict(LLAMA_8B, max_position_embeddings=32768), [8], 32768, 8, BLOCK_OPTIONS[:4]),
    "8b-32k-chunked": (dict(LLAMA_8B, max_position_embeddings=32768), [8], 32768, 8,
                       [*BLOCK_OPTIONS, "chunked_loss"]),
    "8b-8k": (LLAMA_8B, [8], 8192, 16, BLOCK_OPTIONS),
    "8b-8k-before": (LLAMA_8B, [8], 8192, 16, BLOCK_OPTIONS[:4]),
    "7b-152k": (QWEN2_7B_AS_LLAMA, [8, 16, 32, 64], 4096, 64, BLOCK_OPTIONS),
}
"""Whole-block checkpointing at long context (issue 26; cluster h100x8, budget 80 GiB): targets a
32k plan within 80 GiB and an 8k plan of <= 40 GiB; ``-before``: without the block options."""


def job_dict(kwargs: dict, devices: list[int], seq_len: int = SEQ_LEN) -> dict:
    """The planning job of one case (see the module docstring)."""
    vocab = kwargs["vocab_size"]
    return {
        "model": {
            "factory": "tensoropt.models.hf:llama",
            "kwargs": kwargs,
            "inputs": {"input_ids": {"shape": [seq_len], "dtype": "int64", "high": vocab},
                       "labels": {"shape": [seq_len], "dtype": "int64", "high": vocab}},
            "loss": "model",
        },
        "training": {"global_batch_size": 64, "optimizer": "adamw", "precision": "bf16-mixed",
                     "memory_options": ["recompute", "zero1", "zero2", "zero3"]},
        "cluster": "h100-128x8-ib",
        "devices": devices,
        "memory_budget": "80GiB",
        "select": "fastest",
    }


def _set(job: dict, assignment: str) -> None:
    """Apply ``a.b.c=value`` (value parsed as YAML) to the job."""
    key, _, value = assignment.partition("=")
    *path, last = key.split(".")
    node = job
    for k in path:
        node = node.setdefault(k, {})
    node[last] = yaml.safe_load(value)


def run_case(name: str, out: Path, timeout_s: float, overrides: list[str]) -> dict:
    """Plan one case in a subprocess; return wall time, exit code, peak memory and the frontiers."""
    if name in LONG_CASES:
        kwargs, devices, seq_len, batch, options = LONG_CASES[name]
        job = job_dict(kwargs, devices, seq_len)
        job["training"].update(global_batch_size=batch, memory_options=options)
        job["cluster"] = "h100x8" if max(devices) <= 8 else "h100-128x8-ib"
    else:
        kwargs, devices = CASES[name]
        job = job_dict(kwargs, devices)
    for o in overrides:
        _set(job, o)
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    cmd = [sys.executable, "-m", "tensoropt.cli", "plan", str(path), "--out", str(folder),
           "--rows", "1", "--no-plot", "--quiet"]
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    before, cpu_before = usage.ru_maxrss, usage.ru_utime + usage.ru_stime
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=REPO,
                              env=dict(os.environ, PYTHONWARNINGS="ignore"))
        rc, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired:
        rc, text = None, ""
    wall_s = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak_kib, cpu_s = usage.ru_maxrss, usage.ru_utime + usage.ru_stime - cpu_before
    result = {"case": name, "wall_s": wall_s, "cpu_s": cpu_s, "rc": rc, "counts": [],
              "peak_gib": peak_kib / 2**20 if peak_kib > before else None}
    frontier = folder / "frontier.json"
    if rc in (0, 2) and frontier.exists():
        data = json.loads(frontier.read_text())
        for f in data["frontiers"]:
            plans = f["plans"]
            result["counts"].append({
                "devices": f["devices"], "plans": len(plans), "bound": f.get("epsilon_bound"),
                "fastest_s": min(p["time_s"] for p in plans) if plans else None,
                "leanest_gib": min(p["memory_bytes"] for p in plans) / 2**30 if plans else None,
                "timing_s": f.get("timing_s", {}),
            })
        result["bound_line"] = next((line for line in text.splitlines() if line.startswith("planned ")), "")
    else:
        result["error"] = text.strip().splitlines()[-3:] if text else ["timed out"]
    return result


def print_result(r: dict) -> None:
    """One case as a table."""
    status = "timed out" if r["rc"] is None else f"exit {r['rc']}"
    peak = f"{r['peak_gib']:.1f} GiB" if r["peak_gib"] else "-"
    print(f"case {r['case']}: {r['wall_s']:.1f} s wall ({r['cpu_s']:.1f} s CPU), {status}, "
          f"peak memory of the planner {peak}")
    if r.get("bound_line"):
        print(f"  {r['bound_line']}")
    if r["counts"]:
        print("  | devices | plans | bound | cost graph s | solve s | fastest step s "
              "| leanest GiB/device | fits 80 GiB |")
        print("  |---|---|---|---|---|---|---|---|")
        for c in r["counts"]:
            t = c["timing_s"]
            bound = "-" if c["bound"] is None else f"{100 * c['bound']:.2g} %"
            fits = "yes" if c["leanest_gib"] is not None and c["leanest_gib"] <= 80 else "no"
            print(f"  | {c['devices']} | {c['plans']} | {bound} | {t.get('cost_graph', 0):.1f} | "
                  f"{t.get('solve', 0):.1f} | {c['fastest_s']:.3f} | {c['leanest_gib']:.1f} | {fits} |")
    for line in r.get("error", []):
        print(f"  {line}")


def memory_check() -> None:
    """Print the memory model's components of the 8B shape (:mod:`memory_scale`, beside this file)."""
    from memory_scale import memory_check as check

    check()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--case", action="append", choices=sorted([*CASES, *LONG_CASES]),
                        help="default: 8b and 70b")
    parser.add_argument("--timeout-s", type=float, default=900)
    parser.add_argument("--out", default="/tmp/scale")
    parser.add_argument("--set", action="append", default=[],
                        help="job field override, e.g. planner.epsilon=0")
    parser.add_argument("--memory", action="store_true",
                        help="print the memory model's components instead")
    args = parser.parse_args()
    if args.memory:
        memory_check()
        return 0
    print(f"load: {os.getloadavg()[0]:.1f} (1-minute average) on {os.cpu_count()} cores")
    for name in args.case or ["8b", "70b"]:
        print_result(run_case(name, Path(args.out), args.timeout_s, args.set))
    return 0


if __name__ == "__main__":
    sys.exit(main())
