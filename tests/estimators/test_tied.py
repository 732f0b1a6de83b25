"""Tied parameters priced between their users (estimators/tied.py): the extra cost-graph edge, its
table against the redistributions the executor issues, and the exact frontier with it."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from tied_models import VOCAB, WIDTH, TiedLM

import frontier
from estimators.breakdown import plan_breakdown
from estimators.profiles import load_cluster
from estimators.redistribution import redistribution_steps
from estimators.tied import tied_pairs
from frontier.reference import brute_force
from tensoropt.capture import capture
from tensoropt.cost_graph import cost_graph
from tensoropt.models.gpt import GPT
from tensoropt.summary import plan_layers


def _capture(tie: bool = True):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return capture(TiedLM(tie), (torch.randint(0, VOCAB, (4, 8)), torch.randint(0, VOCAB, (4, 8))))


@pytest.fixture(scope="module")
def tied():
    return _capture()


def _tie_edge(cg):
    edges = [(u, v, d) for u, v, d in cg.edges(data=True) if d.get("tied_params")]
    assert len(edges) == 1, edges
    return edges[0]


def _index(cg, node, label):
    return cg.nodes[node]["configs"].index(label)


def test_one_edge_from_the_first_user_to_the_other(tied):
    pairs = tied_pairs(tied.nx)
    kinds = [(tied.nx.nodes[u]["kind"], tied.nx.nodes[v]["kind"]) for u, v, _ in pairs]
    assert kinds == [("embedding", "linear")]
    key = pairs[0][2]  # the exported program's name for the one tensor
    assert key in ("emb.weight", "head.weight") and key in tied.nx.nodes[pairs[0][1]]["shared_params"]
    untied = _capture(tie=False)
    assert tied_pairs(untied.nx) == []
    cg = cost_graph(tied, "cpu-local", 2)
    u, v, d = _tie_edge(cg)
    assert (u, v) == pairs[0][:2] and d["tied"] and d["tied_params"] == [key]
    assert d["cost"].shape == (len(cg.nodes[u]["configs"]), len(cg.nodes[v]["configs"]), 2)
    assert not any(e.get("tied_params") for *_, e in cost_graph(untied, "cpu-local", 2).edges(data=True))


def test_table_prices_what_the_executor_redistributes(tied):
    """Same layout and both users batch-split: the gradients are summed and synchronised once at the
    embedding (its node cost): nothing on the edge. Embedding out=2 (weight S(1)) against a
    batch-split head (weight R, gradient partial): an all-gather forward and a reduce-scatter back,
    plus the head's saved copy of the gathered weight; a head with the weight in the embedding's
    layout (in=2: S(1)) costs nothing."""
    cl = load_cluster("cpu-local")
    cg = cost_graph(tied, cl, 2)
    u, v, d = _tie_edge(cg)
    table = d["comm_s"]
    assert table[_index(cg, u, "batch=2"), _index(cg, v, "batch=2")] == 0.0
    assert table[_index(cg, u, "out=2"), _index(cg, v, "in=2")] == 0.0
    assert d["memory_bytes"][_index(cg, u, "out=2"), _index(cg, v, "in=2")] == 0.0
    moved = table[_index(cg, u, "out=2"), _index(cg, v, "batch=2")]
    mesh, shape = cg.graph["mesh"], (VOCAB, WIDTH)
    fwd = redistribution_steps(shape, 4, ("S(1)",), ("R",), mesh.shape)
    bwd = redistribution_steps(shape, 4, ("P",), ("S(1)",), mesh.shape)
    assert [k for k, *_ in fwd] == ["all_gather"] and [k for k, *_ in bwd] == ["reduce_scatter"]
    from estimators.collectives import CommModel
    comm = CommModel(cl, mesh)
    # each collective a blocking one: its fit plus a sync point (issue 29)
    expected = (sum(comm.blocking_time_s(k, n, (a,)) for k, n, a in fwd + bwd)
                + 2 * cl.device.redistribute_overhead_s)
    assert moved == pytest.approx(expected, rel=1e-12)
    assert d["memory_bytes"][_index(cg, u, "out=2"), _index(cg, v, "batch=2")] == VOCAB * WIDTH * 4
    # a replicated embedding computed on the whole batch and a batch-split head: the head's partial
    # gradient is all-reduced on the way back (nobody else synchronises it)
    rep = table[_index(cg, u, "replicate"), _index(cg, v, "batch=2")]
    ar = redistribution_steps(shape, 4, ("P",), ("R",), mesh.shape)
    assert rep == pytest.approx(sum(comm.blocking_time_s(k, n, (a,)) for k, n, a in ar)
                                + cl.device.redistribute_overhead_s, rel=1e-12)


def test_breakdown_and_plan_rows_name_the_tie(tied):
    cg = cost_graph(tied, "cpu-local", 2)
    u, v, d = _tie_edge(cg)
    assignment = {n: 0 for n in cg}
    assignment[u], assignment[v] = _index(cg, u, "out=2"), _index(cg, v, "batch=2")
    b = plan_breakdown(cg, assignment)
    rows = [r for r in b["redistributions"] if r.get("tied_param")]
    assert len(rows) == 1 and rows[0]["from_layout"] == ["S(1)"] and rows[0]["to_layout"] == ["R"]
    assert rows[0]["comm_s"] == d["comm_s"][assignment[u], assignment[v]] > 0
    _, moves = plan_layers(cg, tied, assignment)
    assert [m.tied_param for m in moves if m.tied_param] == d["tied_params"]


def test_exact_frontier_with_the_tie_matches_brute_force(tied):
    cg = cost_graph(tied, "cpu-local", 2)
    assert np.prod([len(cg.nodes[n]["configs"]) for n in cg]) < 200_000
    got, want = frontier.solve(cg), brute_force(cg)
    np.testing.assert_allclose([p.cost for p in got], [p.cost for p in want], rtol=1e-9)
    for p in got:  # every plan's cost includes its tie edge's entry
        assert plan_breakdown(cg, p.assignment)["time_s"] == pytest.approx(p.cost[0], rel=1e-9)


def test_gpt_tie_joins_token_embedding_and_head():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = capture(GPT(vocab_size=64, seq_len=8, layers=1, width=32, heads=4, dropout=0.0),
                    (torch.randint(0, 64, (4, 8)), torch.randint(0, 64, (4, 8))))
    cg = cost_graph(g, "cpu-local", 2)
    u, v, d = _tie_edge(cg)
    assert cg.nodes[u]["kind"] == "embedding" and cg.nodes[v]["kind"] == "linear"
    assert d["tied_params"][0] in ("wte.weight", "head.weight")
    points = frontier.solve(cg)
    assert points and all(np.isfinite(p.cost).all() for p in points)


def _job():
    from tensoropt.config import Job

    return Job.from_dict({
        "model": {"factory": "tied_models:TiedLM",
                  "inputs": {"tokens": {"shape": [8], "dtype": "int64", "high": VOCAB},
                             "labels": {"shape": [8], "dtype": "int64", "high": VOCAB}}},
        "training": {"global_batch_size": 4, "optimizer": "sgd", "learning_rate": 0.1},
        "cluster": "cpu-local", "devices": [2]})


def _plans(labels: dict[str, dict[str, str]]):
    """plan.json documents with the given configuration label per node kind (the rest replicated),
    and the cost graph they were read from."""
    from tensoropt.baselines import data_parallel_plan_json
    from tensoropt.planner import capture_job, job_cost_graph

    job = _job()
    graph = capture_job(job)
    G = job_cost_graph(graph, job, load_cluster(job.cluster), 2)
    base = data_parallel_plan_json(job, 2)
    plans = {}
    for name, by_kind in labels.items():
        placements = {}
        for n in base["placements"]:
            label = by_kind.get(G.nodes[n]["kind"], "replicate")
            placements[n] = G.nodes[n]["configurations"][_index(G, n, label)].to_json()
        plans[name] = {**base, "id": f"d2-{name}", "placements": placements}
    return job, G, plans


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_the_replayed_program_issues_the_tie_collectives(tmp_path):
    """Collectives in the replayed program, rank 0, against what the cost graph prices: everything
    replicated issues none; a batch-split head (the weight replicated at both users) sums a partial
    gradient nobody else reduces: the tie's all-reduce (of the 64 x 16 weight, seen in the program),
    beside the all-gathers of its output (for the replicated loss) and of its input's gradient (for
    the replicated tanh); an embedding with its weight split (out=2) and a replicated head: the
    weight's all-gather (the tie), plus the activation's. The tie edge prices exactly those two
    plans' tie collectives (non-zero entries); before it, neither was priced."""
    import json
    import os

    from tensoropt.executor.job.spec import TrainSpec
    from tensoropt.launch import LaunchOptions, launch_workers

    cases = {"rep": {}, "head-batch": {"linear": "batch=2"},
             "emb-out": {"embedding": "out=2", "elementwise": "out=2"}}
    job, G, plans = _plans(cases)
    tie_u, tie_v, tie = _tie_edge(G)
    priced = []
    for plan in plans.values():
        labels = {n: c["label"] for n, c in plan["placements"].items()}
        priced.append(tie["comm_s"][_index(G, tie_u, labels[tie_u]), _index(G, tie_v, labels[tie_v])] > 0)
    assert priced == [False, True, True]
    spec = TrainSpec.from_job(job, steps=2)
    runs = [{"spec": spec.to_json(), "plan": plan, "executor": {"mode": "replay"},
             "metrics": str(tmp_path / f"{name}.json"), "params_out": str(tmp_path / f"{name}.pt")}
            for name, plan in plans.items()]
    here = os.path.dirname(os.path.abspath(__file__))
    rc = launch_workers({"steps": 2, "runs": runs}, LaunchOptions(2, timeout_s=240),
                        env={"PYTHONPATH": here, "TENSOROPT_COLLECTIVE_TIMEOUT_S": "60"})
    assert rc == 0
    collectives = {name: json.loads((tmp_path / f"{name}.json").read_text())["executor"]["collectives"]
                   for name in cases}
    assert collectives == {"rep": 0, "head-batch": 3, "emb-out": 2}, collectives


def test_a_tie_between_adjacent_users_adds_to_their_data_edge():
    """The same square weight applied twice in a row: the tie's table is added to the data edge
    (no second edge), and the frontier still matches brute force."""
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(WIDTH, WIDTH))

        def forward(self, x):
            return torch.nn.functional.linear(torch.nn.functional.linear(x, self.w), self.w).sum()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = capture(Twice(), (torch.randn(4, WIDTH),))
    [(u, v, key)] = tied_pairs(g.nx)
    assert g.nx.has_edge(u, v)
    plain = cost_graph(g, "cpu-local", 2)
    e = plain.edges[u, v]
    assert e["tied_params"] == [key] and not e.get("tied")
    assert not any(d.get("tied") for *_, d in plain.edges(data=True))
    got, want = frontier.solve(plain), brute_force(plain)
    np.testing.assert_allclose([p.cost for p in got], [p.cost for p in want], rtol=1e-9)
