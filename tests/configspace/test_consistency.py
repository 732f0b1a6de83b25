"""Every configuration of the zoo models is internally consistent and computes the local shapes it claims.

The strongest check here runs each operator on ``meta`` tensors of the *local* shapes a
configuration gives its operands and parameters, and compares the result's shape with the local
shape of the configuration's output layout: a wrong dim mapping shows up as an error or a shape
mismatch, without any process group.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.fx as fx

from tensoropt.capture import capture
from tensoropt.configspace import configurations
from tensoropt.configspace.configuration import Mesh, local_shape, parse_label, shard_dim
from tensoropt.models import build_model, example_inputs
from tensoropt.models.resnet import ResNet

MESHES = [Mesh.for_cluster(8, devices_per_node=4), Mesh.for_cluster(4, devices_per_node=4)]

MODELS = {
    "gpt": ({"layers": 1}, 8),
    "bert-base": ({"layers": 1, "width": 64, "heads": 4, "seq_len": 32, "vocab_size": 128}, 8),
    "resnet": (None, 8),  # ResNet-50's bottlenecks, one per stage
    "vgg16": ({"input_shape": (3, 32, 32), "num_classes": 16}, 8),
    "mlp": ({"in_features": 64, "hidden": (64,), "num_classes": 16}, 16),
}

_CACHE: dict = {}


def _graph(name):
    if name not in _CACHE:
        overrides, batch = MODELS[name]
        if overrides is None:
            with torch.device("meta"):
                model = ResNet(layers=(1, 1, 1, 1), num_classes=16)
            inputs = (
                torch.empty(batch, 3, 64, 64, device="meta"),
                torch.zeros(batch, dtype=torch.long, device="meta"),
            )
        else:
            model, spec = build_model(name, device="meta", **overrides)
            inputs = example_inputs(spec, batch, device="meta")
        _CACHE[name] = capture(model, inputs)
    return _CACHE[name]


def _check_layout(layout, shape, mesh, what):
    assert len(layout) == len(mesh.shape), what
    for p in layout:
        assert p == "R" or shard_dim(p) is not None, f"{what}: bad placement {p}"
        d = shard_dim(p)
        if d is not None:
            assert d < len(shape), f"{what}: {p} on a rank-{len(shape)} tensor"
    for d in range(len(shape)):
        degree = math.prod(mesh.shape[a] for a, p in enumerate(layout) if shard_dim(p) == d)
        assert shape[d] % degree == 0, f"{what}: dim {d} of {shape} split {degree} ways"


@pytest.mark.parametrize("mesh", MESHES, ids=lambda m: "x".join(map(str, m.shape)) + "-" + m.levels[0])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_placements_consistent(name, mesh):
    g = _graph(name)
    cs = configurations(g, mesh)
    assert set(cs) == set(g.nx.nodes)
    for node, configs in cs.items():
        data = g.nx.nodes[node]
        labels = [c.label for c in configs]
        assert labels[0] == "replicate" and len(set(labels)) == len(labels), node
        for c in configs:
            what = f"{node} {c.label}"
            used = [a for _, axes in c.splits for a in axes]
            assert len(used) == len(set(used)), what  # an axis splits one dim at most
            degrees = {dim: c.degree(dim, mesh) for dim, _ in c.splits}
            assert math.prod(degrees.values()) == math.prod(mesh.shape[a] for a in used), what
            assert degrees == parse_label(c.label), what
            assert len(c.inputs) == len(data["inputs"]), what
            for layout, entry in zip(c.inputs, data["inputs"]):
                _check_layout(layout, entry["shape"], mesh, what)
            assert {k for k, _ in c.params} == set(data["params"]), what
            for key, layout in c.params:
                _check_layout(layout, data["params"][key], mesh, f"{what} {key}")
            _check_layout(c.output, data["out_shape"], mesh, what)
            assert "P" not in c.output
            assert set(c.partial_axes) <= set(used), what
            for key, axes in c.grad_sync_axes:
                assert set(axes) <= set(used), what
                assert all(dict(c.params)[key][a] == "R" for a in axes), what


def _fx_nodes(g):
    return {n.name: n for n in g.program.graph.nodes}


def _local_args(fx_node, data, config, mesh):
    """fx args with every tensor operand replaced by a meta tensor of its local shape."""
    operands = iter(data["operands"])
    params = dict(config.params)

    def make(_arg):
        o = next(operands)
        shape = tuple(o["shape"])
        if o["role"] == "input":
            entry = data["inputs"][o["index"]]
            shape = local_shape(shape, config.inputs[o["index"]], mesh.shape)
            dtype = getattr(torch, entry["dtype"])
        elif o["role"] == "param":
            assert o["dim_map"] == list(range(len(shape))), "parameter read through a view"
            shape = local_shape(shape, params[o["key"]], mesh.shape)
            dtype = torch.float32
        else:
            dtype = _arg.meta["val"].dtype
            if data["kind"] == "batch_norm" and params:  # running stats: per channel, like the weight
                shape = local_shape(shape, next(iter(params.values())), mesh.shape)
        return torch.empty(shape, dtype=dtype, device="meta")

    return fx.node.map_arg(fx_node.args, make), fx.node.map_arg(fx_node.kwargs, make)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_local_shapes_compute(name):
    mesh = MESHES[0]
    g = _graph(name)
    nodes = _fx_nodes(g)
    cs = configurations(g, mesh)
    checked = 0
    for node, configs in cs.items():
        data = g.nx.nodes[node]
        if data["kind"] == "input":
            continue
        for c in configs:
            args, kwargs = _local_args(nodes[node], data, c, mesh)
            out = nodes[node].target(*args, **kwargs)
            out = out[0] if isinstance(out, (tuple, list)) else out
            expected = local_shape(tuple(data["out_shape"]), c.output, mesh.shape)
            assert tuple(out.shape) == expected, (
                f"{node} ({data['op']}) {c.label}: {tuple(out.shape)} != {expected}"
            )
            checked += 1
    assert checked > 100
