"""The memory budget is checked against a plan's peak: its additive memory plus its largest transient
(issue 26 item 2): a plan that fits by memory alone but whose recompute transient (a checkpointed
block's activations during its backward) does not is neither selected nor counted as fitting, and
the error says why."""

from __future__ import annotations

import dataclasses

import pytest

from tensoropt.config import load_job
from tensoropt.configspace.configuration import Mesh
from tensoropt.plans import Frontier, FrontierFile, Layer, Plan
from tensoropt.selector import NoFeasiblePlan, select

GIB = 2**30


def _plan(pid: str, time_s: float, memory_gib: float, transient_gib: float) -> Plan:
    row = Layer("fc", "aten.linear.default", "layers.0.fc", "batch=2,block_recompute", time_s, 0.0,
                memory_gib * GIB, recompute_bytes=transient_gib * GIB,
                recompute_chain_bytes=transient_gib * GIB)
    return Plan(pid, time_s, memory_gib * GIB, {"fc": row.config}, layers=[row])


def _file() -> FrontierFile:
    plans = [_plan("d2-p0", 1.0, 70, 10), _plan("d2-p1", 1.5, 75, 0)]  # peaks 80 and 75 GiB
    return FrontierFile({}, [Frontier(2, Mesh((2,), ("gpu",)), plans)])


def test_a_plan_over_the_budget_at_its_peak_is_not_selected():
    chosen = select(_file(), memory_budget_bytes=78 * GIB, devices=2, margin=None).plan
    assert chosen.id == "d2-p1"  # d2-p0's memory (70 GiB) fits, its peak (80 GiB) does not
    assert select(_file(), memory_budget_bytes=80 * GIB, devices=2, margin=None).plan.id == "d2-p0"


def test_the_error_names_the_plans_that_fit_by_memory_alone_and_their_transient():
    with pytest.raises(NoFeasiblePlan) as e:
        select(_file(), memory_budget_bytes=72 * GIB, devices=2, margin=None)
    text = str(e.value)
    assert "The smallest memory any plan needs there is 75.0 GiB" in text, text
    assert "1 plan(s) fit by their memory alone but not at their peak: d2-p0 needs 70.0 GiB + its largest " \
           "transient 10.0 GiB" in text, text
    assert e.value.min_memory_bytes == 75 * GIB


@pytest.mark.timeout(900)
def test_planned_block_plans_are_checked_at_their_peak():
    """The tiny HF Llama planned with block_recompute on 2 devices: at a budget of the fastest
    block plan's memory (below its peak), the selector picks a plan whose peak fits, and
    ``tensoropt plan``'s own fit check agrees."""
    from tensoropt.planner import plan_job

    job = load_job("configs/jobs/hf-llama.yaml")
    job = dataclasses.replace(job, devices=[2], training=dataclasses.replace(
        job.training, memory_options=["block_recompute"]))
    ff = plan_job(job)
    plans = ff.frontier(2).plans
    blocked = [p for p in plans if p.largest_transient_bytes > 0 and
               any("block_recompute" in label for label in p.ops.values())]
    assert blocked, "no plan of the frontier checkpoints a block"
    target = min(blocked, key=lambda p: p.time_s)
    budget = target.memory_bytes
    assert target.peak_memory_bytes > budget
    try:
        chosen = select(ff, memory_budget_bytes=budget, devices=2, margin=None).plan
    except NoFeasiblePlan as e:
        assert "fit by their memory alone but not at their peak" in str(e), str(e)
    else:
        assert chosen.id != target.id and chosen.peak_memory_bytes <= budget
