"""Weights tied across pipeline stages, priced (tensoropt/pipeline/tied_stages.py): the zoo GPT's
token embedding (stage 0) and its head (the last stage) share one parameter. The last stage pays for
its own copy (parameter, gradient and optimizer state: what the untied model's head pays for its own
weight) and both stages pay the all-reduce of the tied gradient between them once per step (in
``d``, the step's delta); against the same solver with the term left out, which prices neither."""

from __future__ import annotations

import pytest

import frontier as ft
from estimators.memory_parts import STATE_PARTS
from estimators.profiles import load_cluster
from frontier.pipeline import step_time_s
from tensoropt.config import Job
from tensoropt.pipeline.search import StageSolver, pipelined_frontier
from tensoropt.pipeline.stages import find_blocks
from tensoropt.planner import capture_job, job_cost_graph

GPT = {"name": "gpt", "kwargs": {"layers": 2, "width": 32, "heads": 2, "seq_len": 8, "vocab_size": 64}}
STAGE_DEVICES = 2  # 4 devices in 2 stages: a data-parallel sync of the copy where the plan splits the batch
M = 4


def _solver(tie: bool) -> StageSolver:
    model = {**GPT, "kwargs": {**GPT["kwargs"], "tie_weights": tie}}
    job = Job.from_dict({"model": model, "cluster": "cpu-local", "devices": [2 * STAGE_DEVICES],
                         "training": {"global_batch_size": 8}})
    graph = capture_job(job)
    G = job_cost_graph(graph, job, load_cluster("cpu-local"), STAGE_DEVICES)
    return StageSolver(G, graph, find_blocks(graph), M, lambda H: ft.solve(H))


def _untied_term(solver: StageSolver) -> StageSolver:
    """The same solver pricing no tie (what the planner did before ties were priced)."""
    solver.tie_pairs, solver._ties, solver.cache = [], {}, {}
    return solver


@pytest.fixture(scope="module")
def solvers():
    return _solver(True), _untied_term(_solver(True)), _solver(False)


def _head(solver: StageSolver) -> str:
    """The output head's operator (the tied weight's other user in the tied model)."""
    g = solver.g
    return next(n for n in g.nodes if g.nodes[n].get("module") == "head" and g.nodes[n].get("params"))


def _tie_key(solver: StageSolver) -> str:
    (key,) = solver.g.nodes[_head(solver)]["shared_params"]
    return key


def _all_reduce_s(cluster, nbytes: float) -> float:
    """2 ranks' ring all-reduce on the intra-node link (stages of 2 devices share a node here)."""
    link = cluster.intra_node
    return 2 * (link.latency_s + nbytes / 2 * link.seconds_per_byte)


def test_the_tie_is_found_between_the_first_and_the_last_stage(solvers):
    tied, _, untied = solvers
    key = _tie_key(tied)
    assert [(t.key, t.role) for t in tied.ties(0, 1)] == [(key, "owner")]
    assert [(t.key, t.role) for t in tied.ties(2, 3)] == [(key, "user")]
    assert tied.ties(0, 3) == [] and tied.ties(1, 2) == [] and untied.ties(2, 3) == []


@pytest.mark.parametrize("first,last", [(0, 1), (2, 3)])
def test_stages_pay_the_copy_and_the_all_reduce_of_the_tied_gradient(solvers, first, last):
    """Every plan of the stage's frontier, priced with and without the term: the per-micro-batch
    time is the same; the once-per-step part grows by the all-reduce (and, on the head's stage, the
    copy's sync and optimizer step: the untied head's once-per-step work); the head's stage holds
    the copy's state (the untied head's own weight's)."""
    tied, without, untied = solvers
    names = tied.canonical(first, last)
    head, u_head = _head(tied), _head(untied)
    key = _tie_key(tied)
    owners = [n for n in names if n != head and key in (tied.g.nodes[n].get("params") or {})]
    emb = owners[0] if first == 0 else None
    assert untied.G.nodes[u_head]["configs"] == tied.G.nodes[head]["configs"]
    cluster = tied.G.graph["cluster"]
    vectors = tied._solved(first, last, 2)
    H_with, H_without = tied._stage_graph(first, last, 2), without._stage_graph(first, last, 2)
    configs = set()
    for v in vectors:
        a = dict(zip(names, v))
        t1, d1, w1 = tied._price(H_with, a)
        t0, d0, w0 = without._price(H_without, a)
        assert t1 == pytest.approx(t0, rel=1e-12)
        if first == 0:  # the embedding's stage: its own gradient's all-reduce with the last stage
            c = a[emb]
            grad = float(tied.G.nodes[emb]["grad_bytes"][c])
            assert grad > 0 and d1 - d0 == pytest.approx(_all_reduce_s(cluster, grad), rel=1e-9)
            assert w1 == pytest.approx(w0, rel=1e-12)
        else:  # the head's stage: the copy's state and once-per-step work, as the untied head's
            c = a[head]
            own = sum(float(untied.G.nodes[u_head][p][c]) for p in STATE_PARTS)
            assert own > 0 and w1 - w0 == pytest.approx(own, rel=1e-9)
            grad = float(untied.G.nodes[u_head]["grad_bytes"][c])
            assert d1 - d0 == pytest.approx(untied.step_s[u_head][c] + _all_reduce_s(cluster, grad), rel=1e-9)
        configs.add(c)
    assert vectors and configs


def test_a_pipelined_plan_of_the_tied_model_prices_the_tie_in_its_step(solvers):
    tied, without, _ = solvers
    with_plans, _ = pipelined_frontier(tied, 2, "1F1B")
    without_plans, _ = pipelined_frontier(without, 2, "1F1B")
    assert min(p.point.time_s for p in with_plans) > min(p.point.time_s for p in without_plans)
    for p in with_plans:
        t = [o.time_s for o in p.options]
        d = [o.step_s for o in p.options]
        assert p.point.time_s == pytest.approx(step_time_s(max(t), sum(t), max(d), M), rel=1e-9)
