"""The bucketed gradient all-reduce is priced as the executor issues it (issue 16, G).

The executor (``tensoropt.executor.state.gradsync.GradSync``) starts the step's first bucket at
``FIRST_GRAD_BUCKET_BYTES``, later ones at ``GRAD_BUCKET_BYTES``, the rest after backward; one
all-reduce per bucket. The sums below are derived by hand from that rule on a link without
calibrated fits (``T(n) = 2a + n/B`` for an all-reduce on 2 devices).
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
from est_plans import TinyGPT, gpt_inputs

from estimators.collectives import (
    FIRST_GRAD_BUCKET_BYTES,
    GRAD_BUCKET_BYTES,
    CommModel,
    grad_all_reduce_time_s,
    grad_bucket_count,
    grad_bucket_fixed_s,
)
from estimators.layout_copies import bucket_copy_time_s
from estimators.op_costs import GraphInfo
from estimators.profiles import Link, load_cluster
from tensoropt.capture import capture
from tensoropt.configspace.configuration import Mesh
from tensoropt.cost_graph import cost_graph

MIB = 2**20
LATENCY_S, BANDWIDTH_GBPS = 1e-3, 1.0


def _flat_comm() -> CommModel:
    link = Link(bandwidth_gbps=BANDWIDTH_GBPS, latency_s=LATENCY_S)
    cluster = dataclasses.replace(load_cluster("cpu-local"), fits=(), intra_node=link, inter_node=link)
    return CommModel(cluster, Mesh((2,), ("gpu",)))


def _executor_buckets(sizes: list[int]) -> list[int]:
    """The executor's buckets (bytes) for gradients arriving in ``sizes``' order (GradSync.add)."""
    buckets, open_bytes = [], 0
    for b in sizes:
        open_bytes += b
        if open_bytes >= (GRAD_BUCKET_BYTES if buckets else FIRST_GRAD_BUCKET_BYTES):
            buckets.append(open_bytes)
            open_bytes = 0
    return buckets + ([open_bytes] if open_bytes else [])


def test_bucket_count_is_the_executors():
    for sizes in ([8 * MIB] * 6, [512 * 1024] * 2, [4096] * 10, [3 * MIB] * 40, [MIB // 2] * 300):
        assert grad_bucket_count(sum(sizes)) == len(_executor_buckets(sizes)), sizes


def test_medium_gradients_share_their_buckets_latency():
    """Six 8 MiB gradients: buckets 8, 32 and 8 MiB, three all-reduces, 6a + 48 MiB / B in all."""
    comm = _flat_comm()
    sizes = [8 * MIB] * 6
    assert _executor_buckets(sizes) == [8 * MIB, 32 * MIB, 8 * MIB]
    per_byte_s = 1 / (BANDWIDTH_GBPS * 1e9)
    by_hand_s = 3 * 2 * LATENCY_S + 48 * MIB * per_byte_s
    marginal_s = sum(grad_all_reduce_time_s(comm, b, (0,), bucketed_bytes=sum(sizes)) for b in sizes)
    priced_s = marginal_s + grad_bucket_fixed_s(comm, sum(sizes), (0,))
    assert priced_s == pytest.approx(by_hand_s, rel=1e-12)
    # the rule before charged each one a whole all-reduce: 12a + 48 MiB / B
    assert sum(grad_all_reduce_time_s(comm, b, (0,)) for b in sizes) == pytest.approx(
        6 * 2 * LATENCY_S + 48 * MIB * per_byte_s, rel=1e-12)
    # what replicating one saves: its bandwidth and 8/25 of a 25 MiB bucket's latency, not 2a
    saved_s = grad_all_reduce_time_s(comm, 8 * MIB, (0,), bucketed_bytes=48 * MIB)
    assert saved_s == pytest.approx(8 * MIB * per_byte_s + 2 * LATENCY_S * 8 / 25, rel=1e-12)


def test_dropping_a_gradient_that_leaves_the_bucket_count_saves_its_bytes():
    """BERT-like: three 0.5 MiB layer gradients, then a 1 MiB embedding gradient: buckets 1 and
    1.5 MiB with it, 1 and 0.5 MiB without. Replicating the embedding saves its bytes, not a
    latency (the rule before priced it a whole all-reduce, 2a + 1 MiB / B)."""
    comm = _flat_comm()
    with_embedding = [MIB // 2] * 3 + [MIB]
    assert len(_executor_buckets(with_embedding)) == 2
    assert len(_executor_buckets(with_embedding[:-1])) == 2
    saved_s = grad_all_reduce_time_s(comm, MIB, (0,), bucketed_bytes=sum(with_embedding))
    runtime_saves_s = MIB / (BANDWIDTH_GBPS * 1e9)  # same two all-reduces, 1 MiB fewer bytes
    assert runtime_saves_s < saved_s < runtime_saves_s + 2 * LATENCY_S / 10


def test_a_gradient_of_a_bucket_or_more_pays_its_own_all_reduce():
    comm = _flat_comm()
    big = 64 * MIB
    assert grad_all_reduce_time_s(comm, big, (0,), bucketed_bytes=MIB) == pytest.approx(
        2 * LATENCY_S + big / (BANDWIDTH_GBPS * 1e9), rel=1e-12)
    info = GraphInfo({}, {}, {}, {}, param_numels=(big // 4, MIB // 4, 256))
    assert info.bucketed_grad_bytes(4) == MIB + 1024  # the 64 MiB gradient is its own bucket


def test_data_parallel_plan_pays_one_all_reduce_per_bucket():
    """Every parameter of a tiny GPT synchronised: the plan's gradient sync is k all-reduces of the
    mean bucket, k = the executor's bucket count for the model's gradients (not one per tensor), and
    each gradient's copy into its bucket."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = capture(TinyGPT(causal=True, p_attn=0.0), gpt_inputs())
    cg = cost_graph(graph, "cpu-local", 2)
    comm = CommModel(load_cluster("cpu-local"), Mesh((2,), ("gpu",)))
    total_bytes, synced_s, tensors = 0, 0.0, 0
    for n in cg:
        node = graph.nx.nodes[n]
        if not node["params"]:
            continue
        configs = cg.nodes[n]["configurations"]
        i = next(i for i, c in enumerate(configs)
                 if dict(c.grad_sync_axes) and set(dict(c.grad_sync_axes)) == set(node["params"])
                 and not c.partial_axes and not c.options
                 and all(lay == ("R",) for lay in dict(c.params).values()))
        synced_s += float(cg.nodes[n]["comm_s"][i])
        shared = set(node.get("shared_params") or ())
        for key, shape in node["params"].items():
            if key not in shared:
                numel = 1
                for d in shape:
                    numel *= d
                total_bytes += 4 * numel
                tensors += 1
    k = grad_bucket_count(total_bytes)
    assert k < tensors
    copies = bucket_copy_time_s(comm.cluster.device, total_bytes)  # every gradient copied into its bucket
    assert synced_s == pytest.approx(k * comm.time_s("all_reduce", total_bytes / k, (0,)) + copies, rel=1e-9)
