"""A space too large for the solver's memory is refused in seconds, naming what to shrink."""

import time

import pytest

from estimators.profiles import load_cluster
from frontier.memory_limit import ENV
from tensoropt.config import Job
from tensoropt.configspace import configurations
from tensoropt.configspace.configuration import Mesh
from tensoropt.cost_graph import cost_graph
from tensoropt.planner import PlanningError, capture_job, plan_devices
from tensoropt.solver_size import table_size


def _job(devices: int, space: str, options=()) -> Job:
    return Job.from_dict({
        "model": {"name": "mlp", "kwargs": {"in_features": 64, "hidden": [128, 128], "num_classes": 16}},
        "training": {"global_batch_size": 64, "optimizer": "adamw", "memory_options": list(options)},
        "cluster": "h100-128x8-ib", "devices": [devices], "memory_budget": "1GiB",
        "planner": {"space": space},
    })


def test_a_space_past_the_limit_fails_within_seconds_with_the_fix(monkeypatch):
    monkeypatch.setenv(ENV, "0.05")
    job = _job(64, "full", ["recompute", "zero3"])
    graph = capture_job(job)
    start = time.perf_counter()
    with pytest.raises(PlanningError) as err:
        plan_devices(graph, job, load_cluster("h100-128x8-ib"), 64)
    assert time.perf_counter() - start < 30  # the solve of this space takes minutes
    message = str(err.value)
    assert "64 devices" in message and "past the solver limit of 0.1 GiB" in message
    assert "planner.space: hierarchical" in message and ENV in message
    # the hierarchical space of the same job fits the same limit and plans
    hier = _job(64, "hierarchical", ["recompute", "zero3"])
    assert plan_devices(graph, hier, load_cluster("h100-128x8-ib"), 64).plans


@pytest.mark.parametrize("options, slack", [((), 2), (("recompute", "zero1", "zero3"), 6)])
def test_the_estimate_is_not_below_the_cost_graph_it_predicts(options, slack):
    """Not below what is built (and copied by the solver); above it by the options counted as
    offered everywhere."""
    job = _job(8, "full", options)
    graph = capture_job(job)
    mesh = Mesh.for_cluster(8, 8)
    confs = configurations(graph, mesh)
    size = table_size(graph, confs, options)
    G = cost_graph(graph, load_cluster("h100-128x8-ib"), 8, batch_size=64, optimizer="adamw",
                   memory_options=list(options))
    built = sum(a.nbytes for _, _, d in G.edges(data=True) for a in d.values() if hasattr(a, "nbytes"))
    assert built <= size.bytes <= slack * built
    assert size.max_configurations >= max(len(d["configs"]) for _, d in G.nodes(data=True))
