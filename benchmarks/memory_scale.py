"""The memory model's components of the Llama-3-8B shape, for the hand derivation in docs/results.md.

HF ``LlamaForCausalLM`` with the 8B shape and two layers, built on ``meta``, bf16-mixed, AdamW,
one device, batch 1 x 2048 tokens (what one GPU holds per layer under 64-way data parallelism).
Two plans of the cost graph (``replicate`` everywhere): without recompute, and with every
operator of the decoder layers that offers ``recompute`` recomputing. For each, the memory per
layer as ``tensoropt explain`` groups it (:mod:`tensoropt.commands.explain_memory`): parameters
(with the bf16 copies kept), gradients, optimizer state, saved activations, the recompute
chain's transient; then the largest items of layer 0 and outside the layers.

``--tiny``: the same model of the tiny HF Llama job against measurement on the CPU (saved
storages of the exported program; what HF's layer checkpointing keeps).

Usage (one command, about 20 s; ``benchmarks/scale.py --memory`` runs the same)::

    .venv/bin/python benchmarks/memory_scale.py [--tiny]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

MIB = 2.0**20


def _plans(G):
    """(plain, recompute in the layers) assignments: node -> configuration index."""
    plain = {n: G.nodes[n]["configs"].index("replicate") for n in G}
    inner = dict(plain)
    for n in G:
        labels = G.nodes[n]["configs"]
        if ".layers." in (G.nodes[n].get("module") or "") and "replicate,recompute" in labels:
            inner[n] = labels.index("replicate,recompute")
    return plain, inner


def _table(title: str, groups) -> None:
    print(f"\n{title}\n")
    print("| layer | ops | parameters | gradients | optimizer | activations | recompute transient | memory |")
    print("|---|---|---|---|---|---|---|---|")
    for m in groups:
        print(f"| {m.layer} | {m.operators} | {m.param_bytes / MIB:.1f} | {m.grad_bytes / MIB:.1f} | "
              f"{m.optimizer_bytes / MIB:.1f} | {m.activation_bytes / MIB:.2f} | "
              f"{m.recompute_bytes / MIB:.1f} | {m.memory_bytes / MIB:.1f} |")


def memory_check() -> None:
    """Print the tables (see the module docstring), in MiB."""
    from scale import LLAMA_8B, job_dict

    from estimators.breakdown import plan_breakdown
    from tensoropt.commands.explain_memory import layer_of, memory_by_layer
    from tensoropt.config import Job
    from tensoropt.cost_graph import cost_graph
    from tensoropt.planner import capture_job, resolve_job
    from tensoropt.summary import plan_layers

    job = job_dict(dict(LLAMA_8B, num_hidden_layers=2), [1])
    job.update(cluster="h100x8",
               training=dict(job["training"], global_batch_size=1, memory_options=["recompute"]))
    graph = capture_job(resolve_job(Job.from_dict(job)))
    G = cost_graph(graph, "h100x8", 1, batch_size=1, optimizer="adamw", memory_options=["recompute"],
                   precision="bf16-mixed")
    plain, inner = _plans(G)
    titles = ("no recompute", "every recomputable operator of the layers recomputed")
    for title, plan in zip(titles, (plain, inner)):
        rows, _ = plan_layers(G, graph, plan)
        _table(f"{title} (MiB per device)", memory_by_layer(rows))
        b = plan_breakdown(G, plan)
        print(f"\nplan memory {b['memory_bytes'] / MIB:.1f} MiB, largest recompute chain "
              f"{b['recompute_transient_bytes'] / MIB:.1f} MiB")
    nodes = graph.nx.nodes
    largest = max(G, key=lambda n: _out_bytes(nodes[n]))
    print(f"largest single activation: {largest} ({nodes[largest]['op']}) output "
          f"{_out_bytes(nodes[largest]) / MIB:.1f} MiB")
    print("\n| node or edge | where | op | no recompute MiB | recomputed MiB |")
    print("|---|---|---|---|---|")
    items = []
    for n, p, r in zip(G, _activations(G, plain), _activations(G, inner)):
        items.append((p, r, n, G.nodes[n]["op"], G.nodes[n].get("module", "")))
    for u, v in G.edges:
        a = G.edges[u, v]["memory_bytes"]
        items.append((a[plain[u], plain[v]], a[inner[u], inner[v]], f"{u} -> {v}", G.nodes[v]["op"],
                      G.nodes[v].get("module", "")))
    for p, r, name, op, module in sorted(items, key=lambda x: -x[0]):
        where = layer_of(module)
        if not where.endswith("layers.1") and max(p, r) >= 0.05 * MIB:
            print(f"| {name} | {where} | {op} | {p / MIB:.2f} | {r / MIB:.2f} |")


def _out_bytes(d: dict) -> float:
    n = 1
    for s in d.get("out_shape") or ():
        n *= s
    from estimators.memory import itemsize

    return n * itemsize(str(d.get("out_dtype", "float32")))


def _activations(G, plan: dict) -> list[float]:
    """Each node's saved activations (memory minus its parameters, gradients, optimizer state)."""
    out = []
    for n in G:
        d, i = G.nodes[n], plan[n]
        state = d["param_bytes"][i] + d["grad_bytes"][i] + d["optimizer_bytes"][i]
        out.append(float(d["memory_bytes"][i] - state))
    return out


def tiny_check() -> None:
    """The model against measurement on the tiny HF Llama of configs/jobs/hf-llama.yaml (CPU, batch 2):
    saved activations of the exported program (unique storages) and, with recompute, what
    ``gradient_checkpointing_enable(use_reentrant=False)`` over each decoder layer keeps."""
    import dataclasses
    import warnings

    import torch

    from estimators.breakdown import plan_breakdown
    from estimators.measure import measure_model_memory
    from tensoropt.capture import capture
    from tensoropt.config import load_job
    from tensoropt.cost_graph import cost_graph
    from tensoropt.job_model import build_job_model
    from tensoropt.models import example_inputs

    warnings.simplefilter("ignore")
    job = load_job(Path(__file__).resolve().parent.parent / "configs" / "jobs" / "hf-llama.yaml")
    print("| precision | measured, exported program | model | with every layer checkpointed (HF, measured) "
          "| model, recompute in the layers: kept | + largest recompute chain |")
    print("|---|---|---|---|---|---|")
    for precision in ("fp32", "bf16-mixed"):
        training = dataclasses.replace(job.training, precision=precision, dtype=None, global_batch_size=2)
        torch.manual_seed(0)
        model, spec = build_job_model(dataclasses.replace(job, training=training), "cpu")
        inputs = example_inputs(spec, 2, device="cpu", model=model)
        if precision != "fp32":
            model = model.to(torch.bfloat16)
        graph = capture(model, inputs)
        G = cost_graph(graph, "cpu-local", 1, precision=precision, memory_options=["recompute"])
        kept = []
        for plan in _plans(G):
            b = plan_breakdown(G, plan)
            saved = sum(x["activation_bytes"] for x in b["layers"]) + sum(
                r["memory_bytes"] for r in b["redistributions"])
            kept.append((saved, b["recompute_transient_bytes"]))
        measured = measure_model_memory(graph.program.module(), inputs, "sgd")["saved"]
        hf = next(m for m in model.modules() if hasattr(m, "gradient_checkpointing_enable"))
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        hf.train()
        checkpointed = measure_model_memory(model, inputs, "sgd")["saved"]
        print(f"| {precision} | {measured} B | {kept[0][0]:.0f} B | {checkpointed} B | {kept[1][0]:.0f} B "
              f"| {kept[1][1]:.0f} B |")


if __name__ == "__main__":
    if "--tiny" in sys.argv:
        tiny_check()
    else:
        memory_check()
