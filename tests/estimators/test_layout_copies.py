"""The local copies around a redistribution's collectives are priced from the tensor and its layouts."""

from __future__ import annotations

import networkx as nx
import pytest

from estimators.layout_copies import layout_copy_bytes, layout_copy_time_s
from estimators.op_costs import CostModel, GraphInfo, edge_cost
from estimators.profiles import load_cluster
from tensoropt.configspace.configuration import Configuration, Mesh

MESH = Mesh((2,), ("cpu",))
SHAPE = (64, 256)  # the producer's output, float32: 64 KiB
LINEAR = {"kind": "linear", "op": "aten.linear.default", "flops": 2 * 64 * 256 * 256, "out_shape": (64, 256),
          "out_dtype": "float32", "params": {"w": (256, 256)}, "shared_params": [],
          "inputs": [{"source": "x", "shape": SHAPE, "dtype": "float32"}],
          "operands": [{"role": "input", "index": 0}, {"role": "param", "key": "w"}]}
REPLICATED = Configuration("replicate", (), (("R",),), (("w", ("R",)),), ("R",))


def _graph() -> tuple[nx.DiGraph, GraphInfo]:
    g = nx.DiGraph()
    g.add_node("x", kind="linear", op="aten.linear.default", inputs=[], params={}, out_shape=SHAPE,
               out_dtype="float32")
    g.add_node("l", **LINEAR)
    g.add_edge("x", "l")
    return g, GraphInfo({"x": True, "l": True}, {"x": True, "l": True}, {}, {"l": False})


def _producer(dim: int) -> Configuration:
    return Configuration(f"S({dim})", (("d", (0,)),), (), (), (f"S({dim})",))


def test_a_gather_of_a_dim_1_shard_is_priced_its_copy_of_the_gathered_bytes():
    """S(1) -> R gathers (64, 256) then cats it along dim 1 (forward); its gradient, replicated, is sliced
    back to S(1) and made contiguous (backward): 64 KiB + 32 KiB copied, each read and written. S(0) -> R
    needs neither (dim-0 chunks are contiguous). The estimator without the term prices both alike."""
    cluster = load_cluster("cpu-local")
    device = cluster.device
    g, info = _graph()
    assert layout_copy_bytes(SHAPE, 4, ("S(1)",), ("R",), (2,)) == (64 * 256 * 4, 1)
    assert layout_copy_bytes(SHAPE, 4, ("R",), ("S(1)",), (2,)) == (64 * 128 * 4, 1)
    assert layout_copy_bytes(SHAPE, 4, ("S(0)",), ("R",), (2,)) == (0, 0)
    priced = CostModel(cluster, MESH, "sgd")
    unpriced = CostModel(cluster, MESH, "sgd", layout_copies=False)

    def extra(dim: int) -> float:
        with_copies = edge_cost(priced, info, g, "x", "l", _producer(dim), REPLICATED).comm_s
        return with_copies - edge_cost(unpriced, info, g, "x", "l", _producer(dim), REPLICATED).comm_s

    bandwidth = device.memory_bandwidth_gbps * 1e9 * device.memory_efficiency
    expected = 2 * (64 * 256 * 4 + 64 * 128 * 4) / bandwidth + 2 * device.kernel_launch_s
    assert extra(1) == pytest.approx(expected, rel=1e-9)
    assert extra(1) == pytest.approx(layout_copy_time_s(device, SHAPE, 4, ("S(1)",), ("R",), (2,))
                                     + layout_copy_time_s(device, SHAPE, 4, ("R",), ("S(1)",), (2,)))
    assert extra(0) == 0.0
    # twice the tensor, twice the bytes (less the launches): the term follows the program's sizes
    twice = layout_copy_time_s(device, (128, 256), 4, ("S(1)",), ("R",), (2,)) - device.kernel_launch_s
    assert twice == pytest.approx(2 * (layout_copy_time_s(device, SHAPE, 4, ("S(1)",), ("R",), (2,))
                                       - device.kernel_launch_s))
