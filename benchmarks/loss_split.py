"""The loss of HF ``loss: model`` at long context, per configuration (issue 26, item 2).

Captures the Llama-3-8B 32k job of issue 26 (benchmarks/scale.py's ``8b-32k`` case: HF
``LlamaForCausalLM`` on ``meta``, 32768 tokens, global batch 8, bf16-mixed, AdamW, h100x8, 8
devices) and prints, for every configuration the planner offers the cross-entropy node (HF's
``ForCausalLMLoss``: ``.float()``, flattened to ``[tokens, vocabulary]``, labels padded with -100),
its predicted memory per device (what it keeps for backward: the float32 softmax of its share of
the logits) and its time, beside the logits' total size over all devices. Whether the split is by
tokens (``batch``), by vocabulary (``out``) or both, each of the 8 devices keeps an eighth.

Usage::

    .venv/bin/python benchmarks/loss_split.py [--seq 32768] [--batch 8] [--devices 8]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import LLAMA_8B, job_dict  # noqa: E402

from tensoropt.config import Job  # noqa: E402
from tensoropt.planner import capture_job, job_cost_graph, load_job_cluster  # noqa: E402

GIB = 2**30


def loss_rows(seq: int, batch: int, devices: int) -> tuple[list[tuple[str, float, float]], tuple, float]:
    """(label, memory bytes, time s) of each configuration of the loss node; its logits' shape;
    planning seconds (capture + cost graph).

    Example:
        >>> rows, shape, _ = loss_rows(32768, 8, 8)  # about 90 s: the 8B model on meta  # doctest: +SKIP
        >>> shape  # doctest: +SKIP
        (262144, 128256)
    """
    job_data = job_dict(dict(LLAMA_8B, max_position_embeddings=seq), [devices], seq)
    job_data["training"].update(global_batch_size=batch)
    job_data["cluster"] = "h100x8"
    job = Job.from_dict(job_data)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = capture_job(job)
        G = job_cost_graph(graph, job, load_job_cluster(job), devices)
    elapsed_s = time.perf_counter() - start
    (loss,) = [n for n, d in graph.nx.nodes(data=True) if d["kind"] == "cross_entropy"]
    cost = G.nodes[loss]["cost"]
    rows = [(label, float(cost[i][1]), float(cost[i][0])) for i, label in enumerate(G.nodes[loss]["configs"])]
    return rows, tuple(graph.nx.nodes[loss]["inputs"][0]["shape"]), elapsed_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, default=32768)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--devices", type=int, default=8)
    args = parser.parse_args()
    rows, shape, elapsed_s = loss_rows(args.seq, args.batch, args.devices)
    total = shape[0] * shape[1] * 4
    print(f"loss logits {list(shape)} float32: {total / GIB:.1f} GiB over all devices, "
          f"{total / args.devices / GIB:.2f} GiB an {args.devices}th "
          f"(capture + cost graph {elapsed_s:.1f} s)")
    print("| loss configuration | memory per device | x total / devices | time |")
    print("|---|---|---|---|")
    for label, memory, time_s in sorted(rows, key=lambda r: r[1]):
        share = memory / (total / args.devices)
        print(f"| {label} | {memory / GIB:.2f} GiB | {share:.3f} | {time_s * 1e3:.2f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
