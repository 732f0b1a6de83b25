"""HuggingFace models: planning the example jobs, and the published large shapes on meta.

For each example job configs/jobs/hf-{gpt2,bert,llama,mistral}.yaml: wall time of planning at
1, 2 and 4 devices, plans per device count, and the 1-process memory the plan predicts against
what one process measures (saved activations + parameters, gradients, optimizer state). For each
published shape (GPT-2 XL, BERT-large, Llama-3-8B, Mistral-7B, ``tensoropt.models.hf.FULL_SIZE``):
capture on the meta device and the cost graph at 8 devices (h100x8, hierarchical space), timed.

Usage::

    .venv/bin/python benchmarks/hf_models.py [--skip-full-size]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODELS = ("gpt2", "bert", "llama", "mistral")
SEQ_LEN = {"gpt2-xl": 1024, "bert-large": 512, "llama-3-8b": 2048, "mistral-7b": 2048}


def plan_example(model: str) -> dict:
    """Plan one example job; measure its 1-process memory against the 1-device plan's prediction."""
    from tensoropt.config import load_job
    from tensoropt.executor.plan import ExecPlan
    from tensoropt.executor.spec import TrainSpec
    from tensoropt.planner import plan_job
    from tensoropt.plans import plan_file_text
    from tensoropt.training.trainer import Trainer

    job = load_job(REPO / "configs" / "jobs" / f"hf-{model}.yaml")
    start = time.perf_counter()
    frontier = plan_job(job).to_json()
    plan_s = time.perf_counter() - start
    one = frontier["frontiers"][0]["plans"][0]
    plan = ExecPlan.from_json(json.loads(plan_file_text(frontier, one["id"])))
    single = dataclasses.replace(job, devices=[1])
    measured = Trainer(TrainSpec.from_job(single, steps=1), plan, mode="interpret").train(1).memory_bytes
    return {"plan_s": plan_s, "plans": [len(f["plans"]) for f in frontier["frontiers"]],
            "predicted": one["memory_bytes"], "measured": measured}


def full_size(name: str) -> dict:
    """Capture a published shape on meta and build its cost graph at 8 devices; seconds of each."""
    from tensoropt.config import Job
    from tensoropt.configspace import configurations
    from tensoropt.configspace.configuration import Mesh
    from tensoropt.cost_graph import cost_graph
    from tensoropt.models.hf import FULL_SIZE
    from tensoropt.planner import capture_job, load_job_cluster

    factory, kwargs = FULL_SIZE[name]
    tokens = {"shape": [SEQ_LEN[name]], "dtype": "int64", "high": kwargs["vocab_size"]}
    job = Job.from_dict({"model": {"factory": f"tensoropt.models.hf:{factory}", "kwargs": kwargs,
                                   "inputs": {"input_ids": tokens, "labels": tokens}, "loss": "model"},
                         "cluster": "h100x8", "devices": [8], "training": {"global_batch_size": 8}})
    start = time.perf_counter()
    graph = capture_job(job)
    capture_s = time.perf_counter() - start
    cluster = load_job_cluster(job)
    configs = configurations(graph, Mesh.for_cluster(8, cluster.devices_per_node), whole_levels=True)
    cost_graph(graph, cluster, 8, batch_size=8, optimizer="adamw", configurations=configs)
    return {"capture_s": capture_s, "price_s": time.perf_counter() - start - capture_s,
            "nodes": graph.nx.number_of_nodes(), "params_b": graph.num_params() / 1e9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-full-size", action="store_true", help="only the example jobs")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'job':10s} {'plan 1,2,4 dev':>15s} {'plans':>14s} {'predicted B':>12s} {'measured B':>11s} "
          f"{'error':>7s}")
    for model in MODELS:
        r = plan_example(model)
        err = (r["measured"] / r["predicted"] - 1) * 100
        print(f"hf-{model:7s} {r['plan_s']:13.1f} s {str(r['plans']):>14s} {r['predicted']:12.0f} "
              f"{r['measured']:11d} {err:+6.2f}%")
    if args.skip_full_size:
        return
    print(f"\n{'shape':12s} {'params':>8s} {'nodes':>6s} {'capture':>9s} {'cost graph (8 dev)':>19s}")
    for name in SEQ_LEN:
        r = full_size(name)
        print(f"{name:12s} {r['params_b']:7.2f}B {r['nodes']:6d} {r['capture_s']:7.1f} s "
              f"{r['price_s']:17.1f} s")


if __name__ == "__main__":
    main()
