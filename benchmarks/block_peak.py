"""The process peak with and without whole-block checkpointing, against the memory model (issue 26 item 3).

For HF Llama, HF GPT-2 and the zoo GPT (4 layers of width 256, 256 tokens per sample, global batch
8, fp32, SGD with momentum: the optimizer steps in place), planned on 2 devices of cpu-local with
``training.memory_options: [block_recompute, block_selective]``, three plans of one split (data
parallel, ``batch=2``, where offered; the fastest plan's split elsewhere): plain, every block under
``block_recompute``, every block under ``block_selective``. Each trains ``--steps`` steps on 2 gloo
processes, in a launch of its own (no other plan's memory alive), and the table gives per process:

* ``memory``: the plan's predicted memory (the additive objective) and the executor's measured
  ``memory_bytes`` (the storages the plan owns: state and what backward keeps);
* ``transient``: the plan's largest recompute transient (a checkpointed block's activations
  rebuilt during its backward; :func:`estimators.breakdown.recompute_chains`);
* ``peak``: ``measured.peak_bytes`` (the resident set's high-water mark of the training loop above
  the process's level before the model was built) beside ``predicted.peak_bytes``
  (:mod:`estimators.peak`: memory + the larger of backward's transient and the optimizer step's,
  + the runtime's own memory);
* ``tensor peak``: ``measured.peak_tensor_bytes`` (the high-water mark of live tensor bytes in the
  first step) beside ``predicted.peak_tensor_bytes`` (the same model without the runtime's memory).

Usage (one command; about 10 minutes on 2 loaded cores)::

    .venv/bin/python benchmarks/block_peak.py [--steps 3] [--models llama gpt2 gpt] [--json OUT]
        [--precision fp32|bf16-mixed] [--zero3] [--mode replay|interpret]
        [--layers 4] [--width 256] [--seq 256] [--malloc glibc|peak]

``--malloc peak``: the workers' malloc as the memory benchmark sets it (``TENSOROPT_WORKER_MALLOC=peak``:
freed tensors over 128 KiB returned to the system), the setting the issue's resident-peak target names;
``glibc`` (default) leaves glibc's dynamic thresholds, under which freed tensors stay resident.

``--precision bf16-mixed --zero3``: the same in bf16 mixed precision with zero3 wherever offered (in
the plain plan too, so the block option is the only difference).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_peak import _run  # noqa: E402

SEQ = 256


def model_jobs(layers: int = 4, width: int = 256, seq: int = SEQ) -> dict:
    """Model name -> its ``model:`` section: ``layers`` layers of width ``width`` (4 heads; HF Llama's MLP
    2 x the width, 2 KV heads), ``seq`` tokens per sample, a 512-token vocabulary.

    Example:
        >>> model_jobs(2, 128, 64)["gpt"]["kwargs"]["width"]
        128
    """
    return {
        "llama": {"factory": "tensoropt.models.hf:llama",
                  "kwargs": {"num_hidden_layers": layers, "hidden_size": width, "num_attention_heads": 4,
                             "num_key_value_heads": 2, "intermediate_size": 2 * width, "vocab_size": 512,
                             "max_position_embeddings": seq},
                  "inputs": {"input_ids": {"shape": [seq], "dtype": "int64", "high": 512},
                             "labels": {"shape": [seq], "dtype": "int64", "high": 512}},
                  "loss": "model"},
        "gpt2": {"factory": "tensoropt.models.hf:gpt2",
                 "kwargs": {"n_layer": layers, "n_embd": width, "n_head": 4, "n_positions": seq,
                            "vocab_size": 512, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
                 "inputs": {"input_ids": {"shape": [seq], "dtype": "int64", "high": 512},
                            "labels": {"shape": [seq], "dtype": "int64", "high": 512}},
                 "loss": "model"},
        "gpt": {"name": "gpt", "kwargs": {"layers": layers, "width": width, "heads": 4, "seq_len": seq,
                                          "vocab_size": 512, "dropout": 0.0}},
    }


MODELS = model_jobs()
OPTIONS = ["block_recompute", "block_selective"]
VARIANTS = {"plain": "", "block_recompute": ",block_recompute", "block_selective": ",block_selective"}


def _job(name: str, precision: str = "fp32", zero3: bool = False, shape: tuple = (4, 256, SEQ)):
    from tensoropt.config import Job

    options = ["zero3", *OPTIONS] if zero3 else OPTIONS
    return Job.from_dict({"model": model_jobs(*shape)[name], "cluster": "cpu-local", "devices": [2],
                          "training": {"global_batch_size": 8, "optimizer": "momentum", "learning_rate": 0.01,
                                       "precision": precision, "memory_options": options, "seed": 0}})


def _with(cg, assignment: dict, suffix: str) -> dict:
    """``assignment`` with each node's configuration + ``suffix`` where the node offers it."""
    out = {}
    for n, i in assignment.items():
        labels = cg.nodes[n]["configs"]
        out[n] = labels.index(labels[i] + suffix) if suffix and labels[i] + suffix in labels else i
    return out


def plans(name: str, precision: str = "fp32", zero3: bool = False, shape: tuple = (4, 256, SEQ)) -> tuple:
    """(job, {variant: plan.json dict}) of one model: one split, plain and under each block option
    (``zero3``: every variant with zero3 wherever offered, the plain one too; ``shape``: layers, width,
    tokens per sample)."""
    import frontier
    from estimators.breakdown import plan_breakdown
    from tensoropt.planner import capture_job, job_cost_graph, load_job_cluster

    job = _job(name, precision, zero3, shape)
    cg = job_cost_graph(capture_job(job), job, load_job_cluster(job), 2)
    fastest = frontier.solve(cg)[0].assignment
    plain = {}
    for n, i in fastest.items():
        labels = cg.nodes[n]["configs"]
        split = ",".join(t for t in labels[i].split(",") if t not in OPTIONS and t != "zero3")
        plain[n] = labels.index("batch=2") if "batch=2" in labels else labels.index(split)
    if zero3:
        plain = _with(cg, plain, ",zero3")
    out = {}
    for variant, suffix in VARIANTS.items():
        a = _with(cg, plain, suffix)
        b = plan_breakdown(cg, a)
        out[variant] = {"id": variant, "devices": 2, "mesh": cg.graph["mesh"].to_json(), "job": job.to_dict(),
                        "time_s": b["time_s"], "memory_bytes": b["memory_bytes"], "layers": b["layers"],
                        "redistributions": b["redistributions"],
                        "placements": {n: cg.nodes[n]["configurations"][a[n]].to_json() for n in cg}}
    return job, out


def measure(steps: int, models: list[str], precision: str = "fp32", zero3: bool = False,
            mode: str = "replay", shape: tuple = (4, 256, SEQ), malloc: str = "glibc") -> list[dict]:
    """One row per (model, variant); ``malloc``: the workers' ``TENSOROPT_WORKER_MALLOC`` (``peak``:
    the memory benchmark's allocator settings, :data:`tensoropt.launch.WORKER_MALLOC`)."""
    from tensoropt.executor.job.spec import TrainSpec

    rows = []
    env = {"TENSOROPT_WORKER_MALLOC": malloc}
    with tempfile.TemporaryDirectory(prefix="block-peak-") as tmp:
        for name in models:
            job, docs = plans(name, precision, zero3, shape)
            spec = TrainSpec.from_job(job, steps=steps)
            for variant, doc in docs.items():
                m = _run(spec, doc, 2, steps, Path(tmp), name, mode, env)
                transient = max((r.get("recompute_chain_bytes", 0.0) for r in doc["layers"]), default=0.0)
                rows.append({"model": name, "plan": variant, "predicted_memory": doc["memory_bytes"],
                             "memory": m["measured"]["memory_bytes"], "transient": transient,
                             "peak": m["measured"]["peak_bytes"],
                             "predicted_peak": m["predicted"]["peak_bytes"],
                             "tensor_peak": m["measured"].get("peak_tensor_bytes", 0),
                             "predicted_tensor_peak": m["predicted"].get("peak_tensor_bytes", 0)})
    return rows


def _error(predicted: float, measured: float) -> str:
    return f"{(predicted - measured) / measured:+.1%}" if measured else "n/a"


def table(rows: list[dict]) -> str:
    """The markdown table of :func:`measure`'s rows (MiB per process)."""
    mib = 2**20
    lines = ["| model | plan | memory predicted / measured | transient | peak measured | predicted | error "
             "| tensor peak measured | predicted | error |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['plan']} | {r['predicted_memory'] / mib:.2f} / "
                     f"{r['memory'] / mib:.2f} | {r['transient'] / mib:.2f} | {r['peak'] / mib:.2f} "
                     f"| {r['predicted_peak'] / mib:.2f} "
                     f"| {_error(r['predicted_peak'], r['peak'])} | {r['tensor_peak'] / mib:.2f} "
                     f"| {r['predicted_tensor_peak'] / mib:.2f} "
                     f"| {_error(r['predicted_tensor_peak'], r['tensor_peak'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table and the load average, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--models", nargs="+", choices=tuple(MODELS), default=list(MODELS))
    parser.add_argument("--precision", choices=("fp32", "bf16-mixed"), default="fp32")
    parser.add_argument("--zero3", action="store_true", help="zero3 wherever offered, in every variant")
    parser.add_argument("--mode", choices=("replay", "interpret"), default="replay")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--seq", type=int, default=SEQ, help="tokens per sample")
    parser.add_argument("--malloc", choices=("glibc", "peak"), default="glibc",
                        help="the workers' TENSOROPT_WORKER_MALLOC (peak: the memory benchmark's settings)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    rows = measure(args.steps, args.models, args.precision, args.zero3, args.mode,
                   (args.layers, args.width, args.seq), args.malloc)
    print(table(rows))
    print(f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
