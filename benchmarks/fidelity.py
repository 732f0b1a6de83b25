"""The cost model's fidelity per model family at realistic widths (issue 29 item 4), 2 gloo processes.

One model per family, width 256, as its library makes it (``benchmarks/runtime_models.py``):

* ``decoder``: HF GPT-2, 2 layers x 256, 4 heads, sequence 128, vocabulary 2048;
* ``encoder``: HF BERT, 2 layers x 256, 4 heads, FFN 1024, sequence 128, vocabulary 2048;
* ``vit``: HF ViT, 2 layers x 256, 4 heads, FFN 1024, 32 x 32 images in 4 x 4 patches, 10 classes;
* ``cnn``: HF ResNet (basic blocks, convolutions with skips and batch norm, max pooling), stem 64,
  stages of 256 and 512 channels, 32 x 32 images, 10 classes.

Each is priced on ``--cluster`` with ``--compute`` (profiled by default) and its exact frontier
solved at 2 devices; the data-parallel, fastest and leanest plans (each distinct one once) run in
one torchrun launch of 2 processes (one thread each), every plan of every model in interleaved
rounds (rotated order, reversed every other round). Each round's first step runs through the
interpreter and measures the tensor peak (``measured.peak_tensor_bytes``); the others are timed
(the median over rounds is the measured step). Printed per plan: predicted and measured step time and
their error, predicted (``predicted_peak_bytes(runtime=False)``) and measured tensor peak and their
error; per family the median time error and the worst peak error; the load average before and after.

``--ops``: also where the time goes, per operator class (GEMM, attention, convolution, batch norm,
pooling, normalisation, elementwise, collectives, optimizer, ...): the priced compute and
communication of the plan's operators (``estimators.breakdown.plan_breakdown``, grouped by the
captured op) against ``torch.profiler``'s self CPU time of the replayed step's aten operators
(forward and backward together) on rank 0, per step.

``--node-clock``: also where the main thread's CPU goes, per aten op of the replayed program
(:func:`clocked_steps`): each node of the local program timed on the thread's CPU clock
(``time.thread_time``, which the host's load does not inflate), the optimizer's part beside it (the
gradients handed to the parameters, ``optimizer.step()``, ``zero_grad``:
:mod:`tensoropt.training.optimizer_clock`), and the rest of the step's main-thread CPU (the loop's own
Python, the batch); per operator class against the priced classes, with the optimizer and the
executor's per-operator overhead apart.

``--comm-clock``: also each collective of the replayed step, on both ranks' clocks
(:mod:`comm_clock`): its issue, its overlap with compute, rank 0's wait until the last rank issued it
(the sync point) and from then to the wait's end (the collective itself), against its price; per kind
and size class. ``--reprice``'s *before* column is the estimator before commfid's sync point
(:func:`before_cluster`).

``--plans dp,lean``: run only those of each model's distinct plans. ``--plan-cache FILE``: the planned
plans are read from FILE where it exists (no re-planning: the same plans for every launch), else
written to it. ``--live-set``: rank 0 also prints what is alive at each plan's measured tensor peak
(the largest storages, the operator and the graph node that made each:
:attr:`tensoropt.executor.state.tensor_peak.TensorPeak.peak_live`).

Usage (one command): ``.venv/bin/python benchmarks/fidelity.py [--models decoder,encoder,vit,cnn]
[--plans dp,fast,lean] [--steps 4] [--rounds 3] [--ops] [--node-clock] [--comm-clock] [--live-set]
[--plan-cache plans.json] [--reprice] [--json out.json]``.
"""

from __future__ import annotations

import argparse
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
WIDTH = 256
_LM = {"vocab_size": 2048}
MODELS = {
    # name: (TrainSpec model, kwargs, inputs [(shape, dtype, high)], global batch)
    "decoder": ("runtime_models:hf", {"kind": "gpt2", "n_layer": 2, "n_embd": WIDTH, "n_head": 4,
                                      "n_positions": 128, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
                                      "attn_pdrop": 0.0, **_LM},
                [((128,), "int64", 2048), ((128,), "int64", 2048)], 8),
    "encoder": ("runtime_models:hf", {"kind": "bert", "num_hidden_layers": 2, "hidden_size": WIDTH,
                                      "num_attention_heads": 4, "intermediate_size": 4 * WIDTH,
                                      "max_position_embeddings": 128, "hidden_dropout_prob": 0.0,
                                      "attention_probs_dropout_prob": 0.0, **_LM},
                [((128,), "int64", 2048), ((128,), "int64", 2048)], 8),
    "vit": ("runtime_models:hf_image", {"architecture": "ViTForImageClassification", "hidden_size": WIDTH,
                                        "num_hidden_layers": 2, "num_attention_heads": 4,
                                        "intermediate_size": 4 * WIDTH, "image_size": 32, "patch_size": 4,
                                        "num_labels": 10, "hidden_dropout_prob": 0.0,
                                        "attention_probs_dropout_prob": 0.0},
            [((3, 32, 32), "float32", None), ((), "int64", 10)], 8),
    "cnn": ("runtime_models:hf_image", {"architecture": "ResNetForImageClassification", "embedding_size": 64,
                                        "hidden_sizes": [WIDTH, 2 * WIDTH], "depths": [1, 1],
                                        "layer_type": "basic", "num_labels": 10},
            [((3, 32, 32), "float32", None), ((), "int64", 10)], 8),
}
"""One model per family of the issue's fidelity target (decoder LM, encoder LM, ViT, CNN with batch norm)."""

OP_CLASSES = (
    ("collective", ("c10d", "gloo", "wait_tensor", "all_reduce", "all_gather", "reduce_scatter",
                    "all_to_all", "broadcast")),
    ("optimizer", ("_fused_adam", "_foreach", "adamw", "lerp", "addcdiv", "addcmul")),
    ("attention", ("scaled_dot_product", "_flash_attention", "_efficient_attention", "softmax")),
    ("convolution", ("convolution", "conv2d", "conv1d", "mkldnn_conv", "_slow_conv", "thnn_conv")),
    ("batch norm", ("batch_norm", "_native_batch_norm", "native_batch_norm", "batch_norm_backward")),
    ("pooling", ("pool", "max_pool", "avg_pool")),
    ("layer norm", ("layer_norm",)),
    ("GEMM", ("mm", "addmm", "bmm", "baddbmm", "linear", "matmul")),
    ("embedding / loss", ("embedding", "nll_loss", "log_softmax", "cross_entropy", "gather", "scatter",
                          "index")),
    ("copy / layout", ("copy", "clone", "cat", "contiguous", "_to_copy", "split", "view", "reshape",
                       "transpose", "permute", "expand", "t", "slice", "select", "empty", "zeros", "fill")),
)
"""Operator classes, first match wins (substring of the aten or captured op name); the rest is
``elementwise / other``."""


KIND_CLASSES = {"linear": "GEMM", "matmul": "GEMM", "conv2d": "convolution", "batch_norm": "batch norm",
                "pool": "pooling", "adaptive_pool": "pooling", "layer_norm": "layer norm",
                "rms_norm": "layer norm", "group_norm": "layer norm", "sdpa": "attention",
                "softmax": "attention", "embedding": "embedding / loss", "cross_entropy": "embedding / loss",
                "log_softmax": "embedding / loss", "cat": "copy / layout", "stack": "copy / layout",
                "pad": "copy / layout", "broadcast": "copy / layout"}
"""A captured operator's kind (``tensoropt.capture.ops``) -> its class in :data:`OP_CLASSES`' terms."""


def op_class(name: str) -> str:
    """The operator class of an aten / profiler op name (:data:`OP_CLASSES`).

    Example:
        >>> op_class("aten::convolution_backward"), op_class("aten.addmm.default"), op_class("aten::gelu")
        ('convolution', 'GEMM', 'elementwise / other')
    """
    if "::" in name:  # a profiler key (aten::addmm)
        base = name.split("::")[-1].split(".")[0].lower()
    else:  # a captured op (aten.addmm.default)
        parts = name.split(".")
        base = (parts[1] if parts[0] == "aten" and len(parts) > 1 else parts[0]).lower()
    full = name.lower()
    for cls, keys in OP_CLASSES:
        if cls == "collective" and any(k in full for k in keys):
            return cls
        if cls == "GEMM" and base in keys:
            return cls
        if cls == "copy / layout" and base.rstrip("_") in keys or cls == "copy / layout" and base.startswith(
                ("_to_copy", "copy", "clone", "empty", "zeros", "new_", "as_strided", "unsafe")):
            return cls
        if cls not in ("GEMM", "copy / layout") and any(k in base for k in keys):
            return cls
    return "elementwise / other"


def priced_classes(cg, assignment: dict) -> dict[str, float]:
    """Priced seconds per step of a plan by operator class: each operator's compute (forward and
    backward) under its class, its optimizer step under ``optimizer``, its communication and every
    redistribution under ``collective``.

    Example:
        >>> # not run here: needs a cost graph (see main)
        >>> priced_classes(cg, plan_assignment)["GEMM"]  # doctest: +SKIP
        0.0123
    """
    from estimators.breakdown import configuration_index, plan_breakdown

    b = plan_breakdown(cg, assignment)
    out: dict[str, float] = {"optimizer": 0.0}
    for layer in b["layers"]:
        cls = KIND_CLASSES.get(layer["kind"], "elementwise / other")
        d = cg.nodes[layer["node"]]
        i = configuration_index(cg, layer["node"], assignment[layer["node"]])
        step = float(d["step_compute_s"][i]) if "step_compute_s" in d else 0.0  # the optimizer's part
        out[cls] = out.get(cls, 0.0) + layer["compute_s"] - step
        out["optimizer"] += step
        out["collective"] = out.get("collective", 0.0) + layer["comm_s"]
    out["collective"] = out.get("collective", 0.0) + sum(e["comm_s"] for e in b["redistributions"])
    out["total"] = b["time_s"]
    return out


def worker(options: dict) -> None:
    """torchrun entry: every plan of every model in interleaved rounds; rank 0 writes the figures."""
    import torch.distributed as dist
    from runtime import spec_of

    from tensoropt.executor.job.plan import ExecPlan
    from tensoropt.executor.state.peak_memory import predicted_peak_bytes
    from tensoropt.executor.state.worker import end_process_group, init_process_group
    from tensoropt.training.trainer import Trainer

    init_process_group()
    rank = dist.get_rank()
    steps, rounds = options["steps"], options["rounds"]
    systems, times, peaks, predicted_peaks, errors, ops = [], {}, {}, {}, {}, {}
    cpu_times: dict[str, list[float]] = {}  # the process's CPU seconds per timed step (all threads)
    thread_times: dict[str, list[float]] = {}  # the main thread's CPU seconds per timed step
    op_rows: dict[str, dict] = {}  # per aten op: (self CPU s per step, calls per step), rank 0
    unloaded: dict[str, list[float]] = {}  # wall seconds less the main thread's run delay, per step
    from micro_batch_time import run_delay_s
    live_sets: dict[str, str] = {}
    sum_form_peaks: dict[str, int | None] = {}
    peak_moments: dict[str, str] = {}
    trackers = _trace_peaks() if options.get("live_set") else None
    for name, plans in options["plans"].items():
        spec = spec_of(name, steps, MODELS)
        for label in plans["run"]:
            key = f"{name}/{label}"
            try:
                trainer = Trainer(spec, ExecPlan.from_json(plans[label]), mode="replay")
                trainer.train(2, start_step=0)  # warm-up: traces the program
                predicted_peaks[key] = predicted_peak_bytes(trainer, runtime=False)
                sum_form_peaks[key] = _sum_form_peak(trainer)
                peak_moments[key] = _peak_moment(trainer)
            except Exception as err:  # noqa: BLE001 - a failing plan is reported, the others still run
                errors[key] = f"{type(err).__name__}: {str(err)[:300]}"
                continue

            def one_round(r, key=key, trainer=trainer):
                clocks = [(time.process_time(), time.thread_time(), run_delay_s())]

                def tick(_done):  # the CPU clocks at the end of each step (after its log line)
                    clocks.append((time.process_time(), time.thread_time(), run_delay_s()))

                res = trainer.train(steps, start_step=2 + r * steps,  # step 0 of each call: the tensor peak
                                    after_step=tick)
                times.setdefault(key, []).extend(s["time_s"] for s in res.steps[1:])
                cpu_times.setdefault(key, []).extend(b[0] - a[0] for a, b in zip(clocks[1:-1], clocks[2:]))
                thread_times.setdefault(key, []).extend(b[1] - a[1] for a, b in zip(clocks[1:-1], clocks[2:]))
                delays = [b[2] - a[2] for a, b in zip(clocks[1:-1], clocks[2:])]
                # the step without the time its main thread waited runnable for a core (the host's load)
                unloaded.setdefault(key, []).extend(s["time_s"] - d for s, d in zip(res.steps[1:], delays))
                peaks.setdefault(key, []).append(res.peak_tensor_bytes)
                if trackers:
                    from tensoropt.executor.state.peak_memory import largest_activation_bytes
                    from tensoropt.executor.state.tensor_peak import live_set_table

                    mib, memory = 2**20, trainer.plan.predicted.get("memory_bytes", 0)
                    parts = (f"predicted memory_bytes {memory / mib:.2f} MiB, measured (state + saved) "
                             f"{res.memory_bytes / mib:.2f}, largest activation "
                             f"{largest_activation_bytes(trainer.ep.graph, trainer.plan) / mib:.2f}, "
                             f"tensor peak {res.peak_tensor_bytes / mib:.2f}\n")
                    live_sets[key] = parts + live_set_table(trackers[-1].peak_live, top=40)

            systems.append((key, one_round, trainer))
    for r in range(rounds):
        order = systems[r % len(systems):] + systems[:r % len(systems)]
        for _key, one_round, _t in (order[::-1] if r % 2 else order):
            dist.barrier()
            one_round(r)
    clocked: dict[str, dict] = {}
    if options.get("node_clock"):
        for key, _fn, trainer in systems:
            dist.barrier()
            clocked[key] = clocked_steps(trainer, options["ops_steps"], 2000)
    comm_clocked: dict[str, dict] = {}
    if options.get("comm_clock"):
        from comm_clock import comm_clocked_steps

        for key, _fn, trainer in systems:
            dist.barrier()
            comm_clocked[key] = comm_clocked_steps(trainer, options["ops_steps"], 3000)
    if options.get("ops"):
        from torch.profiler import ProfilerActivity, profile

        for key, _fn, trainer in systems:
            dist.barrier()
            n = options["ops_steps"]
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                walls = [trainer.step(1000 + i, measure_memory=False)[1] for i in range(n)]
            table: dict[str, float] = {}
            rows: dict[str, list[float]] = {}
            for e in prof.key_averages():
                if e.key.startswith(("aten::", "c10d::", "_c10d_functional::", "gloo:")):
                    cls = op_class(e.key)
                    table[cls] = table.get(cls, 0.0) + e.self_cpu_time_total / 1e6 / n
                    rows[e.key] = [e.self_cpu_time_total / 1e6 / n, e.count / n, cls]
            op_rows[key] = rows
            table["step (wall, profiled)"] = statistics.median(walls)
            ops[key] = table
    if rank == 0:
        Path(options["out"]).write_text(json.dumps({"times": times, "peaks": peaks, "ops": ops,
                                                    "cpu_times": cpu_times, "thread_times": thread_times,
                                                    "unloaded": unloaded,
                                                    "op_rows": op_rows, "clocked": clocked,
                                                    "comm_clocked": comm_clocked,
                                                    "predicted_peaks": predicted_peaks, "errors": errors,
                                                    "sum_form_peaks": sum_form_peaks,
                                                    "peak_moments": peak_moments,
                                                    "live_sets": live_sets}))
    systems.clear()
    dist.barrier()
    end_process_group()


def _target_name(target) -> str:
    """A program node's target as the profiler names it (``aten::addmm``, ``_c10d_functional::wait_tensor``).

    Example:
        >>> import torch
        >>> _target_name(torch.ops.aten.addmm.default)
        'aten::addmm'
    """
    name = getattr(target, "name", None)
    if callable(name):  # an OpOverload: "aten::addmm.default" -> "aten::addmm"
        return str(name()).split(".")[0]
    return getattr(target, "__name__", str(target))


def clocked_steps(trainer, steps: int, start: int) -> dict:
    """Run ``steps`` steps of ``trainer`` with every node of its replayed program timed on the main
    thread's CPU clock: ``{"ops": {target: [CPU s, calls, output bytes] per step}, "by_shape":
    {"target [operand shapes]": [CPU s, calls] per step}, "optimizer_s", "step_s", "optimizer_parts"}``
    (medians over the steps of the whole step's main-thread CPU seconds
    and of the optimizer's part as the cost model prices it: the gradients handed to the parameters,
    ``optimizer.step()`` with its hooks and ``zero_grad``, each in ``optimizer_parts``:
    :class:`tensoropt.training.optimizer_clock.OptimizerClock`). Empty when the trainer has no
    replayed program. Both ranks run it (the program's collectives); the fx interpreter's own Python
    runs outside the timed spans.

    Example:
        >>> clocked_steps(trainer, 3, 2000)["optimizer_s"]  # needs a process group  # doctest: +SKIP
        0.0031
    """
    import torch.fx as fx

    from tensoropt.training.optimizer_clock import PARTS, OptimizerClock

    program = getattr(trainer.graph, "program", None)
    if program is None or not program.programs:
        return {}
    acc: dict[str, list[float]] = {}
    by_shape: dict[str, list[float]] = {}  # "target [operand shapes]" -> [CPU s, calls]

    class Clocked(fx.Interpreter):
        def call_function(self, target, args, kwargs):  # the call alone: not the interpreter's lookups
            t0 = time.thread_time()
            out = super().call_function(target, args, kwargs)
            dt = time.thread_time() - t0
            row = acc.setdefault(_target_name(target), [0.0, 0.0, 0.0])
            row[0] += dt
            row[1] += 1
            row[2] += out.nbytes if isinstance(out, torch.Tensor) else 0  # what it wrote (its output)
            shapes = [list(a.shape) for a in args if isinstance(a, torch.Tensor)]
            row = by_shape.setdefault(f"{_target_name(target)} {shapes}", [0.0, 0.0])
            row[0] += dt
            row[1] += 1
            return out

    saved = dict(program.programs)
    for key, (lowered, call) in saved.items():
        program.programs[key] = (lowered, lambda *a, call=call: Clocked(call).run(*a))
    step_s = []
    try:
        with OptimizerClock(trainer) as clock:
            for i in range(steps):
                t0 = time.thread_time()
                trainer.step(start + i, measure_memory=False)
                step_s.append(time.thread_time() - t0)
    finally:
        program.programs.update(saved)
    return {"ops": {k: [v[0] / steps, v[1] / steps, v[2] / steps] for k, v in acc.items()},
            "by_shape": {k: [v[0] / steps, v[1] / steps] for k, v in by_shape.items()},
            "optimizer_s": clock.median("optimizer_s"),
            "optimizer_parts": {p: clock.median(p) for p in PARTS if p != "program_s"},
            "step_s": statistics.median(step_s)}


def _peak_moment(trainer) -> str:
    """The moment of the step where the step-order prediction peaks (``forward <node>``, ``turn``,
    ``backward <node>``, ``end of backward``, ``optimizer step``; ``-`` without the plan's rows)."""
    from tensoropt.peak_transients import plan_peak_moments

    if not trainer.plan.layers:
        return "-"
    moments = plan_peak_moments(trainer.ep.graph, trainer.plan, getattr(trainer, "operands", None) or {},
                                trainer.spec.optimizer, "gpu" if trainer.device.type == "cuda" else "cpu")
    return max(moments, key=lambda m: m[1])[0]


def _sum_form_peak(trainer) -> int | None:
    """The prediction without the plan's rows: ``memory_bytes`` plus the largest transient (the sum
    form, :func:`estimators.peak.predicted_peak_bytes`), for the before/after columns of one launch."""
    import dataclasses

    from tensoropt.executor.state.peak_memory import predicted_peak_bytes

    plan = trainer.plan
    trainer.plan = dataclasses.replace(plan, layers=(), redistributions=())
    try:
        return predicted_peak_bytes(trainer, runtime=False)
    finally:
        trainer.plan = plan


def _trace_peaks() -> list:
    """Make every measured step's tensor tracker keep its live set at the peak, each storage labelled
    with the interpreter's node that made it; returns the list the trackers are appended to."""
    from tensoropt.executor.program import interpreter
    from tensoropt.executor.state.tensor_peak import TensorPeak
    from tensoropt.training import measure

    trackers: list = []
    current = {"node": ""}
    run_node = interpreter.PlanInterpreter.run_node

    def labelled(self, n):
        current["node"] = n.name
        return run_node(self, n)

    class Traced(TensorPeak):
        def __init__(self, baseline_bytes: int = 0):
            super().__init__(baseline_bytes, trace=True)
            self.where = lambda: current["node"]
            trackers.append(self)

    interpreter.PlanInterpreter.run_node = labelled
    measure.TensorPeak = Traced
    return trackers


def distinct_plans(plans: dict) -> list[str]:
    """The labels of ``dp``, ``fast`` and ``lean`` whose placements differ (each plan runs once).

    Example:
        >>> distinct_plans({"dp": {"placements": {"a": 1}}, "fast": {"placements": {"a": 1}},
        ...                 "lean": {"placements": {"a": 2}}})
        ['dp', 'lean']
    """
    out: list[str] = []
    for label in ("dp", "fast", "lean"):
        if all(plans[label]["placements"] != plans[o]["placements"] for o in out):
            out.append(label)
    return out


def add_rows(name: str, plans: dict) -> None:
    """Give each plan document of model ``name`` that has none the operator and edge rows a plan.json
    carries (``layers``, ``redistributions``: the executor's step-order peak walks them), from a
    roofline cost graph (memory does not depend on the compute timings; a cached plan's labels)."""
    from runtime import spec_of

    from tensoropt.capture import capture
    from tensoropt.cost_graph import cost_graph
    from tensoropt.executor.job.data import synthetic_batch
    from tensoropt.summary import plan_layers

    todo = [label for label in plans["run"] if "layers" not in plans[label]]
    if not todo:
        return
    spec = spec_of(name, models=MODELS)
    batch = synthetic_batch(list(spec.inputs), spec.global_batch_size, spec.seed, 0)
    graph = capture(spec.build_model(), batch)
    cg = cost_graph(graph, "cpu-local", NPROC, batch_size=spec.global_batch_size, optimizer="adamw",
                    compute_mode="roofline", batch_norm_stats="synchronized")
    for label in todo:
        placements = plans[label]["placements"]
        assignment = {n: cg.nodes[n]["configs"].index(c["label"]) for n, c in placements.items()}
        layers, moves = plan_layers(cg, graph, assignment)  # as plan.json writes them
        plans[label]["layers"] = [layer.to_json() for layer in layers]
        plans[label]["redistributions"] = [move.to_json() for move in moves]


BEFORE_SYNC_POINT_S = 2.535e-03
"""``configs/devices/cpu.yaml``'s ``sync_point_s`` before commfid (2026-11-28): the per-sync slope less the
all-reduce's idle price, measured at load 2.4-3.1 (the load's slowing of the collective itself)."""


def before_cluster(cluster: str):
    """``cluster`` as the estimator priced it before commfid: every blocking collective's sync point at
    :data:`BEFORE_SYNC_POINT_S` (where the device prices sync points at all).

    Example:
        >>> before_cluster("cpu-local").device.sync_point_s
        0.002535
    """
    import dataclasses

    from estimators.profiles import load_cluster

    cl = load_cluster(cluster)
    if not cl.device.sync_point_s:
        return cl
    return dataclasses.replace(cl, device=dataclasses.replace(cl.device, sync_point_s=BEFORE_SYNC_POINT_S))


def reprice(name: str, plans: dict, cluster: str, compute: str, clock: str | None = None,
            before: bool = False) -> dict:
    """Price each plan of model ``name`` that runs (``plans["run"]``) with the current estimator:
    ``{label: priced classes}`` (:func:`priced_classes`, ``"total"`` its step seconds). ``clock``: the
    profiled timer's (None: the device's; ``"wall"``: the estimator before the thread clock, read from
    the wall-clock means a thread-clock timing files beside its own). ``before``: the estimator before
    commfid's sync points (:func:`before_cluster`)."""
    from runtime import spec_of

    from tensoropt.capture import capture
    from tensoropt.cost_graph import cost_graph
    from tensoropt.executor.job.data import synthetic_batch

    spec = spec_of(name, models=MODELS)
    batch = synthetic_batch(list(spec.inputs), spec.global_batch_size, spec.seed, 0)
    graph = capture(spec.build_model(), batch)
    cg = cost_graph(graph, before_cluster(cluster) if before else cluster, NPROC,
                    batch_size=spec.global_batch_size, optimizer="adamw", compute_mode=compute,
                    profile_clock=clock)
    return {label: priced_classes(cg, {n: c["label"] for n, c in plans[label]["placements"].items()})
            for label in plans["run"]}


def _err(predicted: float | None, measured: float | None) -> float | None:
    """``(measured - predicted) / measured``: the error relative to what was measured.

    Example:
        >>> _err(90.0, 100.0)
        -0.1
    """
    if not predicted or not measured or measured != measured:
        return None
    return (predicted - measured) / measured


def main(argv: list[str] | None = None) -> int:
    """Plan each family's model, run the launch, print predicted against measured."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--steps", type=int, default=4, help="steps per plan per round (the first measures)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--cluster", default="cpu-local")
    parser.add_argument("--compute", choices=("roofline", "profiled"), default="profiled")
    parser.add_argument("--ops", action="store_true", help="also the per-operator-class breakdown")
    parser.add_argument("--ops-steps", type=int, default=3, help="steps profiled per plan with --ops")
    parser.add_argument("--ops-top", type=int, default=30, help="aten ops listed per plan with --ops")
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--plans", default="dp,fast,lean", help="comma-separated, of dp, fast, lean")
    parser.add_argument("--plan-cache", default=None,
                        help="read the planned plans here, else plan and write them")
    parser.add_argument("--reprice", action="store_true",
                        help="price plans read from --plan-cache with the current estimator and cache")
    parser.add_argument("--live-set", action="store_true", help="print what is alive at each measured peak")
    parser.add_argument("--node-clock", action="store_true",
                        help="also each replayed program node's main-thread CPU time (clocked_steps)")
    parser.add_argument("--comm-clock", action="store_true",
                        help="also each collective's issue, overlap and wait in the replayed step against "
                             "its price (benchmarks/comm_clock.py)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from runtime import _median_ms, _summary, plan_model
    from worker_launch import launch_workers

    torch.set_num_threads(1)
    start = time.perf_counter()
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f"--models: unknown {unknown}; choose from {', '.join(MODELS)}")
    wanted = [p.strip() for p in args.plans.split(",") if p.strip()]
    if set(wanted) - {"dp", "fast", "lean"}:
        parser.error(f"--plans: unknown {sorted(set(wanted) - {'dp', 'fast', 'lean'})}; "
                     "choose from dp, fast, lean")
    cache = Path(args.plan_cache) if args.plan_cache else None
    cached = json.loads(cache.read_text()) if cache is not None and cache.exists() else {}
    plans, priced, wall_priced, before_priced = {}, {}, {}, {}
    for name in names:
        if name in cached:
            priced.update(cached[name]["priced"])
            print(f"plans of {name} read from {cache}", flush=True)
        else:
            got = plan_model(name, args.cluster, args.compute, margin=0.0, models=MODELS, keep_graph=True)
            cg = got.pop("cost_graph")
            got["run"] = distinct_plans(got)
            plans[name] = {k: v for k, v in got.items() if k in ("dp", "fast", "lean", "run")}
            for label in got["run"]:
                assignment = {n: c["label"] for n, c in got[label]["placements"].items()}
                priced[f"{name}/{label}"] = priced_classes(cg, assignment)
            print(f"planned {name}: {got['frontier']} frontier plans, runs {got['run']} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
            if cache is not None:
                cached[name] = {"plans": plans[name], "priced": {k: v for k, v in priced.items()
                                                                 if k.startswith(name + "/")}}
                cache.write_text(json.dumps(cached))
        if name in cached and "plans" in cached[name]:
            plans[name] = cached[name]["plans"]
        plans[name] = {**plans[name], "run": [p for p in plans[name]["run"] if p in wanted]}
        if args.reprice and name in cached:  # the cached plans, priced by this estimator (this cache)
            for label, classes in reprice(name, plans[name], args.cluster, args.compute).items():
                priced[f"{name}/{label}"] = classes
                plans[name][label] = {**plans[name][label], "time_s": classes["total"]}
        for label, classes in reprice(name, plans[name], args.cluster, args.compute, before=True).items():
            before_priced[f"{name}/{label}"] = classes  # the same plans, timings and launch: before
        if args.compute == "profiled":  # the same plans on the wall clock's timings of the same runs
            for label, classes in reprice(name, plans[name], args.cluster, args.compute, "wall").items():
                wall_priced[f"{name}/{label}"] = classes
        add_rows(name, plans[name])
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        res = launch_workers(__file__, {"plans": plans, "steps": args.steps, "rounds": args.rounds,
                                        "ops": args.ops, "ops_steps": args.ops_steps,
                                        "node_clock": args.node_clock, "comm_clock": args.comm_clock,
                                        "live_set": args.live_set}, Path(tmp),
                             timeout_s=3600)
    load_after = os.getloadavg()
    rows = []
    print(f"\n{'plan':14} {'pred ms':>8} {'meas ms':>8} {'time err':>8} {'pred peak MiB':>13} "
          f"{'meas peak MiB':>13} {'peak err':>8} {'sum form':>9} {'its err':>8}  "
          f"{'predicted peak moment':24}  placements")
    for name in plans:
        for label in plans[name]["run"]:
            key = f"{name}/{label}"
            pred_ms = plans[name][label]["time_s"] * 1e3
            meas_ms = _median_ms(res["times"].get(key, []))
            cpu_ms = _median_ms(res.get("cpu_times", {}).get(key, []))
            thread_ms = _median_ms(res.get("thread_times", {}).get(key, []))
            unloaded_ms = _median_ms(res.get("unloaded", {}).get(key, []))
            pred_peak = res["predicted_peaks"].get(key)
            sum_peak = res.get("sum_form_peaks", {}).get(key)
            meas_peak = max(res["peaks"].get(key, [0])) or None
            wall_ms = wall_priced[key]["total"] * 1e3 if key in wall_priced else None
            row = {"model": name, "plan": label, "predicted_ms": pred_ms, "measured_ms": meas_ms,
                   "wall_clock_predicted_ms": wall_ms, "wall_clock_time_error": _err(wall_ms, meas_ms),
                   "wall_clock_priced": wall_priced.get(key),
                   "time_error": _err(pred_ms, meas_ms), "process_cpu_ms": cpu_ms, "thread_cpu_ms": thread_ms,
                   "cpu_time_error": _err(pred_ms, thread_ms), "unloaded_ms": unloaded_ms,
                   "unloaded_error": _err(pred_ms, unloaded_ms), "predicted_peak_tensor_bytes": pred_peak,

                   "peak_tensor_bytes": meas_peak, "peak_error": _err(pred_peak, meas_peak),
                   "sum_form_peak_bytes": sum_peak, "sum_form_peak_error": _err(sum_peak, meas_peak),
                   "peak_moment": res.get("peak_moments", {}).get(key, "-"),
                   "summary": _summary(plans[name][label]), "priced": priced.get(key),
                   "profiled": res["ops"].get(key), "clocked": res.get("clocked", {}).get(key),
                   "before_priced": before_priced.get(key)}
            before_ms = before_priced[key]["total"] * 1e3 if key in before_priced else None
            row.update(before_predicted_ms=before_ms, before_unloaded_error=_err(before_ms, unloaded_ms))
            rows.append(row)
            te, pe = row["time_error"], row["peak_error"]
            print(f"{key:14} {pred_ms:8.1f} {meas_ms:8.1f} {_pct(te):>8} {_mib(pred_peak):>13} "
                  f"{_mib(meas_peak):>13} {_pct(pe):>8} {_mib(sum_peak):>9} "
                  f"{_pct(row['sum_form_peak_error']):>8}  {row['peak_moment']:24}  {row['summary']}")
    print(f"\n{'plan':14} {'pred ms':>8} {'wall ms':>8} {'err':>7} {'wall-delay':>10} {'err':>7} "
          f"{'proc CPU':>8} {'main CPU':>8} {'err':>7} {'wall-clock pred':>15} {'err':>7} {'err w-d':>7}")
    for r in rows:
        wc = r["wall_clock_predicted_ms"]
        print(f"{r['model'] + '/' + r['plan']:14} {r['predicted_ms']:8.1f} {r['measured_ms']:8.1f} "
              f"{_pct(r['time_error']):>7} {r['unloaded_ms']:10.1f} {_pct(r['unloaded_error']):>7} "
              f"{r['process_cpu_ms']:8.1f} {r['thread_cpu_ms']:8.1f} {_pct(r['cpu_time_error']):>7} "
              f"{wc if wc is not None else float('nan'):15.1f} {_pct(r['wall_clock_time_error']):>7} "
              f"{_pct(_err(wc, r['unloaded_ms'])):>7}")
    print_before_after(rows)
    print("\nper family: median |time error| (wall; wall less the run delay), worst |peak error|")
    for name in plans:
        ue = [abs(r["unloaded_error"]) for r in rows
              if r["model"] == name and r["unloaded_error"] is not None]
        print(f"  {name:8} wall less run delay {_pct(statistics.median(ue)) if ue else '-':>7}")
        for field, what in (("wall_clock_time_error", "wall-clock timings, wall"),
                            ("cpu_time_error", "thread-clock timings, main-thread CPU")):
            xs = [abs(r[field]) for r in rows if r["model"] == name and r[field] is not None]
            print(f"  {name:8} {what} {_pct(statistics.median(xs)) if xs else '-':>7}")
        te = [abs(r["time_error"]) for r in rows if r["model"] == name and r["time_error"] is not None]
        pe = [abs(r["peak_error"]) for r in rows if r["model"] == name and r["peak_error"] is not None]
        print(f"  {name:8} time {_pct(statistics.median(te)) if te else '-':>7}   "
              f"peak {_pct(max(pe)) if pe else '-':>7}")
    if args.ops:
        options_top = args.ops_top
        for r in rows:
            if not r["profiled"]:
                continue
            print(f"\n{r['model']}/{r['plan']}: ms per step, priced against profiled (rank 0, self CPU)")
            classes = sorted(set(r["priced"]) | set(r["profiled"]) - {"total", "step (wall, profiled)"},
                             key=lambda c: -max(r["priced"].get(c, 0.0), r["profiled"].get(c, 0.0)))
            wall = r.get("wall_clock_priced") or {}
            for c in classes:
                if c in ("total", "step (wall, profiled)"):
                    continue
                print(f"  {c:22} {r['priced'].get(c, 0.0) * 1e3:8.2f} {r['profiled'].get(c, 0.0) * 1e3:8.2f}"
                      f"   wall-clock priced {wall.get(c, 0.0) * 1e3:8.2f}")
            print(f"  {'total / step':22} {r['priced']['total'] * 1e3:8.2f} "
                  f"{r['profiled']['step (wall, profiled)'] * 1e3:8.2f}")
            top = sorted(res.get("op_rows", {}).get(f"{r['model']}/{r['plan']}", {}).items(),
                         key=lambda kv: -kv[1][0])[:options_top]
            for op, (self_s, calls, cls) in top:
                print(f"    {op:44} {self_s * 1e3:8.2f} ms {calls:6.0f} calls  {cls}")
    if args.node_clock:
        for r in rows:
            if r["clocked"]:
                print_clocked(r, args.ops_top)
    if args.comm_clock:
        from comm_clock import price_collectives, print_collective_table

        for r in rows:
            key = f"{r['model']}/{r['plan']}"
            got = res.get("comm_clocked", {}).get(key)
            if got:
                priced = price_collectives(got["collectives"], args.cluster)
                r["comm_clocked"] = {**got, "collectives": priced}
                r["comm_table"] = print_collective_table(key, got, args.cluster)
    for key, table in res.get("live_sets", {}).items():
        print(f"\n{key}: rank 0, {table}")
    for key, err in res["errors"].items():
        print(f"FAILED {key}: {err}")
    print(f"load average (1, 5, 15 min) before {' '.join(f'{x:.2f}' for x in load_before)}, after "
          f"{' '.join(f'{x:.2f}' for x in load_after)}; {args.rounds} rounds x {args.steps} steps; "
          f"{time.perf_counter() - start:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "errors": res["errors"],
                                               "op_rows": res.get("op_rows", {}),
                                               "load_before": load_before, "load_after": load_after,
                                               "compute": args.compute,
                                               "cluster": args.cluster}, indent=1))
    return 0


def compute_ms(priced: dict | None) -> float | None:
    """A plan's priced milliseconds less its collectives and redistributions (:func:`priced_classes`).

    Example:
        >>> compute_ms({"total": 0.012, "collective": 0.002})
        10.0
    """
    if not priced:
        return None
    return (priced["total"] - priced.get("collective", 0.0)) * 1e3


def print_before_after(rows: list[dict]) -> None:
    """The whole step (against the wall less the main thread's run delay) and the compute (against the
    main thread's CPU), priced before and after commfid's sync points, from one launch's measurement;
    per family the median absolute errors."""
    print(f"\n{'plan':14} {'before':>8} {'after':>8} {'wall-delay':>10} {'err before':>10} {'err after':>9} "
          f"{'comp before':>11} {'comp after':>10} {'main CPU':>8} {'err before':>10} {'err after':>9}")
    for r in rows:
        cb, ca = compute_ms(r.get("before_priced")), compute_ms(r.get("priced"))
        r["compute_before_ms"], r["compute_after_ms"] = cb, ca
        r["compute_before_error"] = _err(cb, r["thread_cpu_ms"])
        r["compute_after_error"] = _err(ca, r["thread_cpu_ms"])
        key = r["model"] + "/" + r["plan"]
        print(f"{key:14} {r['before_predicted_ms'] or 0.0:8.1f} {r['predicted_ms']:8.1f} "
              f"{r['unloaded_ms']:10.1f} {_pct(r['before_unloaded_error']):>10} "
              f"{_pct(r['unloaded_error']):>9} "
              f"{cb or 0.0:11.1f} {ca or 0.0:10.1f} {r['thread_cpu_ms']:8.1f} "
              f"{_pct(r['compute_before_error']):>10} {_pct(r['compute_after_error']):>9}")
    for name in dict.fromkeys(r["model"] for r in rows):
        out = []
        for field in ("before_unloaded_error", "unloaded_error", "compute_before_error",
                      "compute_after_error"):
            xs = [abs(r[field]) for r in rows if r["model"] == name and r[field] is not None]
            out.append(_pct(statistics.median(xs)) if xs else "-")
        print(f"  {name:8} median |error|: step before {out[0]}, after {out[1]}; compute before {out[2]}, "
              f"after {out[3]}")


def clocked_classes(clocked: dict) -> dict[str, float]:
    """Main-thread CPU seconds per step by operator class (:func:`op_class`) of :func:`clocked_steps`'
    nodes, with ``optimizer`` (the optimizer's part of the step as it is priced: the gradients handed to the
    parameters, ``optimizer.step()`` and ``zero_grad``, :func:`clocked_steps`) and ``rest`` (the step's
    main-thread CPU outside the program and the optimizer: the loop's Python, the batch, the fx
    interpreter's own work).

    Example:
        >>> c = clocked_classes({"ops": {"aten::mm": [0.002, 4], "aten::cat": [0.001, 2]},
        ...                      "optimizer_s": 0.001, "step_s": 0.005})
        >>> {k: round(v, 4) for k, v in sorted(c.items())}
        {'GEMM': 0.002, 'copy / layout': 0.001, 'optimizer': 0.001, 'rest': 0.001}
    """
    out: dict[str, float] = {}
    for op, (cpu_s, *_calls_bytes) in clocked["ops"].items():
        cls = op_class(op)
        out[cls] = out.get(cls, 0.0) + cpu_s
    out["optimizer"] = out.get("optimizer", 0.0) + clocked["optimizer_s"]
    out["rest"] = clocked["step_s"] - sum(out.values())
    return out


def print_clocked(row: dict, top: int) -> None:
    """Print one plan's priced classes against its clocked main-thread CPU (:func:`clocked_classes`)."""
    clocked = clocked_classes(row["clocked"])
    priced = row["priced"] or {}
    print(f"\n{row['model']}/{row['plan']}: ms per step, priced against main-thread CPU "
          "(thread clock, rank 0)")
    classes = sorted((set(priced) | set(clocked)) - {"total"},
                     key=lambda c: -max(priced.get(c, 0.0), clocked.get(c, 0.0)))
    for c in classes:
        print(f"  {c:22} {priced.get(c, 0.0) * 1e3:8.2f} {clocked.get(c, 0.0) * 1e3:8.2f}")
    print(f"  {'total / step CPU':22} {priced.get('total', 0.0) * 1e3:8.2f} "
          f"{row['clocked']['step_s'] * 1e3:8.2f}")
    parts = row["clocked"].get("optimizer_parts") or {}
    if parts:  # the optimizer row's parts (tensoropt.training.optimizer_clock)
        print("    optimizer: " + ", ".join(f"{p.removesuffix('_s')} {s * 1e3:.2f}"
                                         for p, s in parts.items()))
    ops = sorted(row["clocked"]["ops"].items(), key=lambda kv: -kv[1][0])[:top]
    for op, (cpu_s, calls, *nbytes) in ops:
        written = nbytes[0] / 2**20 if nbytes else 0.0
        print(f"    {op:44} {cpu_s * 1e3:8.2f} ms {calls:6.0f} calls {written:8.2f} MiB out  {op_class(op)}")


def _pct(x) -> str:
    return f"{100 * x:+.1f}%" if isinstance(x, float) else "-"


def _mib(x) -> str:
    return f"{x / 2**20:.2f}" if x else "-"


if __name__ == "__main__":
    from worker_launch import run_worker_if_asked

    run_worker_if_asked(worker)
    sys.exit(main())
