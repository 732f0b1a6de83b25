"""The executor-overhead terms of the time model: calibration fits, profile keys, cost terms (torch-free)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from estimators.op_costs import CostModel, GraphInfo, edge_cost, node_cost
from estimators.overhead import (
    CLASS_SPLIT_CROSS_ENTROPY,
    batch_local,
    fit_overhead,
    node_overhead_s,
    runs_local,
)
from estimators.profiles import Device, ProfileError, load_cluster, load_device
from tensoropt.commands.calibrate import overhead_profile_keys
from tensoropt.configspace.configuration import Configuration, Mesh

MESH = Mesh((2,), ("gpu",))
BATCH = Configuration("batch=2", (("batch", (0,)),), (("S(0)",),), (("w", ("R",)),), ("S(0)",),
                      grad_sync_axes=(("w", (0,)),))
OUT = Configuration("out=2", (("out", (0,)),), (("R",),), (("w", ("S(0)",)),), ("S(1)",))
LINEAR = {"kind": "linear", "op": "aten.linear.default", "flops": 2 * 8 * 16 * 16, "out_shape": (8, 16),
          "out_dtype": "float32", "params": {"w": (16, 16)}, "shared_params": [],
          "inputs": [{"source": "x", "shape": (8, 16), "dtype": "float32"}],
          "operands": [{"role": "input", "index": 0}, {"role": "param", "key": "w"}]}


def _noisy(values, rng, rel=0.03):
    return [v * (1 + rng.uniform(-rel, rel)) for v in values]


def test_fit_recovers_base_and_per_operator_cost_from_noisy_timings():
    rng = random.Random(0)
    counts = [4, 10, 18, 34, 66]
    base, per_op = 4e-4, 3e-4
    fit_base, fit_per_op = fit_overhead(counts, _noisy([base + per_op * n for n in counts], rng))
    assert fit_per_op == pytest.approx(per_op, rel=0.1)
    assert fit_base == pytest.approx(base, rel=0.5, abs=2e-4)
    with pytest.raises(ValueError, match="two or more distinct"):
        fit_overhead([4, 4], [1e-3, 1e-3])


def test_profile_keys_subtract_the_plain_slope():
    rng = random.Random(1)
    counts = [4, 10, 18, 34]
    plain, local, dtensor = 3e-5, 6e-5, 4.3e-4  # seconds per operator, each way
    points = {way: [[n, t] for n, t in zip(counts, _noisy([2e-4 + per * n for n in counts], rng, 0.02))]
              for way, per in (("plain", plain), ("local", local), ("dtensor", dtensor))}
    points["redistribute"] = [[0, 1.5e-4]]
    keys = overhead_profile_keys(points, 2, "gloo")
    assert keys["op_overhead_local_s"] == pytest.approx(local - plain, rel=0.35)
    assert keys["op_overhead_dtensor_s"] == pytest.approx(dtensor - plain, rel=0.1)
    assert keys["redistribute_overhead_s"] == 1.5e-4
    assert set(keys["sources"]) == {"op_overhead_local_s", "op_overhead_dtensor_s", "redistribute_overhead_s"}
    # the fitted keys load as a device profile
    data = {"name": "x", "kind": "cpu", "peak_tflops": {"float32": 0.1}, "memory_bandwidth_gbps": 20,
            "memory_bytes": 2**30, "sources": {"peak_tflops": "a", "memory_bandwidth_gbps": "b",
                                                "memory_bytes": "c", **keys["sources"]}}
    data.update({k: v for k, v in keys.items() if k != "sources"})
    assert Device.from_dict(data).op_overhead_dtensor_s == keys["op_overhead_dtensor_s"]


def test_overhead_keys_need_a_citation_and_default_to_zero():
    assert load_device("h100-sxm-80gb").op_overhead_dtensor_s == 0.0
    data = {"name": "x", "kind": "cpu", "peak_tflops": {"float32": 0.1}, "memory_bandwidth_gbps": 20,
            "memory_bytes": 2**30, "op_overhead_dtensor_s": 1e-4,
            "sources": {"peak_tflops": "a", "memory_bandwidth_gbps": "b", "memory_bytes": "c"}}
    with pytest.raises(ProfileError, match="op_overhead_dtensor_s.*citation"):
        Device.from_dict(data)


def test_which_configurations_run_locally():
    assert batch_local(LINEAR, BATCH)
    assert not batch_local(LINEAR, OUT)  # a sharded weight: DTensor runs it
    ce = {"op": "aten.cross_entropy_loss.default", "inputs": [{"shape": (8, 4)}, {"shape": (8,)}]}
    split = Configuration("batch=2", (("batch", (0,)),), (("S(0)",), ("S(0)",)), (), ("R",),
                          partial_axes=(0,))
    classes = Configuration("classes=2", (("classes", (0,)),), (("S(1)",), ("R",)), (), ("R",))
    assert runs_local(ce, split) and batch_local(ce, split)
    assert not runs_local(ce, classes)


def test_a_captured_mean_cross_entropy_runs_locally_and_pays_no_loss_all_reduce():
    """The capture names the reduction ("mean"); the batch-split loss is a partial sum read after the step."""
    import torch

    from tensoropt.capture.graph import build_graph
    from tensoropt.configspace import configurations
    from tensoropt.executor.job.program import export_program
    from tensoropt.models import build_model

    model, _ = build_model("mlp", in_features=8, hidden=[16], num_classes=4)
    graph = build_graph(export_program(model, (torch.randn(8, 8), torch.randint(0, 4, (8,)))))
    name = next(n for n, d in graph.nx.nodes(data=True) if "cross_entropy" in str(d.get("op")))
    node = graph.nx.nodes[name]
    assert node["attrs"]["reduction"] == "mean"
    split = next(c for c in configurations(graph, MESH)[name] if c.label == "batch=2")
    assert runs_local(node, split)
    info = GraphInfo({name: True}, {name: True}, {}, {name: False})
    assert node_cost(_model(), info, name, node, split).comm_s == 0.0
    smoothed = dict(node, attrs={**node["attrs"], "label_smoothing": 0.1})
    assert not runs_local(smoothed, split)
    assert node_cost(_model(), info, name, smoothed, split).comm_s > 0.0


def _model(**overheads) -> CostModel:
    cluster = load_cluster("cpu-local")
    zero = {"op_overhead_local_s": 0.0, "op_overhead_dtensor_s": 0.0, "redistribute_overhead_s": 0.0}
    device = dataclasses.replace(cluster.device, **{**zero, **overheads})
    return CostModel(dataclasses.replace(cluster, device=device), MESH, "sgd")


def test_node_time_grows_by_the_modelled_overhead():
    info = GraphInfo({"x": False, "l": True}, {"l": True}, {}, {"l": False})
    base = _model()
    loaded = _model(op_overhead_local_s=1e-4, op_overhead_dtensor_s=5e-4)
    for config, extra in ((BATCH, 1e-4), (OUT, 5e-4)):
        t0 = node_cost(base, info, "l", LINEAR, config).time_s
        t1 = node_cost(loaded, info, "l", LINEAR, config).time_s
        assert t1 - t0 == pytest.approx(extra, rel=1e-9)
        assert node_overhead_s(loaded.cluster.device, LINEAR, config) == pytest.approx(extra)


def test_edge_time_grows_by_one_redistribution_each_way():
    import networkx as nx

    g = nx.DiGraph()
    g.add_node("x", kind="input", op="input", inputs=[], params={}, out_shape=(8, 16), out_dtype="float32")
    g.add_node("l", **LINEAR)
    g.add_edge("x", "l")
    info = GraphInfo({"x": True, "l": True}, {"l": True}, {}, {"l": False})
    src = Configuration("batch=2", (("batch", (0,)),), (), (), ("S(0)",))
    base, loaded = _model(), _model(redistribute_overhead_s=2e-4)

    def extra(dst):
        return edge_cost(loaded, info, g, "x", "l", src, dst).time_s - edge_cost(base, info, g, "x", "l", src,
                                                                                  dst).time_s
    moved, same = extra(OUT), extra(BATCH)
    assert moved == pytest.approx(2 * 2e-4)  # S(0) -> R forward, its gradient back
    assert same == 0.0


def _class_split_cross_entropy_counts() -> tuple[int, int]:
    """(operators, all-reduces) the executor's class-split cross entropy runs, forward and backward:
    run for real on 8 x 4 logits split over 2 ranks of a fake process group (one process; the
    collectives are counted, not sent). Each DTensor operator and each operator on local tensors
    counts once; aliasing detaches are left out (they compute nothing)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils._python_dispatch import TorchDispatchMode

    from tensoropt.executor.ops.explicit_ops import cross_entropy

    class DTensorOps(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    assert not dist.is_initialized(), "another test left a process group behind"
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        logits = distribute_tensor(torch.randn(8, 4), mesh, [Shard(1)]).requires_grad_()
        labels = distribute_tensor(torch.randint(0, 4, (8,)), mesh, [Replicate()])
        with CommDebugMode() as comm, DTensorOps() as seen:
            loss = cross_entropy("loss", torch.ops.aten.cross_entropy_loss.default, logits, labels)
            loss.backward()
        all_reduces = sum(n for op, n in comm.get_comm_counts().items() if "all_reduce" in str(op))
    finally:
        dist.destroy_process_group()
    return len([op for op in seen.ops if op != "aten.detach.default"]), all_reduces


def test_class_split_cross_entropy_is_charged_the_operators_the_executor_runs():
    ops, all_reduces = _class_split_cross_entropy_counts()
    assert all_reduces == 2, (ops, all_reduces)  # the row maxima; the packed sum of exps and target logit
    charged, redistributions = CLASS_SPLIT_CROSS_ENTROPY
    assert redistributions == 0 and 0.75 * ops <= charged <= 1.25 * ops, (ops, CLASS_SPLIT_CROSS_ENTROPY)
    device = _model(op_overhead_local_s=2e-5, op_overhead_dtensor_s=1e-4,
                    redistribute_overhead_s=3e-4).cluster.device
    ce = {"op": "aten.cross_entropy_loss.default", "kind": "loss",
          "inputs": [{"shape": (8, 4)}, {"shape": (8,)}]}
    classes = Configuration("classes=2", (("classes", (0,)),), (("S(1)",), ("R",)), (), ("R",))
    replicated = Configuration("replicate", (), (("R",), ("R",)), (), ("R",))
    assert node_overhead_s(device, ce, replicated) == pytest.approx(2e-5)  # runs on local tensors
    # each operator's overhead (the all-reduces are functional collectives, no DTensor redistribution)
    assert node_overhead_s(device, ce, classes) == pytest.approx(charged * 1e-4)


def test_profile_keys_price_the_replayed_program_when_it_was_measured():
    rng = random.Random(2)
    counts = [4, 10, 18, 34]
    per_way = {"plain": 3e-5, "replay": 3.6e-5, "local": 6e-5, "dtensor": 4.3e-4}
    points = {way: [[n, t] for n, t in zip(counts, _noisy([2e-4 + per * n for n in counts], rng, 0.01))]
              for way, per in per_way.items()}
    points["redistribute"] = [[0, 1.5e-4]]
    points["redistribute_replay"] = [[0, 4e-6]]
    keys = overhead_profile_keys(points, 2, "gloo")
    replay = per_way["replay"] - per_way["plain"]
    assert keys["op_overhead_local_s"] == keys["op_overhead_dtensor_s"] == pytest.approx(replay, rel=0.5)
    assert keys["op_overhead_dtensor_s"] < (per_way["local"] - per_way["plain"]) / 2
    assert keys["redistribute_overhead_s"] == 4e-6
    assert "replayed local program" in keys["sources"]["op_overhead_dtensor_s"]
