"""Interleaved1F1B in the pipeline search on HF Llama (4 layers): in-flight counts from torch's own
interleaved order, the micro-batch rule, the stage DP against enumeration of every cut into 2p
virtual stages and every stage plan, and the plan entry (contract JSON, detail, explain)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from test_pipeline_search import LLAMA, _job

from frontier.pipeline_interleaved import interleaved_step_time_s
from tensoropt.config import Job
from tensoropt.pipeline.schedules import (
    PipelineError,
    check_pipeline,
    in_flight_micro_batches,
    pipeline_order,
)
from tensoropt.pipeline.stages import find_blocks
from tensoropt.planner import PlanningError, capture_job, plan_job


@pytest.mark.parametrize("p,m", [(2, 2), (2, 4), (2, 8), (4, 4), (4, 8), (4, 3)])
def test_in_flight_counts_follow_torchs_interleaved_order(p, m):
    order = pipeline_order("Interleaved1F1B", p, m)
    k = in_flight_micro_batches("Interleaved1F1B", p, m)
    assert len(k) == 2 * p
    for r in range(p):  # rank r runs virtual stages r and r + p only, each m forwards and m backwards
        stages = {a.stage_index for a in order[r] if a is not None}
        assert stages == {r, r + p}
    # the last virtual stage frees each micro-batch right after its forward; the first holds the most
    assert k[-1] == 1 and k[0] == max(k)
    assert all(k[s] >= k[s + 1] for s in range(2 * p - 1))
    # rank 0 warms up (v - 1) m_round + 2 (p - 1) forwards (Megatron's count with torch's rounds of
    # m_round micro-batches), capped at 2 m; its steady state starts with one more forward
    m_round = m // max(1, m // p)
    warmup_ops = min(m_round + 2 * (p - 1), 2 * m)
    warmup = 0
    for a in order[0]:
        if a is None:
            continue
        if a.computation_type.value != "F":
            break
        warmup += 1
    assert warmup == min(warmup_ops + 1, 2 * m)


def test_the_micro_batch_rule_is_torchs():
    check_pipeline("Interleaved1F1B", 4, 8, 8, 16)  # rounds of 4
    check_pipeline("Interleaved1F1B", 4, 3, 8, 12)  # one round
    with pytest.raises(PipelineError, match=r"planner.pipeline.micro_batches: Interleaved1F1B on 4 stages "
                       r".* 9 micro-batches .*multiple of 4 \(planner.pipeline.schedules\)"):
        check_pipeline("Interleaved1F1B", 4, 9, 8, 18)
    with pytest.raises(PipelineError, match="Interleaved1F1B needs at least 2 stages"):
        check_pipeline("Interleaved1F1B", 1, 2, 8, 16)
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B

    class Stage:  # what the constructor reads before it refuses the count
        group_size, group_rank, stage_index, num_stages, is_first, is_last = 4, 0, 0, 8, True, False
        submod = None

    with pytest.raises(ValueError, match="multiple of the number of rounds"):
        ScheduleInterleaved1F1B([Stage(), Stage()], 9)
    with pytest.raises(PlanningError, match=r"8 virtual stages under Interleaved1F1B\) but the model has 4"):
        plan_job(Job.from_dict({"model": {"name": "gpt", "kwargs": {"layers": 2, "width": 32, "heads": 2,
                                "seq_len": 8, "vocab_size": 64}}, "cluster": "cpu-local", "devices": [4],
                                "training": {"global_batch_size": 8},
                                "planner": {"pipeline": {"stages": [4], "schedules": ["Interleaved1F1B"]}}}))


def test_interleaved_frontier_on_hf_llama_equals_enumeration_and_reads_as_a_plan():
    import frontier as ft
    from estimators.profiles import load_cluster
    from frontier.pareto import pareto_select
    from tensoropt.pipeline.search import StageSolver, pipelined_frontier, stages_text, to_plan
    from tensoropt.planner import job_cost_graph, thin_to_count

    job = _job(LLAMA, [4], "off", batch=4)
    graph = capture_job(_job(LLAMA, [4], "off", batch=1))
    blocks = find_blocks(graph)
    G = job_cost_graph(graph, Job.from_dict({**job.to_dict(), "training": {"global_batch_size": 1}}),
                       load_cluster("cpu-local"), 2)
    m, p = 4, 2
    solver = StageSolver(G, graph, blocks, m, lambda H: thin_to_count(ft.solve(H), 3)[0])
    plans, bound = pipelined_frontier(solver, p, "Interleaved1F1B")
    k = in_flight_micro_batches("Interleaved1F1B", p, m)
    costs = []
    for cuts in itertools.combinations(range(1, blocks.count), 2 * p - 1):
        edges = [0, *cuts, blocks.count]
        lists = [solver.options(edges[s], edges[s + 1] - 1, k[s]) for s in range(2 * p)]
        for choice in itertools.product(*lists):
            tau = [choice[r].time_s + choice[r + p].time_s for r in range(p)]
            d = [choice[r].step_s + choice[r + p].step_s for r in range(p)]
            w = [choice[r].memory_bytes + choice[r + p].memory_bytes for r in range(p)]
            time_s = interleaved_step_time_s(max(tau), sum(o.time_s for o in choice), max(d), m)
            costs.append((time_s, max(w)))
    costs = np.array(costs)
    expected = sorted(map(tuple, np.round(costs[pareto_select(costs)], 12)))
    got = sorted((round(q.point.time_s, 12), round(q.point.memory_bytes, 12)) for q in plans)
    assert bound == 0.0 and len(got) == len(expected) >= 1
    assert np.allclose(np.array(got), np.array(expected), rtol=1e-9, atol=0)
    # the plan entry: the contract's keys, 2p virtual stages in chain order; each rank's devices
    best = plans[0]
    plan, _ = to_plan(best, solver, 4, 4)
    pipe = plan.to_json()["pipeline"]
    assert set(pipe) == {"stages", "schedule", "micro_batches", "blocks"}
    assert pipe["stages"] == 2 and pipe["schedule"] == "Interleaved1F1B" and pipe["micro_batches"] == 4
    assert len(pipe["blocks"]) == 4
    assert pipe["blocks"][0][0] == 0 and pipe["blocks"][-1][1] == blocks.count - 1
    stages = plan.pipeline_detail["stages"]
    assert [s["rank"] for s in stages] == [0, 1, 0, 1] and [s["in_flight"] for s in stages] == k
    assert stages[2]["devices"] == [0, 1] and stages[3]["devices"] == [2, 3]
    rank_w = plan.pipeline_detail["rank_memory_bytes"]
    assert rank_w == pytest.approx([stages[0]["memory_bytes"] + stages[2]["memory_bytes"],
                                    stages[1]["memory_bytes"] + stages[3]["memory_bytes"]])
    assert plan.memory_bytes == pytest.approx(max(rank_w), abs=1)
    bubble = plan.pipeline_detail["bubble_fraction"]
    assert 0.0 < bubble < 1.0
    text = stages_text(plan)
    assert text.startswith("pipeline: 2 stages, Interleaved1F1B, 4 micro-batches")
    assert "2 virtual stages per rank (rank r holds stages r and r + 2)" in text
    assert plan.summary.startswith("pipeline 2 x 2 (Interleaved1F1B, 4 micro-batches")
