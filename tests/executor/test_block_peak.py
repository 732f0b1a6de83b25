"""The tensor peak under whole-block checkpointing: below the plain plan's, as predicted (issue 26).

An HF Llama (2 layers of width 128, 64 tokens per sample, global batch 8, fp32, SGD with momentum)
planned on 2 devices of cpu-local with ``training.memory_options: [block_recompute,
block_selective]``: the data-parallel plan, plain and with every block under each option, trains
one step on 2 gloo processes (one launch; the tensor peak is measured on the first step, through
the DTensor interpreter). ``measured.peak_tensor_bytes`` (the most tensor storage alive at once,
:mod:`tensoropt.executor.state.tensor_peak`) must be below the plain plan's under both options, and
``predicted.peak_tensor_bytes`` (:mod:`estimators.peak` without the runtime's own memory: the plan's
memory plus the larger of backward's transient, a checkpointed block's rebuilt activations beyond
what is not alive at its moment among them, :func:`estimators.peak.recompute_excess_bytes`, with what
the block's backward holds beside them, :mod:`tensoropt.executor.state.block_backward`, and the
optimizer step's) within :data:`TOLERANCE` of it. The same in bf16-mixed with zero3 wherever offered
(the plain plan too), 4 layers: there the checkpoints keep the parameters' bf16 shards, which the
later blocks' release before backward reaches the first block
(:func:`tensoropt.executor.state.block_backward.released_copy_bytes`). Before the fix in
:mod:`tensoropt.executor.state.block_checkpoint` (a block returned every value it computed, so each
block's whole forward stayed alive through backward) the block plans' tensor peaks were 1.5 x the
plain plan's.
"""

from __future__ import annotations

import copy

import pytest
from launch_helpers import HERE, outputs, run_plans

import frontier
from estimators.breakdown import plan_breakdown
from estimators.profiles import load_cluster
from tensoropt.config import Job
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.planner import capture_job, job_cost_graph

pytest.importorskip("transformers", reason="the HuggingFace job needs the dev extra (transformers 5.x)")

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]

SEQ = 64
OPTIONS = ["block_recompute", "block_selective"]
TOLERANCE = {"full": 0.05, "selective": 0.05}
"""Relative error allowed between the predicted and the measured tensor peak of a block plan (the
issue's 5 %): the prediction adds, at the block's rerun, what its backward holds beyond the rebuilt
activations (:mod:`tensoropt.executor.state.block_backward`); without that term ``block_recompute``
was -11.1 % here."""
VARIANTS = {"fp32": {"layers": 2, "precision": "fp32", "zero3": False},
            "bf16-zero3": {"layers": 4, "precision": "bf16-mixed", "zero3": True}}
"""Precision variants: fp32 (2 layers), and bf16-mixed + zero3 (4 layers: three later blocks' bf16
shards released at the first block's rerun; without that term ``block_recompute`` was over-predicted)."""
JOB = {"model": {"factory": "tensoropt.models.hf:llama",
                 "kwargs": {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
                            "num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": 256,
                            "max_position_embeddings": SEQ},
                 "inputs": {"input_ids": {"shape": [SEQ], "dtype": "int64", "high": 256},
                            "labels": {"shape": [SEQ], "dtype": "int64", "high": 256}},
                 "loss": "model"},
       "cluster": "cpu-local", "devices": [2],
       "training": {"global_batch_size": 8, "optimizer": "momentum", "learning_rate": 0.01,
                    "precision": "fp32", "memory_options": OPTIONS, "seed": 0}}


def _job(variant: dict) -> Job:
    body = copy.deepcopy(JOB)
    body["model"]["kwargs"]["num_hidden_layers"] = variant["layers"]
    body["training"]["precision"] = variant["precision"]
    if variant["zero3"]:
        body["training"]["memory_options"] = ["zero3", *OPTIONS]
    return Job.from_dict(body)


def _plans(variant: dict) -> tuple[TrainSpec, dict[str, dict]]:
    """The spec and the plan.json dicts (rows included: the predicted transient comes from them) of the
    data-parallel split, plain and with every block under each option (with zero3 wherever offered in
    each, the plain one too, for a ``zero3`` variant)."""
    job = _job(variant)
    cg = job_cost_graph(capture_job(job), job, load_cluster("cpu-local"), 2)
    fastest = frontier.solve(cg)[0].assignment
    plain = {}
    for n, i in fastest.items():
        labels = cg.nodes[n]["configs"]
        split = ",".join(t for t in labels[i].split(",") if t not in OPTIONS and t != "zero3")
        plain[n] = labels.index("batch=2") if "batch=2" in labels else labels.index(split)
        if variant["zero3"] and labels[plain[n]] + ",zero3" in labels:
            plain[n] = labels.index(labels[plain[n]] + ",zero3")
    docs = {}
    for pid, suffix in {"plain": "", "full": ",block_recompute", "selective": ",block_selective"}.items():
        a = {n: cg.nodes[n]["configs"].index(cg.nodes[n]["configs"][i] + suffix)
             if suffix and cg.nodes[n]["configs"][i] + suffix in cg.nodes[n]["configs"] else i
             for n, i in plain.items()}
        b = plan_breakdown(cg, a)
        docs[pid] = {"id": pid, "devices": 2, "mesh": cg.graph["mesh"].to_json(), "job": job.to_dict(),
                     "time_s": b["time_s"], "memory_bytes": b["memory_bytes"], "layers": b["layers"],
                        "redistributions": b["redistributions"],
                     "placements": {n: cg.nodes[n]["configurations"][a[n]].to_json() for n in cg}}
    return TrainSpec.from_job(job, steps=1), docs


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_block_plans_peak_below_plain_and_as_predicted(tmp_path, variant):
    spec, docs = _plans(VARIANTS[variant])
    used = {pid: {o for c in doc["placements"].values() for o in c.get("options", ())} - {"zero3"}
            for pid, doc in docs.items()}
    assert used == {"plain": set(), "full": {"block_recompute"}, "selective": {"block_selective"}}, used
    zero3 = {pid for pid, doc in docs.items()
             if any("zero3" in c.get("options", ()) for c in doc["placements"].values())}
    assert zero3 == (set(docs) if VARIANTS[variant]["zero3"] else set()), zero3
    rc, _ = run_plans([("llama", spec, doc) for doc in docs.values()], 2, tmp_path, timeout_s=800, steps=1,
                      env={"PYTHONPATH": str(HERE)})
    assert rc == 0, "the launch failed"
    measured, predicted = {}, {}
    for pid in docs:
        metrics = outputs(tmp_path, "llama", pid)[0]
        measured[pid] = metrics["measured"]["peak_tensor_bytes"]
        predicted[pid] = metrics["predicted"]["peak_tensor_bytes"]
    figures = {pid: (measured[pid], predicted[pid]) for pid in docs}
    bad = []
    for pid in ("full", "selective"):
        if not measured[pid] < measured["plain"]:
            bad.append(f"{pid}: tensor peak {measured[pid]} B, not below the plain plan's "
                       f"{measured['plain']} B")
        error = (predicted[pid] - measured[pid]) / measured[pid]
        if abs(error) > TOLERANCE[pid]:
            bad.append(f"{pid}: predicted tensor peak {predicted[pid]} B, measured {measured[pid]} B "
                       f"({error:+.1%})")
    assert not bad, "\n".join(bad) + f"\n(measured, predicted) per plan: {figures}"
