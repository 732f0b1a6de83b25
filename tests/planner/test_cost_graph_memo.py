"""The non-solver phases of ``tensoropt plan`` reuse work across identical layers without changing it.

A tiny HF Llama with 3 identical decoder layers, bf16-mixed, every memory option, on the
8-GPU-node H100 cluster at 8 devices (full space) and 16 (hierarchical): the configuration space
enumerated once per operator signature equals the one enumerated node by node, and the cost graph
priced with its caches (identical operators and edges priced once) equals the one priced node by
node and edge by edge (every label, configuration and array). Capture without stack traces gives
the same operator graph and program as torch.export with them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="the HuggingFace tests need the dev extra (transformers 5.x)")

from tensoropt.capture import capture  # noqa: E402
from tensoropt.capture.assertions import drop_no_data_ops  # noqa: E402
from tensoropt.capture.graph import build_graph  # noqa: E402
from tensoropt.config import Job  # noqa: E402
from tensoropt.configspace import configurations  # noqa: E402
from tensoropt.configspace.configuration import Mesh  # noqa: E402
from tensoropt.cost_graph import cost_graph  # noqa: E402
from tensoropt.models import example_inputs  # noqa: E402
from tensoropt.planner import build_job_model, capture_job, load_job_cluster, resolve_job  # noqa: E402

OPTIONS = ["recompute", "zero1", "zero2", "zero3"]


def _job() -> Job:
    return Job.from_dict({
        "model": {
            "factory": "tensoropt.models.hf:llama",
            "kwargs": {"num_hidden_layers": 3, "hidden_size": 64, "num_attention_heads": 4,
                       "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256,
                       "max_position_embeddings": 32},
            "inputs": {"input_ids": {"shape": [32], "dtype": "int64", "high": 256},
                       "labels": {"shape": [32], "dtype": "int64", "high": 256}},
            "loss": "model",
        },
        "training": {"global_batch_size": 16, "optimizer": "adamw", "precision": "bf16-mixed",
                     "memory_options": OPTIONS},
        "cluster": "h100-128x8-ib",
        "devices": [8, 16],
    })


@pytest.fixture(scope="module")
def planned():
    job = _job()
    cluster = load_job_cluster(job)
    model, spec = build_job_model(job, "meta")
    job = resolve_job(job, spec, cluster)
    return job, cluster, (model, spec), capture_job(job, (model, spec))


def _price(job, cluster, graph, devices, memoise):
    mesh = Mesh.for_cluster(devices, cluster.devices_per_node)
    configs = configurations(graph, mesh, whole_levels=job.planner.hierarchical_for(devices), memoise=memoise)
    G = cost_graph(graph, cluster, devices, batch_size=job.training.global_batch_size,
                   optimizer=job.training.optimizer, memory_options=job.training.memory_options,
                   configurations=configs, precision=job.training.precision, memoise=memoise)
    return configs, G


def _assert_same_attrs(a: dict, b: dict, where: str) -> None:
    assert set(a) == set(b), where
    for k in a:
        if isinstance(a[k], np.ndarray):
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), f"{where}: {k}"
        else:
            assert a[k] == b[k], f"{where}: {k}"


@pytest.mark.parametrize("devices", [8, 16])
def test_cached_configurations_and_cost_graph_equal_node_by_node(planned, devices):
    job, cluster, _, graph = planned
    configs, G = _price(job, cluster, graph, devices, memoise=True)
    plain_configs, plain = _price(job, cluster, graph, devices, memoise=False)
    assert configs == plain_configs
    assert list(G.nodes) == list(plain.nodes) and list(G.edges) == list(plain.edges)
    assert {k: v for k, v in G.graph.items() if k != "cluster"} == {
        k: v for k, v in plain.graph.items() if k != "cluster"}
    for n in G.nodes:
        _assert_same_attrs(G.nodes[n], plain.nodes[n], n)
    for u, v in G.edges:
        _assert_same_attrs(G.edges[u, v], plain.edges[u, v], f"{u} -> {v}")
    # the options were on and the layers are identical: the caches had something to share
    layers = [[n for n in G.nodes if G.nodes[n]["module"].startswith(f"model.model.layers.{i}")]
              for i in range(3)]
    assert len(layers[0]) == len(layers[2]) > 10
    assert any("zero3" in label for n in layers[0] for label in G.nodes[n]["configs"])
    for a, c in zip(layers[0], layers[2]):
        assert np.array_equal(G.nodes[a]["cost"], G.nodes[c]["cost"])
    # ... but each node owns its arrays: changing one layer's costs leaves the others alone
    a, c = layers[0][0], layers[2][0]
    before = G.nodes[c]["cost"].copy()
    G.nodes[a]["cost"] += 1.0
    assert np.array_equal(G.nodes[c]["cost"], before)


def test_capture_without_stack_traces_gives_the_same_graph(planned):
    job, _, (model, spec), graph = planned
    inputs = example_inputs(spec, job.training.global_batch_size, device="meta", model=model)
    model = model.to(torch.bfloat16)
    inputs = tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in inputs)
    before = torch.fx.config.do_not_emit_stack_traces
    ep = torch.export.export(model.train(), inputs, strict=False)  # what export_program did before
    drop_no_data_ops(ep)
    traced = build_graph(ep)
    fast = capture(model, inputs)
    assert torch.fx.config.do_not_emit_stack_traces == before  # restored
    assert any(n.meta.get("stack_trace") for n in ep.graph.nodes)
    assert not any(n.meta.get("stack_trace") for n in fast.program.graph.nodes)
    assert ep.graph_module.code == fast.program.graph_module.code
    assert list(traced.nx.nodes) == list(fast.nx.nodes) and list(traced.nx.edges) == list(fast.nx.edges)
    for n in traced.nx.nodes:
        assert repr(traced.nx.nodes[n]) == repr(fast.nx.nodes[n]), n
    for e in traced.nx.edges:
        assert repr(traced.nx.edges[e]) == repr(fast.nx.edges[e]), e
    assert repr(traced.nx.graph) == repr(fast.nx.graph)


def test_breakdown_rows_reused_across_plans_equal_fresh_ones(planned):
    """plan_breakdown keeps each (node, configuration) and (edge, pair) row on the cost graph:
    plans sharing choices read them back, with the same result as a walk from scratch."""
    import random

    from estimators.breakdown import _ROWS_KEY, plan_breakdown

    job, cluster, _, graph = planned
    _, G = _price(job, cluster, graph, 8, memoise=True)
    rng = random.Random(0)
    assignment = {n: rng.randrange(len(G.nodes[n]["configs"])) for n in G}
    for _ in range(4):
        reused = plan_breakdown(G, assignment)
        cache = G.graph.pop(_ROWS_KEY)
        assert cache[0] and cache[1]
        fresh = plan_breakdown(G, assignment)
        assert reused == fresh
        reused["layers"][0]["memory_bytes"] = -1.0  # the caller's rows are copies
        assert plan_breakdown(G, assignment) == fresh
        for n in rng.sample(sorted(G), len(G) // 4):
            assignment[n] = rng.randrange(len(G.nodes[n]["configs"]))


def test_frozen_heap_gives_the_objects_back_and_nests():
    import gc

    from tensoropt.planner import frozen_heap

    assert gc.get_freeze_count() == 0
    with frozen_heap():
        outer = gc.get_freeze_count()
        assert outer > 0
        with frozen_heap():  # an inner block does not unfreeze the outer one's objects
            pass
        # still frozen (an unfreeze would give 0); frozen objects that die by refcount leave the count
        assert gc.get_freeze_count() > outer // 2
    assert gc.get_freeze_count() == 0  # nothing left out of collection
    try:
        with frozen_heap():
            raise KeyError("x")
    except KeyError:
        pass
    assert gc.get_freeze_count() == 0
