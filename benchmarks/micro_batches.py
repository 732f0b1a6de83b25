"""Planned gradient accumulation (issue 25): the leanest plan with ``training.micro_batches: auto``
against today's (one micro-batch), on GPT-2 small and the Llama-3-8B shape on 8 H100.

Each case is planned twice in this process, the same job but for ``micro_batches`` (1, then auto),
and one table printed: per case the leanest plan's memory per device and step time, the count it
runs, the fastest plan's time (the same in both: one micro-batch), the counts the auto frontier
holds (plans per count) and the planning wall time.

Cases:

* ``gpt2-small``: the zoo GPT-2 small (124M, sequence 1024), global batch 64, fp32, AdamW, cluster
  h100x8, 8 devices, epsilon 0.01 (configs/jobs/gpt2-small.yaml on one node);
* ``llama3-8b``: HF ``LlamaForCausalLM`` with Llama-3-8B's shape (benchmarks/scale.py), sequence
  8192, global batch 16, bf16-mixed, AdamW, memory options recompute/zero1/zero2/zero3, h100x8, 8
  devices, planner defaults;
* ``llama3-8b-plain``: the same without memory options;
* ``llama3-8b-blocks``: the same with recompute/zero1/zero2/zero3 and the whole-block options
  block_recompute/block_selective.

Usage::

    .venv/bin/python benchmarks/micro_batches.py [--case gpt2-small --case llama3-8b]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale import LLAMA_8B  # noqa: E402

from tensoropt.config import Job  # noqa: E402
from tensoropt.planner import plan_job  # noqa: E402

GIB = 2**30


def _llama(options: list[str]) -> dict:
    vocab, seq = LLAMA_8B["vocab_size"], 8192
    return {"model": {"factory": "tensoropt.models.hf:llama", "kwargs": LLAMA_8B,
                      "inputs": {"input_ids": {"shape": [seq], "dtype": "int64", "high": vocab},
                                 "labels": {"shape": [seq], "dtype": "int64", "high": vocab}},
                      "loss": "model"},
            "training": {"global_batch_size": 16, "optimizer": "adamw", "precision": "bf16-mixed",
                         "memory_options": options},
            "cluster": "h100x8", "devices": [8], "memory_budget": "80GiB"}


CASES = {
    "gpt2-small": {"model": {"name": "gpt2-small", "task": "language_model", "seq_len": 1024,
                             "vocab_size": 50257},
                   "training": {"global_batch_size": 64, "optimizer": "adamw", "dtype": "float32"},
                   "cluster": "h100x8", "devices": [8], "memory_budget": "80GiB",
                   "planner": {"epsilon": 0.01}},
    "llama3-8b": _llama(["recompute", "zero1", "zero2", "zero3"]),
    "llama3-8b-plain": _llama([]),
    "llama3-8b-blocks": _llama(["recompute", "zero1", "zero2", "zero3", "block_recompute",
                                "block_selective"]),
}


def plan_case(name: str, micro_batches) -> tuple[list, float]:
    """(plans of the 8-device frontier, planning wall seconds) of one case and setting."""
    data = dict(CASES[name])
    data["training"] = dict(data["training"], micro_batches=micro_batches)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frontier = plan_job(Job.from_dict(data, name)).frontiers[0]
    return frontier.plans, time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES))
    args = parser.parse_args(argv)
    rows = []
    for name in args.case or ["gpt2-small", "llama3-8b", "llama3-8b-plain"]:
        one, one_s = plan_case(name, 1)
        auto, auto_s = plan_case(name, "auto")
        lean1 = min(one, key=lambda p: p.memory_bytes)
        lean = min(auto, key=lambda p: p.memory_bytes)
        counts = {}
        for p in auto:
            counts[p.micro_batches] = counts.get(p.micro_batches, 0) + 1
        rows.append([name, f"{lean1.memory_bytes / GIB:.2f}", f"{lean1.time_s * 1e3:.1f}",
                     f"{lean.memory_bytes / GIB:.2f}", f"{lean.time_s * 1e3:.1f}", lean.micro_batches,
                     f"{lean.memory_bytes / lean1.memory_bytes:.2f}",
                     f"{min(p.time_s for p in one) * 1e3:.1f} / {min(p.time_s for p in auto) * 1e3:.1f}",
                     " ".join(f"{m}:{n}" for m, n in sorted(counts.items())), f"{one_s:.0f} / {auto_s:.0f}"])
        print(f"{name}: leanest auto plan {lean.id}: {lean.summary}", flush=True)
        print("  " + " | ".join(map(str, rows[-1])), flush=True)  # each case as it ends (long runs)
    headers = ["case", "leanest GiB (m=1)", "its ms", "leanest GiB (auto)", "its ms", "its m", "ratio",
               "fastest ms (1 / auto)", "auto frontier m:plans", "plan s (1 / auto)"]
    from tensoropt.tables import format_table

    print(format_table(headers, rows, right=list(range(1, len(headers)))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
