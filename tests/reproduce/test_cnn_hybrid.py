"""AlexNet and VGG-16 on 8 and 16 GPUs of the 25 Gb/s V100 cluster with loose memory.

Known optimum (Krizhevsky's "one weird trick", SoyBean, FlexFlow, SplitBrain): convolutions are
data parallel (split by batch) and the large fully-connected layers are model parallel, split by
output feature. Nothing in the planner knows this; it must follow from the cost tables: a
convolution's activations are large and its weights small (all-reducing the weight gradient is
cheap), a fully-connected layer's weights are large and its activations small (moving the
activation is cheaper than all-reducing a 400 MB gradient over 25 Gb/s Ethernet).

Batch: 32 images per GPU (global 256 / 512), full 224x224 images. Capture is on the meta device,
so the image size costs nothing here; each case takes a few seconds.
"""

from __future__ import annotations

import math

import pytest
from reproduce_baselines import capture_zoo, data_parallel_space, solve_in_space

import frontier as ft
from tensoropt.cost_graph import cost_graph

CLUSTER = "v100-16x1-25gbe"
PER_GPU_BATCH = 32


def _params(node: dict) -> int:
    return sum(math.prod(s) for s in node["params"].values())


@pytest.fixture(scope="module", params=[("alexnet", 8), ("alexnet", 16), ("vgg16", 8), ("vgg16", 16)],
                ids=lambda p: f"{p[0]}-{p[1]}gpu")
def solved(request):
    name, devices = request.param
    batch = PER_GPU_BATCH * devices
    graph, job, cluster = capture_zoo(name, CLUSTER, devices, batch, optimizer="momentum")
    G = cost_graph(graph, cluster, devices, batch_size=batch, optimizer="momentum")
    budget = cluster.device.memory_bytes
    points = [p for p in ft.solve(G) if p.cost[1] <= budget]
    assert points, f"{name}: no plan fits {budget} bytes on {devices} V100s"
    return graph.nx, G, points[0], devices


def test_convolutions_are_split_by_batch(solved):
    g, G, fastest, devices = solved
    mesh = G.graph["mesh"]
    convs = [n for n in g if g.nodes[n]["kind"] == "conv2d"]
    assert convs
    for n in convs:
        conf = G.nodes[n]["configurations"][fastest.assignment[n]]
        assert dict(conf.splits) == {"batch": tuple(range(len(mesh.shape)))}, (
            f"{n} ({g.nodes[n]['module']}) is {conf.label}, expected batch={devices}"
        )


def test_large_fc_layers_are_split_by_output_feature(solved):
    g, G, fastest, devices = solved
    mesh = G.graph["mesh"]
    total = sum(_params(g.nodes[n]) for n in g)
    large = [n for n in g if g.nodes[n]["kind"] == "linear" and _params(g.nodes[n]) >= 0.1 * total]
    assert large, "expected fully-connected layers holding >= 10% of the parameters"
    for n in large:
        conf = G.nodes[n]["configurations"][fastest.assignment[n]]
        assert conf.degree("out", mesh) >= 2, f"{n} is {conf.label}: output features not split"
        # Model parallel: no replica of the weight sums gradients over the slow network.
        synced = any(axes for _, axes in conf.grad_sync_axes)
        assert not synced, f"{n} is {conf.label}: weight is data parallel"


def test_hybrid_beats_pure_data_parallelism(solved):
    g, G, fastest, devices = solved
    dp = solve_in_space(G, data_parallel_space(G))[0]
    assert fastest.cost[0] < dp.cost[0] / 1.2, (
        f"FT {fastest.cost[0]:.4f}s is not 1.2x faster than data parallel {dp.cost[0]:.4f}s"
    )
