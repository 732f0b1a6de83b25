"""Stage frontiers from transfer tables and one sweep (tensoropt/pipeline/chain_stages.py) against the
FT solve of every stage graph: the same frontier (exact), or within the printed bound (boxed)."""

from __future__ import annotations

import numpy as np
import pytest

import frontier as ft
from estimators.profiles import load_cluster
from tensoropt.config import Job
from tensoropt.pipeline.chain_stages import ChainSettings, StageChain
from tensoropt.pipeline.search import StageSolver, pipelined_frontier
from tensoropt.pipeline.stages import find_blocks
from tensoropt.planner import capture_job, job_cost_graph

pytestmark = pytest.mark.timeout(1500)  # the FT solve of every stage graph, for comparison

LLAMA = {"factory": "tensoropt.models.hf:llama",
         "kwargs": {"num_hidden_layers": 4, "hidden_size": 32, "num_attention_heads": 2,
                    "num_key_value_heads": 1, "intermediate_size": 64, "vocab_size": 64,
                    "max_position_embeddings": 16},
         "inputs": {"input_ids": {"shape": [16], "dtype": "int64", "high": 64},
                    "labels": {"shape": [16], "dtype": "int64", "high": 64}}, "loss": "model"}
GPT = {"name": "gpt", "kwargs": {"layers": 3, "width": 32, "heads": 2, "seq_len": 8, "vocab_size": 64}}


def _solvers(model, options, devices=2, micro_batches=4):
    job = Job.from_dict({"model": model, "cluster": "cpu-local", "devices": [devices],
                         "training": {"global_batch_size": 1, "memory_options": options}})
    graph = capture_job(job)
    blocks = find_blocks(graph)
    G = job_cost_graph(graph, job, load_cluster("cpu-local"), devices)
    return (graph, blocks, G,
            lambda chain: StageSolver(G, graph, blocks, micro_batches, lambda H: ft.solve(H), chain=chain))


def _costs(options, m):
    return np.array([[o.time_s + o.step_s / m, o.memory_bytes] for o in options])


def _covered(points, by, factor):
    """Every row of ``points`` is weakly dominated by a row of ``by`` scaled down by ``factor``."""
    return all(((by[:, 0] <= factor * p[0]) & (by[:, 1] <= factor * p[1])).any() for p in points)


@pytest.mark.parametrize("model,options", [(LLAMA, ["zero3"]), (GPT, [])])
def test_every_stage_frontier_equals_the_stage_graphs_ft_solve(model, options):
    _, blocks, _, make = _solvers(model, options)
    old, new = make(None), make(ChainSettings())
    assert new.chain is not None and StageChain.applies(new)
    L, checked = blocks.count, 0
    for first in range(L):
        for last in range(first, L):
            if first == 0 and last == L - 1:
                continue
            for k in (2,):
                a, b = _costs(old.options(first, last, k), 4), _costs(new.options(first, last, k), 4)
                # the same set up to the summation order's rounding: each covers the other
                assert _covered(a, b, 1 + 1e-9) and _covered(b, a, 1 + 1e-9), (first, last, k)
                checked += 1
    assert new.solves == 0 and 0 < old.solves <= checked  # identical stages share a solve
    # one transfer table per block kind and k, one sweep step per block: not one solve per stage
    assert new.chain.eliminations <= 4 and new.chain.steps <= 3 * (L - 2)
    assert new.chain.bound == 0.0


def test_boxed_and_thinned_stage_frontiers_stay_within_the_printed_bound():
    _, blocks, _, make = _solvers(LLAMA, ["zero3"])
    exact = make(None)
    boxed = make(ChainSettings(step_epsilon=0.01, box_min_candidates=0.0, max_plans=5))
    L = blocks.count
    for first, last in ((0, 2), (1, 3), (2, L - 1), (3, L - 1)):
        a, b = _costs(exact.options(first, last, 2), 4), _costs(boxed.options(first, last, 2), 4)
        assert len(b) <= 5
        assert 0.0 < boxed.chain.bound < 1.0
        assert _covered(a, b, 1 + boxed.chain.bound + 1e-9)


def test_pipelined_frontier_through_the_chain_equals_the_solved_one():
    _, _, _, make = _solvers(LLAMA, ["zero3"])
    for p, schedule in ((2, "1F1B"), (3, "1F1B"), (2, "GPipe")):
        a, _ = pipelined_frontier(make(None), p, schedule)
        b, bound = pipelined_frontier(make(ChainSettings()), p, schedule)
        ca = np.array([[q.point.time_s, q.point.memory_bytes] for q in a])
        cb = np.array([[q.point.time_s, q.point.memory_bytes] for q in b])
        assert bound == 0.0 and len(ca) > 1
        assert _covered(ca, cb, 1 + 1e-9) and _covered(cb, ca, 1 + 1e-9)
        assert [q.point.blocks for q in b] and all(len(q.options) == p for q in b)


@pytest.mark.parametrize("model,options", [(LLAMA, ["zero3"]), (GPT, [])])
def test_one_set_of_three_objective_tables_gives_every_in_flight_counts_frontier(model, options):
    """The frontier at k projected from the tables in (time, memory at 1, memory at 5) equals the FT
    solve of the stage graph at k, for several k, with every table built once for all of them."""
    _, blocks, _, make = _solvers(model, options)
    old, new = make(None), make(ChainSettings(in_flight=(1, 5)))
    L = blocks.count
    for k in (1, 3, 5):
        for first in range(L):
            for last in range(first, L):
                if first == 0 and last == L - 1:
                    continue
                a, b = _costs(old.options(first, last, k), 4), _costs(new.options(first, last, k), 4)
                assert len(a) and len(b)
                assert _covered(a, b, 1 + 1e-9) and _covered(b, a, 1 + 1e-9), (first, last, k)
    # one set of tables for the three counts: no more eliminations and sweep steps than for one
    assert new.solves == 0 and new.chain.eliminations <= 4 and new.chain.steps <= 3 * (L - 2)
    assert all(F.cost.shape[1] == 3 for F in new.chain.finished.values())
    # the projection follows k: every stage's leanest option holds more at k = 5 than at k = 1
    for f in range(1, L - 1):
        assert (min(o.memory_bytes for o in new.options(f, f, 5))
                > min(o.memory_bytes for o in new.options(f, f, 1)))
    # a count outside the range gets its own two-objective tables, still equal to the solve
    a, b = _costs(old.options(1, 2, 7), 4), _costs(new.options(1, 2, 7), 4)
    assert _covered(a, b, 1 + 1e-9) and _covered(b, a, 1 + 1e-9)
    assert any(F.cost.shape[1] == 2 for F in new.chain.finished.values())


def test_stage_costs_read_off_the_cost_graph_equal_the_stage_graphs_sums():
    """A stage's time, memory and memory breakdown read off the cost graph (``StageSolver._read``:
    no stage graph built) equal the sums of its stage graph's entries, first, middle and last stages."""
    _, blocks, _, make = _solvers(LLAMA, ["recompute", "zero3"], micro_batches=8)
    solver = make(ChainSettings())
    L, checked = blocks.count, 0
    for first, last in ((0, 1), (1, 2), (2, 3), (1, 4), (3, L - 1)):
        for k in (3, 5):
            H = solver._stage_graph(first, last, k)
            for o in solver.options(first, last, k):
                a = o.assignment
                time_s = sum(H.nodes[n]["cost"][c, 0] for n, c in a.items()) + sum(
                    e["cost"][a[u], a[v], 0] for u, v, e in H.edges(data=True))
                memory = sum(H.nodes[n]["cost"][c, 1] for n, c in a.items()) + sum(
                    e["cost"][a[u], a[v], 1] for u, v, e in H.edges(data=True))
                assert solver._read(first, last, k, a)[::2] == pytest.approx((time_s, memory), rel=1e-9)
                assert solver._cost(first, last, k, a) == pytest.approx(solver._price(H, a), rel=1e-9)
                direct = solver._read(first, last, k, a)[3]
                assert direct.to_json() == pytest.approx(solver._memory(H, a).to_json(), rel=1e-9)
                walked = solver.memory(first, last, k, a)  # the kept plans' breakdown: the walk's transient
                assert walked.held_bytes == pytest.approx(direct.held_bytes, rel=1e-9)
                assert walked.to_json() == pytest.approx(
                    solver._memory(H, a, solver.backward_excess_bytes(first, last, a)).to_json(), rel=1e-9)
                checked += 1
    assert checked >= 10
