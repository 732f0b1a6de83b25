"""Whole-block checkpointing run as planned (issue 26): ``block_recompute`` and ``block_selective``.

The tiny HF Llama and GPT-2 jobs and the zoo GPT, planned on 2 devices of cpu-local with
``training.memory_options: [zero3, block_recompute, block_selective]``: a data-parallel split
(the frontier's fastest plan's split where an operator has no batch split), plain, with every
block under ``block_recompute`` and under ``block_selective``, each with zero3 wherever offered,
train 3 steps on 2 processes (gloo), in bf16-mixed (replay mode), and the
Llama also in fp32 (replay and interpret mode). Losses and final parameters must equal the
1-process run's (1e-5 in fp32, 2e-2 in bf16-mixed: its roundings follow the layout); the
executor's measured saved memory (unique storages held for backward: the blocks' inputs, the
selective checkpoint's saved outputs) must be below the plain plan's and within 5 % of the
prediction (10 % for ``block_selective`` in fp32, where the CPU's math attention saves other
matmul outputs than the fused kernels the model prices: measured +8.3 %).
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
from launch_helpers import HERE, outputs, parity_errors, plan_doc, run_plans, single_process

import frontier
from estimators.profiles import load_cluster
from tensoropt.config import Job, load_job
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.planner import PlanningError, capture_job, job_cost_graph, plan_job

pytest.importorskip("transformers", reason="the HuggingFace jobs need the dev extra (transformers 5.x)")

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]

JOBS = HERE.parents[1] / "configs" / "jobs"
OPTIONS = ["zero3", "block_recompute", "block_selective"]
ZOO_GPT = {"model": {"name": "gpt", "kwargs": {"layers": 2, "width": 64, "heads": 4, "seq_len": 16,
                                               "vocab_size": 128, "dropout": 0.0}},
           "training": {"global_batch_size": 4, "seed": 0, "steps": 3},
           "cluster": "cpu-local", "devices": [2]}
CASES = {  # name: (job, precision, executor mode)
    "llama-bf16": ("hf-llama.yaml", "bf16-mixed", "replay"),
    "gpt2-bf16": ("hf-gpt2.yaml", "bf16-mixed", "replay"),
    "gpt-bf16": (ZOO_GPT, "bf16-mixed", "replay"),
    "llama-fp32": ("hf-llama.yaml", "fp32", "replay"),
    "llama-fp32-interpret": ("hf-llama.yaml", "fp32", "interpret"),
}


def _job(case: str) -> Job:
    source, precision, _ = CASES[case]
    base = load_job(JOBS / source) if isinstance(source, str) else Job.from_dict(source)
    training = dataclasses.replace(base.training, precision=precision, dtype=None, memory_options=OPTIONS,
                                   optimizer="momentum", learning_rate=0.05)
    return dataclasses.replace(base, devices=[2], training=training)


def _variant(cg, assignment: dict, suffixes: tuple[str, ...]) -> dict:
    """``assignment`` with each node's configuration + the first of ``suffixes`` it offers."""
    out = {}
    for n, i in assignment.items():
        labels = cg.nodes[n]["configs"]
        out[n] = next((labels.index(labels[i] + s) for s in suffixes if labels[i] + s in labels), i)
    return out


def _strip(label: str) -> str:
    return ",".join(t for t in label.split(",") if t not in ("zero3", "block_recompute", "block_selective"))


@functools.cache
def _plans(case: str) -> tuple[TrainSpec, dict[str, tuple[dict, float]]]:
    """The case's spec and its plans: id -> (plan.json dict, predicted memory bytes)."""
    job = _job(case)
    cg = job_cost_graph(capture_job(job), job, load_cluster("cpu-local"), 2)
    fastest = frontier.solve(cg)[0].assignment
    plain = {}  # data parallel where offered (zero3 shards those parameters), else the fastest plan's split
    for n, i in fastest.items():
        labels = cg.nodes[n]["configs"]
        plain[n] = labels.index("batch=2") if "batch=2" in labels else labels.index(_strip(labels[i]))
    variants = {"plain": plain,
                "full": _variant(cg, _variant(cg, plain, (",zero3",)), (",block_recompute",)),
                "selective": _variant(cg, _variant(cg, plain, (",zero3",)), (",block_selective",))}
    plans = {}
    for pid, a in variants.items():
        plans[pid] = plan_doc(cg, job, pid, a)
    return TrainSpec.from_job(job, steps=3), plans


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    """case -> (output folder, exit code) of its plans' 2-process run (launched once per case)."""
    out = tmp_path_factory.mktemp("blocks")

    @functools.cache
    def run(case: str) -> tuple:
        spec, plans = _plans(case)
        runs = [(case, spec, doc) for doc, _ in plans.values()]
        return out, run_plans(runs, 2, out, timeout_s=800, env={"PYTHONPATH": str(HERE)},
                              executor={"mode": CASES[case][2]})[0]

    return run


def test_block_options_are_in_every_plan_but_plain():
    for case in CASES:
        _, plans = _plans(case)
        for pid, (doc, _) in plans.items():
            used = {o for c in doc["placements"].values() for o in c.get("options", ())}
            expected = {"plain": set(), "full": {"block_recompute"}, "selective": {"block_selective"}}[pid]
            assert used - {"zero3"} == expected, (case, pid, used)
            if pid != "plain":
                assert "zero3" in used, (case, pid)


@pytest.mark.parametrize("case", list(CASES))
def test_block_plans_match_single_process(launch, case):
    out, rc = launch(case)
    spec, plans = _plans(case)
    reference = single_process(spec)
    tol = 1e-5 if CASES[case][1] == "fp32" else 2e-2
    errors = []
    for pid in plans:
        errors += parity_errors(case, pid, out, reference, loss_rtol=tol, param_rtol=max(tol, 1e-4))
    assert rc == 0 or errors, "the launch failed"
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("case", list(CASES))
def test_block_plans_keep_less_and_as_predicted(launch, case):
    out, _ = launch(case)
    _, plans = _plans(case)
    measured = {pid: outputs(out, case, pid)[0]["measured"]["memory_bytes"] for pid in plans}
    bad = []
    for pid, (_, predicted) in plans.items():
        # selective in fp32 on the CPU: the math attention's saved matmuls are not the fused kernel's
        # outputs the model prices (measured +8.3 %, issue 26's known gap): 10 % there
        tol = 0.10 if pid == "selective" and CASES[case][1] == "fp32" else 0.05
        if abs(measured[pid] - predicted) > tol * measured[pid]:
            bad.append(f"{pid}: measured {measured[pid]} B, predicted {predicted:.0f} B "
                       f"({(predicted / measured[pid] - 1) * 100:+.1f} %)")
        if pid != "plain" and not measured[pid] < measured["plain"]:
            bad.append(f"{pid}: measured {measured[pid]} B, not below the plain plan's {measured['plain']} B")
    assert not bad, "\n".join(bad)


def test_checkpoint_modules_naming_a_missing_module_is_a_clear_error():
    job = _job("llama-fp32")
    training = dataclasses.replace(job.training, checkpoint_modules=["model.nope"])
    job = dataclasses.replace(job, training=training)
    with pytest.raises(PlanningError, match=r"training\.checkpoint_modules.*'model\.nope'"):
        plan_job(job)


def test_checkpoint_modules_names_the_blocks_the_executor_checkpoints():
    job = _job("llama-fp32")
    named = dataclasses.replace(job, training=dataclasses.replace(
        job.training, checkpoint_modules=["model.model.layers.1"]))
    cg = job_cost_graph(capture_job(named), named, load_cluster("cpu-local"), 2)
    assert list(cg.graph["blocks"]) == ["model.model.layers.1"]
    layer0 = [n for n in cg if ".layers.0." in cg.nodes[n]["module"]]
    assert layer0 and not any("block_" in label for n in layer0 for label in cg.nodes[n]["configs"])

