"""Planned gradient accumulation (issue 25): what a micro-batch plan's step pays once and per
micro-batch, its memory, and the frontier over counts and splits together."""

from __future__ import annotations

import dataclasses

import pytest

from estimators.collectives import grad_all_reduce_time_s
from estimators.compute import optimizer_time_s
from estimators.op_costs import CostModel, GraphInfo, _bytes
from estimators.options import option_node_cost
from estimators.profiles import load_cluster
from tensoropt.accumulation import micro_batch_counts, pareto_over_counts, price_micro_batches
from tensoropt.config import ConfigError, Job
from tensoropt.configspace import configurations
from tensoropt.configspace.configuration import Mesh
from tensoropt.configspace.options import with_options
from tensoropt.planner import PlanningError, capture_job, job_cost_graph, micro_batch_job, plan_job
from tensoropt.summary import plan_layers

MLP = {"name": "mlp", "kwargs": {"in_features": 64, "hidden": [256, 256], "num_classes": 16}}


def _job(micro_batches, batch=16, **training):
    return Job.from_dict({"model": MLP, "cluster": "cpu-local", "devices": [2],
                          "training": {"global_batch_size": batch, "micro_batches": micro_batches,
                                       **training},
                          "planner": {"epsilon": 0}})


def _key(plan):
    return plan.micro_batches, round(plan.time_s, 12), round(plan.memory_bytes)


def test_the_step_part_is_the_deferrable_sync_and_the_optimizer_step():
    """A batch-split linear: its once-per-step time is the gradient all-reduce and the optimizer
    step; under ZeRO-3 the gathers and the reduce-scatter stay out of it (paid per micro-batch)."""
    job = _job(1)
    graph = capture_job(job)
    cluster = load_cluster("cpu-local")
    mesh = Mesh.for_cluster(2, cluster.devices_per_node)
    model = CostModel(cluster, mesh, "adamw")
    info = GraphInfo.of(graph.nx, model.rules)
    node = graph.nx.nodes["linear"]
    confs = with_options(graph.nx, configurations(graph, mesh), mesh, ["zero3"], lambda n: False)["linear"]
    batch = next(c for c in confs if c.label == "batch=2")
    zero3 = next(c for c in confs if c.label.startswith("batch=2") and "zero3" in c.options)
    plain = option_node_cost(model, info, "linear", node, batch)
    stored = sum(_bytes(s, ("R",), mesh, "float32") for s in node["params"].values())
    assert plain.step_compute_s == pytest.approx(optimizer_time_s(cluster.device, stored, 2, "adamw"))
    bucketed = info.bucketed_grad_bytes(4)
    sync = sum(grad_all_reduce_time_s(model.comm, _bytes(s, ("R",), mesh, "float32"), (0,), bucketed)
               for s in node["params"].values())
    assert sync <= plain.step_comm_s <= plain.comm_s  # the all-reduce (and its share of bucket latency)
    sharded = option_node_cost(model, info, "linear", node, zero3)
    assert sharded.step_comm_s < plain.step_comm_s  # the all-reduce left the step's part
    per_micro_batch = sharded.comm_s - sharded.step_comm_s
    assert per_micro_batch > plain.comm_s - plain.step_comm_s  # gathers + reduce-scatter repeat


def test_every_plan_carries_its_count_and_auto_is_the_pareto_set_over_counts():
    auto = plan_job(_job("auto")).frontiers[0].plans
    assert all(isinstance(p.micro_batches, int) and "micro_batches" in p.to_json() for p in auto)
    assert {p.micro_batches for p in auto} > {1}
    counts = micro_batch_counts(16, "auto")
    union = [p for m in counts for p in plan_job(_job(m)).frontiers[0].plans]
    assert all(p.micro_batches == m for m in counts for p in plan_job(_job(m)).frontiers[0].plans[:1])
    pareto = {_key(q.plan) for _, q in pareto_over_counts([(p.micro_batches, _Point(p)) for p in union])}
    got = {_key(p) for p in auto}
    assert got <= pareto
    reached = max(p.micro_batches for p in auto)
    assert {k for k in pareto if k[0] <= reached} <= got
    assert min(p.memory_bytes for p in auto) < min(p.memory_bytes for p in union if p.micro_batches == 1)


@dataclasses.dataclass
class _Point:
    plan: object

    @property
    def cost(self):
        return self.plan.time_s, self.plan.memory_bytes


def _priced(job, m):
    """(cost graph priced for m micro-batches, its graph, the batch-split assignment)."""
    sub = micro_batch_job(job, m)
    graph = capture_job(sub)
    G = price_micro_batches(job_cost_graph(graph, sub, load_cluster("cpu-local"), 2), m)
    labels = {n: G.nodes[n]["configs"] for n in G}
    return G, graph, {n: "batch=2" if "batch=2" in ls else ls[0] for n, ls in labels.items()}


def test_a_micro_batch_plan_holds_one_micro_batch_of_activations_and_syncs_once():
    """The batch-split plan with 4 micro-batches of 4: the activations of the batch-4 plan, the
    parameters, gradients and optimizer state of the batch-16 plan; its time 4 x the batch-4
    step's less 3 x what is paid once (the gradient all-reduce, the optimizer step)."""
    four, whole, small = _priced(_job(4), 4), _priced(_job(1), 1), _priced(_job(1, batch=4), 1)
    rows = {name: plan_layers(G, graph, assignment)[0] for name, (G, graph, assignment)
            in (("four", four), ("whole", whole), ("small", small))}

    def total(name, part):
        return sum(getattr(x, part) for x in rows[name])

    assert total("four", "activation_bytes") == pytest.approx(total("small", "activation_bytes"))
    assert total("four", "activation_bytes") < total("whole", "activation_bytes") / 3
    for part in ("param_bytes", "grad_bytes", "optimizer_bytes"):
        assert total("four", part) == total("whole", part) > 0
    G, _, assignment = small
    once = sum(G.nodes[n]["step_compute_s"][G.nodes[n]["configs"].index(c)]
               + G.nodes[n]["step_comm_s"][G.nodes[n]["configs"].index(c)] for n, c in assignment.items())
    assert once > 0

    def step_s(name):
        return total(name, "compute_s") + total(name, "comm_s")

    assert step_s("four") == pytest.approx(4 * step_s("small") - 3 * once, rel=1e-9)


def test_micro_batches_that_divide_no_plan_s_batch_are_refused_with_the_key():
    with pytest.raises(ConfigError, match=r"training\.micro_batches: 3 does not divide the global batch"):
        _job(3)
    job = Job.from_dict({"model": MLP, "cluster": "cpu-local", "devices": [2],
                         "training": {"micro_batches": 5}})
    with pytest.raises(PlanningError, match=r"training\.micro_batches: 5 does not divide"):
        plan_job(job)  # the preset's batch, known only once the model is resolved


def test_a_micro_batch_step_s_terms_repeat_or_not_as_derived():
    """The zoo GPT's step term by term (:func:`tensoropt.accumulation.step_terms`) at 1 and 4
    micro-batches: the terms add up to the time the planner prices; the optimizer step and the
    deferred gradient synchronisation are the same (once per step), the host overhead is exactly 4
    times one micro-batch's (the same operators run 4 times), the roofline kernels of 4 quarter-size
    micro-batches cost more than the whole batch's (launches and weight reads repeat) and less than 4
    times; a model-parallel split's
    collectives repeat per micro-batch, the data-parallel plan's loss all-reduce too."""
    import numpy as np

    from tensoropt.accumulation import step_terms
    from tensoropt.data_parallel import data_parallel_assignment, plan_cost

    cluster = load_cluster("cpu-local")
    data = {"model": {"name": "gpt", "kwargs": {"layers": 1, "width": 64, "heads": 2, "seq_len": 32,
                                                "vocab_size": 128, "dropout": 0.0}},
            "cluster": "cpu-local", "devices": [2],
            "training": {"global_batch_size": 16, "optimizer": "adamw"}}
    job = Job.from_dict(data)
    terms = {}
    for m in (1, 4):
        sub = micro_batch_job(job, m)
        graph = capture_job(sub)
        G = job_cost_graph(graph, sub, cluster, 2)
        dp = data_parallel_assignment(G)
        split = {n: next((i for i, c in enumerate(G.nodes[n]["configs"]) if c.startswith("out=")), dp[n])
                 for n in G.nodes}  # every operator that can split its output does
        terms[m] = {"dp": step_terms(G, graph.nx, dp, m, cluster.device),
                    "split": step_terms(G, graph.nx, split, m, cluster.device)}
        priced = price_micro_batches(G, m)
        for name, a in (("dp", dp), ("split", split)):
            assert terms[m][name]["total"] == pytest.approx(float(plan_cost(priced, a)[0]), rel=1e-9)
    for name in ("dp", "split"):
        one, four = terms[1][name], terms[4][name]
        assert four["optimizer"] == pytest.approx(one["optimizer"]) and one["optimizer"] > 0
        assert four["grad_sync"] == pytest.approx(one["grad_sync"])
        assert four["overhead"] == pytest.approx(4 * one["overhead"]) and one["overhead"] > 0
        # the flops split into quarters; launches and the weights' reads repeat per micro-batch
        assert one["kernels"] < four["kernels"] < 4 * one["kernels"]
    assert terms[1]["dp"]["grad_sync"] > 0
    # the data-parallel plan's one blocking collective per micro-batch (the loss's), latency-bound: x 4
    assert terms[4]["dp"]["redistribution"] == pytest.approx(4 * terms[1]["dp"]["redistribution"], rel=0.01)
    moved = [terms[m]["split"]["comm"] + terms[m]["split"]["redistribution"] for m in (1, 4)]
    assert moved[0] > 0 and moved[1] > 2 * moved[0]  # each micro-batch's collectives: latency-bound here
    assert np.isfinite(moved).all()
