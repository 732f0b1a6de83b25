"""The top-level API of the brief: tensoropt.capture, .configurations, .cost_graph."""

import torch

import tensoropt
import tensoropt.capture.graph  # noqa: F401  (binds the subpackage to tensoropt.capture)
import tensoropt.cost_graph  # noqa: F401  (binds the module to tensoropt.cost_graph)


def test_capture_callable_after_subpackage_import():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    graph = tensoropt.capture(model, (torch.randn(2, 4),))
    kinds = [graph.nx.nodes[n]["kind"] for n in graph.compute_nodes()]
    assert kinds == ["linear", "elementwise"]


def test_top_level_pipeline_on_tiny_model():
    from frontier import solve

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    graph = tensoropt.capture(model, (torch.randn(4, 8),))
    mesh = tensoropt.Mesh.for_cluster(2, devices_per_node=2)
    configs = tensoropt.configurations(graph, mesh)
    assert all(len(v) >= 1 for v in configs.values())
    cg = tensoropt.cost_graph(graph, "cpu-local", 2)
    points = solve(cg)
    assert points and all(p.cost[1] > 0 for p in points)
    times = [p.cost[0] for p in points]
    assert times == sorted(times)
