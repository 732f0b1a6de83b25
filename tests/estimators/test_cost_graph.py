"""The cost graph: frontier.solve's format, the real configuration space, breakdown, profiled mode."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from est_plans import MLP, TinyGPT, gpt_inputs, mlp_inputs, mlp_plans

from estimators.breakdown import plan_breakdown
from estimators.profiled import ProfiledCompute
from estimators.profiles import load_cluster
from tensoropt.capture import capture
from tensoropt.cost_graph import cost_graph


@pytest.fixture(scope="module")
def gpt():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return capture(TinyGPT(), gpt_inputs())


def test_format_matches_frontier_solve(gpt):
    cg = cost_graph(gpt, "cpu-local", 4)
    assert cg.graph["mesh"].shape == (2, 2) and cg.graph["num_devices"] == 4
    for _, d in cg.nodes(data=True):
        c = len(d["configs"])
        assert d["cost"].shape == (c, 2) and d["cost"].dtype == np.float64
        assert [x.label for x in d["configurations"]] == d["configs"] and len(set(d["configs"])) == c
        assert np.all(np.isfinite(d["cost"])) and np.all(d["cost"] >= 0)
        assert "op" in d and "module" in d
    for u, v, d in cg.edges(data=True):
        assert d["cost"].shape == (len(cg.nodes[u]["configs"]), len(cg.nodes[v]["configs"]), 2)
        assert np.all(np.isfinite(d["cost"])) and np.all(d["cost"] >= 0)


def test_frontier_plans_recompute_through_breakdown(gpt):
    import frontier

    cg = cost_graph(gpt, "cpu-local", 2)
    points = frontier.solve(cg)
    assert len(points) >= 2
    for p in points:
        b = plan_breakdown(cg, p.assignment)
        assert b["time_s"] == pytest.approx(p.cost[0], rel=1e-9)
        assert b["memory_bytes"] == pytest.approx(p.cost[1], rel=1e-9)
        assert b["peak_memory_bytes"] >= b["memory_bytes"]
        assert {row["node"] for row in b["layers"]} >= {n for n in cg if cg.nodes[n]["kind"] != "input"}


def test_more_devices_less_memory_for_the_leanest_plan(gpt):
    import frontier

    lean = [min(p.cost[1] for p in frontier.solve(cost_graph(gpt, "cpu-local", n))) for n in (1, 2, 4)]
    assert lean[0] > lean[1] > lean[2]


def test_objectives_and_bad_input():
    g = capture(MLP(), mlp_inputs())
    plan = {k: [v] for k, v in mlp_plans()["tp"].items()}
    cg = cost_graph(g, "h100x8", 2, objectives=("memory_bytes", "comm_s", "time_s"), configurations=plan)
    assert cg.nodes["linear_1"]["cost"].shape == (1, 3)
    assert cg.nodes["linear_1"]["cost"][0, 1] > 0  # the row-parallel partial sum is all-reduced
    with pytest.raises(ValueError, match="objective"):
        cost_graph(g, "h100x8", 2, objectives=("energy_j",), configurations=plan)
    with pytest.raises(ValueError, match="has 8 devices"):
        cost_graph(g, "h100x8", 16, configurations={})
    with pytest.raises(ValueError, match="batch"):
        cost_graph(g, "h100x8", 2, batch_size=64, configurations=plan)
    with pytest.raises(ValueError, match="optimizer"):
        cost_graph(g, "h100x8", 2, optimizer="lion", configurations=plan)
    assert (
        cost_graph(g, load_cluster("h100x8"), 2, batch_size=16, configurations=plan).graph["cluster"].name
        == "h100x8"
    )


def test_profiled_mode_times_local_shards_and_caches(tmp_path):
    g = capture(MLP(), mlp_inputs())
    plan = {k: [v] for k, v in mlp_plans()["dp"].items()}
    cg = cost_graph(g, "cpu-local", 2, compute_mode="profiled", cache_dir=tmp_path, configurations=plan)
    cache = json.loads((tmp_path / "cpu.json").read_text())
    assert len(cache) >= 3  # linear, relu, linear_1, cross entropy: one entry per local shape
    assert all(f > 0 for f, _ in cache.values())
    roof = cost_graph(g, "cpu-local", 2, configurations=plan)
    assert cg.nodes["linear"]["compute_s"][0] != roof.nodes["linear"]["compute_s"][0]
    # a second build reads the cache: planted values come back
    planted = {k: [1.0, 2.0] for k in cache}
    (tmp_path / "cpu.json").write_text(json.dumps(planted))
    again = cost_graph(g, "cpu-local", 2, compute_mode="profiled", cache_dir=tmp_path, configurations=plan)
    overhead = load_cluster("cpu-local").device.op_overhead_local_s  # the executor's, a batch-split relu
    assert again.nodes["relu"]["compute_s"][0] == pytest.approx(3.0 + overhead)


def test_profiled_cache_key_separates_shapes_and_devices(tmp_path):
    g = capture(MLP(), mlp_inputs())
    fx = g.program
    timer = ProfiledCompute(load_cluster("cpu-local").device, fx, cache_dir=tmp_path, repeats=1)
    dp = cost_graph(g, "cpu-local", 2, configurations={k: [v] for k, v in mlp_plans()["dp"].items()})
    from estimators.op_costs import GraphInfo, local_op

    info = GraphInfo.of(g.nx)
    mesh = dp.graph["mesh"]
    ops = [
        local_op(g.nx.nodes["linear"], dp.nodes["linear"]["configurations"][0], mesh, info),
        local_op(g.nx.nodes["linear"], mlp_plans()["tp"]["linear"], mesh, info),
    ]
    for op in ops:
        assert timer("linear", g.nx.nodes["linear"], None, op) is not None
    assert timer.measured == 2 and len(json.loads(timer.path.read_text())) == 4  # each on both clocks
    assert timer("linear", g.nx.nodes["linear"], None, ops[0]) is not None and timer.hits == 1


def test_profiled_timing_beside_co_running_ranks(tmp_path, monkeypatch):
    """On a CPU the host's other ranks run the same op while it is timed; their timings are kept apart."""
    import threading

    import estimators.profiled as profiled
    from estimators.op_costs import GraphInfo, local_op

    g = capture(MLP(), mlp_inputs())
    dp = cost_graph(g, "cpu-local", 2, configurations={k: [v] for k, v in mlp_plans()["dp"].items()})
    op = local_op(g.nx.nodes["linear"], dp.nodes["linear"]["configurations"][0], dp.graph["mesh"],
                  GraphInfo.of(g.nx))
    calls = {"co": 0}
    fx_node = {n.name: n for n in g.program.graph.nodes}["linear"]
    real = fx_node.target

    def counted(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            calls["co"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(fx_node, "target", counted)
    device = load_cluster("cpu-local").device
    before = threading.active_count()
    alone = ProfiledCompute(device, g.program, cache_dir=tmp_path, repeats=3)
    beside = ProfiledCompute(device, g.program, cache_dir=tmp_path, repeats=3, co_runners=2)
    assert alone("linear", g.nx.nodes["linear"], None, op) is not None and calls["co"] == 0
    assert beside("linear", g.nx.nodes["linear"], None, op) is not None and calls["co"] > 0
    assert threading.active_count() == before  # the co-runners stopped with the timing
    assert len(json.loads(beside.path.read_text())) == 4  # alone and beside 2 ranks, each on both clocks
    node = g.nx.nodes["linear"]
    assert profiled.cache_key("cpu", node, op, 2) != profiled.cache_key("cpu", node, op)
    gpu = ProfiledCompute(load_cluster("h100x8").device, g.program, cache_dir=tmp_path, co_runners=7)
    assert gpu.co_runners == 0  # a GPU is timed alone: its ranks do not share it


def test_the_thread_clock_leaves_out_what_the_host_gave_others(tmp_path, monkeypatch):
    """A CPU op is timed on its thread's CPU time: the time the thread spends off a core (here a 40 ms
    sleep inside the op, as a loaded host's run queue would take it) is not priced; the same runs' wall
    times are filed too, and a wall-clock cost graph reads them without timing again."""
    import time

    import estimators.profiled as profiled
    from estimators.op_costs import GraphInfo, local_op

    g = capture(MLP(), mlp_inputs())
    plan = {k: [v] for k, v in mlp_plans()["dp"].items()}
    dp = cost_graph(g, "cpu-local", 2, configurations=plan)
    op = local_op(g.nx.nodes["linear"], dp.nodes["linear"]["configurations"][0], dp.graph["mesh"],
                  GraphInfo.of(g.nx))
    fx_node = {n.name: n for n in g.program.graph.nodes}["linear"]
    real = fx_node.target

    def descheduled(*args, **kwargs):  # off the core for 40 ms, then the real GEMM
        time.sleep(0.04)
        return real(*args, **kwargs)

    monkeypatch.setattr(fx_node, "target", descheduled)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a worker's one thread
    cluster = load_cluster("cpu-local")
    device, co_runners = cluster.device, min(2, cluster.devices_per_node) - 1  # as cost_graph times
    assert profiled.timing_clock(device.kind) == "thread"
    timer = ProfiledCompute(device, g.program, cache_dir=tmp_path, repeats=3, co_runners=co_runners)
    fwd, _ = timer("linear", g.nx.nodes["linear"], None, op)
    wall_fwd, _ = json.loads(timer.path.read_text())[
        profiled.cache_key("cpu", g.nx.nodes["linear"], op, co_runners)]
    assert wall_fwd >= 0.04 > 0.01 > fwd  # the sleep is wall time, not the thread's CPU time
    monkeypatch.setattr(fx_node, "target", real)
    walled = cost_graph(g, "cpu-local", 2, compute_mode="profiled", cache_dir=tmp_path, configurations=plan,
                        profile_clock="wall")
    assert walled.nodes["linear"]["compute_s"][0] > 0.04  # the filed wall means, not a new timing
    with pytest.raises(ValueError, match="clock must be 'thread' or 'wall'"):
        ProfiledCompute(device, g.program, cache_dir=tmp_path, clock="cpu")


def test_a_linear_is_keyed_as_the_gemm_it_computes():
    """(16, 64, 512) and (8, 128, 512) are one (1024 x 512) product: one timing, not two noisy ones."""
    import estimators.profiled as profiled
    from estimators.compute import LocalOp

    node = {"op": "aten.linear.default", "attrs": {}}

    def linear(*lead):
        return LocalOp("linear", "float32", 0.0, ((*lead, 512),), ("float32",), ((2048, 512), (2048,)),
                       (*lead, 2048), True, (True,))

    key = profiled.cache_key
    assert key("cpu", node, linear(16, 64)) == key("cpu", node, linear(8, 128))
    assert key("cpu", node, linear(16, 64)) == key("cpu", node, linear(1024))
    assert key("cpu", node, linear(8, 64)) != key("cpu", node, linear(16, 64))
    matmul = {"op": "aten.matmul.default", "attrs": {}}  # a batched matmul is not one GEMM: kept apart
    assert key("cpu", matmul, linear(16, 64)) != key("cpu", matmul, linear(8, 128))
