"""Pipeline search on real captured models (issue 27): blocks and cuts, in-flight counts from
torch's schedule order, `auto`'s candidates, the planner's pipelined plans and their errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from frontier.pipeline import step_time_s
from tensoropt.commands.explain import explain_text
from tensoropt.config import Job
from tensoropt.pipeline.schedules import PipelineError, check_pipeline, in_flight_micro_batches
from tensoropt.pipeline.stages import find_blocks
from tensoropt.planner import PlanningError, capture_job, plan_job
from tensoropt.plans import PlanFile, frontier_file_text, plan_file_text, unpack_frontier_json

GPT = {"name": "gpt", "kwargs": {"layers": 2, "width": 32, "heads": 2, "seq_len": 8, "vocab_size": 64}}
LLAMA = {"factory": "tensoropt.models.hf:llama",
         "kwargs": {"num_hidden_layers": 4, "hidden_size": 32, "num_attention_heads": 2,
                    "num_key_value_heads": 1,
                    "intermediate_size": 64, "vocab_size": 64, "max_position_embeddings": 16},
         "inputs": {"input_ids": {"shape": [16], "dtype": "int64", "high": 64},
                    "labels": {"shape": [16], "dtype": "int64", "high": 64}}, "loss": "model"}


def _job(model, devices, pipeline, batch=8, cluster="cpu-local"):
    return Job.from_dict({"model": model, "cluster": cluster, "devices": devices,
                          "training": {"global_batch_size": batch}, "planner": {"pipeline": pipeline}})


@pytest.mark.parametrize("p,m", [(2, 2), (2, 5), (4, 4), (4, 8), (3, 7)])
def test_in_flight_counts_from_torch_match_the_schedules(p, m):
    assert in_flight_micro_batches("1F1B", p, m) == [min(p - s, m) for s in range(p)]
    assert in_flight_micro_batches("GPipe", p, m) == [m] * p


def test_blocks_of_hf_llama_and_the_zoo_gpt():
    llama = find_blocks(capture_job(_job(LLAMA, [1], "off")))
    assert llama.names == ["embedding", *[f"model.model.layers.{i}" for i in range(4)], "head"]
    assert all(llama.cuts) and llama.identical and llama.container == "model.model.layers"
    # the one tensor crossing each boundary is the residual stream leaving the block
    assert llama.boundary["model.model.layers.0"].startswith("add")
    gpt = find_blocks(capture_job(_job(GPT, [1], "off")))
    assert gpt.names == ["embedding", "blocks.0", "blocks.1", "head"] and gpt.identical


def test_a_model_without_blocks_is_refused_naming_its_modules():
    import torch

    import tensoropt

    class TwoLayers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x))).sum()

    graph = tensoropt.capture(TwoLayers(), (torch.randn(2, 8),))
    with pytest.raises(PipelineError, match=r"no block boundary where a pipeline cut could go.*'fc1', 'fc2'"):
        find_blocks(graph)


def test_bad_requests_name_the_field():
    with pytest.raises(PipelineError, match="3 stages do not divide 8 devices"):
        check_pipeline("1F1B", 3, 4, 8, 8)
    with pytest.raises(PipelineError, match="needs at least 4 micro-batches"):
        check_pipeline("1F1B", 4, 2, 8, 8)
    with pytest.raises(PipelineError, match="do not divide the global batch of 8"):
        check_pipeline("GPipe", 2, 3, 8, 8)
    with pytest.raises(PlanningError, match="planner.pipeline.stages: 3 stages do not divide 2 devices"):
        plan_job(_job(GPT, [2], {"stages": [3]}))


def test_pipelined_plans_on_hf_llama_price_as_the_formula_says(tmp_path):
    request = {"stages": [2], "schedules": ["1F1B", "GPipe"], "micro_batches": [2, 4]}
    ff = plan_job(_job(LLAMA, [2, 4], request))
    data = unpack_frontier_json(json.loads(frontier_file_text(ff.to_json())))  # each plan's own rows
    for f in data["frontiers"]:
        assert all("pipeline" in p for p in f["plans"])  # the contract: null or the mapping
        search = f["pipeline_search"]
        assert sorted(map(tuple, search["candidates"])) == sorted(
            (2, s, m) for s in ("1F1B", "GPipe") for m in (2, 4))
        for p in f["plans"]:
            if p["pipeline"] is None:
                continue
            assert set(p["pipeline"]) == {"stages", "schedule", "micro_batches", "blocks"}
            assert p["micro_batches"] == p["pipeline"]["micro_batches"]  # the step runs m micro-batches
            pipe, detail = p["pipeline"], p["pipeline_detail"]
            blocks = pipe["blocks"]
            assert blocks[0][0] == 0 and blocks[-1][1] == len(detail["block_names"]) - 1
            stages = detail["stages"]
            t = np.array([s["time_s"] for s in stages])
            d = np.array([s["step_s"] for s in stages])
            assert p["time_s"] == pytest.approx(step_time_s(t.max(), t.sum(), d.max(), pipe["micro_batches"]))
            assert p["memory_bytes"] == pytest.approx(max(s["memory_bytes"] for s in stages), abs=1)
            k = [s["in_flight"] for s in stages]
            assert k == ([min(2 - s, pipe["micro_batches"]) for s in range(2)] if pipe["schedule"] == "1F1B"
                         else [pipe["micro_batches"]] * 2)
            assert stages[1]["devices"] == [f["devices"] // 2, f["devices"] - 1]
            plan = json.loads(plan_file_text(data, p["id"]))
            assert plan["pipeline"] == pipe and set(plan["placements"]) == set(p["ops"])
            text = explain_text(PlanFile.from_json(plan))
            assert f"pipeline: 2 stages, {pipe['schedule']}, {pipe['micro_batches']} micro-batches" in text
            assert f"embedding .. {detail['block_names'][blocks[0][1]]}" in text
            assert p["summary"].startswith(f"pipeline 2 x {f['devices'] // 2} ({pipe['schedule']}")
        times = [p["time_s"] for p in f["plans"]]
        assert times == sorted(times)
    assert any(p["pipeline"] for f in data["frontiers"] for p in f["plans"])


def test_off_and_one_node_auto_keep_plans_unpipelined():
    ff = plan_job(_job(GPT, [2], "auto"))  # one node, no budget: nothing pipelined
    assert ff.frontiers[0].pipeline_search is None
    assert all(p.pipeline is None for p in ff.frontiers[0].plans)
    assert json.loads(frontier_file_text(ff.to_json()))["frontiers"][0]["plans"][0]["pipeline"] is None


def test_auto_proposes_whole_nodes_per_stage_beyond_one_node():
    from estimators.profiles import load_cluster
    from tensoropt.planner import auto_stage_counts, pipeline_candidates

    cluster = load_cluster("h100-128x8-ib")
    job = Job.from_dict({"model": {"name": "mlp"}, "cluster": "h100-128x8-ib",
                         "devices": [8, 16, 32, 64, 512], "training": {"global_batch_size": 64},
                         "planner": {"pipeline": "auto"}})
    got = {d: pipeline_candidates(job, d, cluster, True) for d in (8, 16, 32, 64, 512)}
    assert got[8] == []  # one node, a plan fits: no pipeline
    assert [p for p, _, _ in got[16]] == [2] and [p for p, _, _ in got[32]] == [2, 4]
    assert [p for p, _, _ in got[64]] == [2, 4, 8] and [p for p, _, _ in got[512]] == [2, 4, 8]
    assert {m for c in got.values() for _, _, m in c} == {16}  # one micro-batch count for every count
    assert all(d // p % 8 == 0 for d, c in got.items() for p, _, _ in c)  # stages of whole nodes
    # no plan fits the budget: every stage count dividing the devices, within a node too
    assert [p for p, _, _ in pipeline_candidates(job, 16, cluster, False)] == [2, 4, 8]
    assert [p for p, _, _ in pipeline_candidates(job, 8, cluster, False)] == [2, 4, 8]
    assert auto_stage_counts(24, 8, 64) == [] and auto_stage_counts(24, 8, 64, whole_nodes=False) == [2, 4, 8]
    # an explicit request still gets every stage count it asks for
    explicit = Job.from_dict({"model": {"name": "mlp"}, "cluster": "h100-128x8-ib", "devices": [16],
                              "training": {"global_batch_size": 64},
                              "planner": {"pipeline": {"stages": [8]}}})
    assert [p for p, _, _ in pipeline_candidates(explicit, 16, cluster, True)] == [8]


def test_pipelined_frontier_on_hf_llama_equals_enumeration_of_partitions_and_stage_plans():
    import itertools

    import frontier as ft
    from estimators.profiles import load_cluster
    from frontier.pareto import pareto_select
    from tensoropt.pipeline.search import StageSolver, pipelined_frontier
    from tensoropt.planner import job_cost_graph, thin_to_count

    job = _job(LLAMA, [4], "off", batch=4)  # micro-batch of 1 sample: m = 4
    graph = capture_job(_job(LLAMA, [4], "off", batch=1))
    blocks = find_blocks(graph)
    G = job_cost_graph(graph, Job.from_dict({**job.to_dict(), "training": {"global_batch_size": 1}}),
                       load_cluster("cpu-local"), 2)
    solver = StageSolver(G, graph, blocks, 4, lambda H: thin_to_count(ft.solve(H), 4)[0])
    for p, schedule in ((2, "1F1B"), (3, "1F1B"), (2, "GPipe")):
        plans, bound = pipelined_frontier(solver, p, schedule)
        k = in_flight_micro_batches(schedule, p, 4)
        middle = k[1:-1]
        costs = []
        for cuts in itertools.combinations(range(1, blocks.count), p - 1):
            edges = [0, *cuts, blocks.count]
            ranges = [(edges[i], edges[i + 1] - 1) for i in range(p)]
            lists = [solver.options(a, b, k[s], (min(middle), max(middle)) if 0 < s < p - 1 else ())
                     for s, (a, b) in enumerate(ranges)]
            for choice in itertools.product(*lists):
                t = np.array([o.time_s for o in choice])
                costs.append((step_time_s(t.max(), t.sum(), max(o.step_s for o in choice), 4),
                              max(o.memory_bytes for o in choice)))
        costs = np.array(costs)
        expected = sorted(map(tuple, np.round(costs[pareto_select(costs)], 12)))
        got = sorted((round(q.point.time_s, 12), round(q.point.memory_bytes, 12)) for q in plans)
        assert bound == 0.0 and len(got) == len(expected) > 1
        assert np.allclose(np.array(got), np.array(expected), rtol=1e-9, atol=0)
        assert all(q.options[0].memory_bytes >= 0 and len(q.options) == p for q in plans)
