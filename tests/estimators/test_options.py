"""Costs of the memory options (issue 10): what recompute, zero1, zero2 and zero3 change in the cost graph."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from est_plans import TinyGPT, gpt_inputs

import frontier
from estimators.breakdown import plan_breakdown
from estimators.collectives import CommModel, grad_all_reduce_time_s
from estimators.memory import optimizer_factor
from estimators.op_costs import GraphInfo, _bytes
from estimators.profiles import load_cluster
from tensoropt.capture import capture
from tensoropt.config import ConfigError, Job
from tensoropt.configspace.options import base_configuration, state_layouts
from tensoropt.cost_graph import cost_graph

OPTIONS = ("recompute", "zero3")


@pytest.fixture(scope="module")
def gpt():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return capture(TinyGPT(causal=True, p_attn=0.0), gpt_inputs())


@pytest.fixture(scope="module")
def graphs(gpt):
    return cost_graph(gpt, "h100x8", 4), cost_graph(gpt, "h100x8", 4, memory_options=OPTIONS)


def test_no_options_changes_nothing(gpt, graphs):
    plain, _ = graphs
    again = cost_graph(gpt, "h100x8", 4, memory_options=())
    for n in plain:
        assert plain.nodes[n]["configs"] == again.nodes[n]["configs"]
        assert np.array_equal(plain.nodes[n]["cost"], again.nodes[n]["cost"])
    for u, v in plain.edges:
        assert np.array_equal(plain.edges[u, v]["cost"], again.edges[u, v]["cost"])


def test_plain_rows_are_unchanged_and_variants_trade_time_for_memory(graphs):
    plain, opt = graphs
    factor = 2 + optimizer_factor("adamw")
    counts = {"recompute": 0, "zero3": 0}
    for n in opt:
        labels = opt.nodes[n]["configs"]
        row_of = {label: i for i, label in enumerate(labels)}
        for i, c in enumerate(opt.nodes[n]["configurations"]):
            base = row_of[base_configuration(c).label]
            j = plain.nodes[n]["configs"].index(base_configuration(c).label)
            if not c.options:
                assert np.array_equal(opt.nodes[n]["cost"][i], plain.nodes[n]["cost"][j])
                continue
            t, m = opt.nodes[n]["cost"][i]
            t0, m0 = opt.nodes[n]["cost"][base]
            for o in c.options:
                counts[o] += 1
            if c.options == ("recompute",):
                assert t > t0 and m <= m0, (n, c.label)
            if c.options == ("zero3",):
                # parameter + gradient + AdamW state shrink by (1 - 1/p) on the sharded parameters
                saved = m0 - m
                assert saved > 0 and saved % factor == 0, (n, c.label, saved)
                assert opt.nodes[n]["comm_s"][i] > opt.nodes[n]["comm_s"][base]
                # the largest gathered parameter is a transient buffer
                assert opt.nodes[n]["buffer_bytes"][i] >= max(1.0, opt.nodes[n]["buffer_bytes"][base])
    assert counts["recompute"] >= 10 and counts["zero3"] >= 8, counts


def test_recomputed_producer_is_not_kept_by_its_consumers(graphs):
    _, opt = graphs
    checked = 0
    for u, v in opt.edges:
        cu = opt.nodes[u]["configurations"]
        mem = opt.edges[u, v]["memory_bytes"]
        for i, c in enumerate(cu):
            if "recompute" not in c.options:
                continue
            plain_row = [k for k, x in enumerate(cu) if x.label == base_configuration(c).label][0]
            assert np.all(mem[i] <= mem[plain_row] + 1e-9), (u, v, c.label)
            checked += 1
    assert checked > 10


def test_frontier_reaches_lower_memory_and_keeps_the_fastest_plain_plan(graphs):
    plain, opt = graphs
    p_points, o_points = frontier.solve(plain), frontier.solve(opt)
    assert min(p.cost[1] for p in o_points) < 0.9 * min(p.cost[1] for p in p_points)
    fastest = min(o_points, key=lambda p: p.cost[0])
    assert fastest.cost[0] == pytest.approx(min(p.cost[0] for p in p_points), rel=1e-12)
    assert all(not opt.nodes[n]["configurations"][fastest.assignment[n]].options for n in opt)
    for p in o_points[:: max(1, len(o_points) // 5)]:
        b = plan_breakdown(opt, p.assignment)
        assert b["memory_bytes"] == pytest.approx(p.cost[1], rel=1e-9)


def test_job_memory_options_reach_the_cost_graph():
    job = Job.from_dict({"model": {"name": "mlp"}, "cluster": "cpu-local", "devices": [2],
                         "training": {"memory_options": ["zero3"]}})
    assert job.training.memory_options == ["zero3"]
    with pytest.raises(ConfigError, match="training.memory_options"):
        Job.from_dict({"model": {"name": "mlp"}, "cluster": "cpu-local", "devices": [2],
                       "training": {"memory_options": ["zero4"]}})
    from tensoropt.planner import plan_job

    fj = plan_job(job).to_json()
    labels = {label for f in fj["frontiers"] for confs in f["configurations"].values() for label in confs}
    assert any(label.endswith(",zero3") for label in labels), labels


@pytest.fixture(scope="module")
def all_options(gpt):
    return cost_graph(gpt, "h100x8", 4, memory_options=("recompute", "zero1", "zero2", "zero3"))


def test_zero1_zero2_shard_optimizer_state_and_gradients(all_options, gpt):
    g = all_options
    mesh = g.graph["mesh"]
    comm_model = CommModel(load_cluster("h100x8"), mesh)
    bucketed = GraphInfo.of(gpt.nx).bucketed_grad_bytes(4)  # float32 gradients sharing buckets
    factor = optimizer_factor("adamw")
    checked = 0
    for n in g:
        labels = g.nodes[n]["configs"]
        cost, comm = g.nodes[n]["cost"], g.nodes[n]["comm_s"]
        for i, c in enumerate(g.nodes[n]["configurations"]):
            if c.options != ("zero1",):
                continue
            base = labels.index(base_configuration(c).label)
            two = labels.index(c.label.replace("zero1", "zero2"))
            label3 = c.label.replace("zero1", "zero3")
            three = labels.index(label3) if label3 in labels else None
            saved1, saved2 = cost[base, 1] - cost[i, 1], cost[base, 1] - cost[two, 1]
            # zero1 saves (b - s) x the AdamW state factor, zero2 (b - s) x (1 + factor)
            assert saved1 > 0 and saved1 % factor == 0, (n, c.label, saved1)
            assert saved2 * factor == pytest.approx(saved1 * (1 + factor), rel=1e-12), (n, c.label)
            if three is not None:
                assert cost[three, 1] <= cost[two, 1] + 1e-9
            # zero1 adds an all-gather; zero2 swaps the (bucketed) all-reduce for a reduce-scatter
            assert comm[i] > comm[base], (n, c.label)
            swap = 0.0
            computed, shapes = dict(g.nodes[n]["configurations"][base].params), gpt.nx.nodes[n]["params"]
            for key in state_layouts(c, shapes, mesh):  # the parameters whose state zero shards
                b = _bytes(shapes[key], computed[key], mesh, "float32")
                axes = dict(c.grad_sync_axes)[key]
                swap += comm_model.time_s("reduce_scatter", b, axes)
                swap -= grad_all_reduce_time_s(comm_model, b, axes, bucketed)
            assert comm[two] - comm[i] == pytest.approx(swap, rel=1e-9, abs=1e-15), (n, c.label)
            assert g.nodes[n]["buffer_bytes"][i] > 0
            checked += 1
    assert checked >= 8


def test_all_options_frontier_is_at_least_as_lean(graphs, all_options):
    _, opt = graphs
    lean = min(p.cost[1] for p in frontier.solve(opt))
    points = frontier.solve(all_options)
    assert min(p.cost[1] for p in points) <= lean * (1 + 1e-12)
    for p in points[:: max(1, len(points) // 4)]:
        assert plan_breakdown(all_options, p.assignment)["memory_bytes"] == pytest.approx(p.cost[1], rel=1e-9)
