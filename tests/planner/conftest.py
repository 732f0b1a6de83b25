"""Synthetic frontier files for the planner tests (no capture, estimator or solver needed)."""

from __future__ import annotations

import numpy as np
import pytest

from tensoropt.configspace.configuration import Configuration, Mesh
from tensoropt.plans import Frontier, FrontierFile, Layer, Plan, Redistribution, plan_id

NODES = ("conv1", "relu1", "fc1", "fc2")
"""Nodes of the synthetic model."""


def _configuration(node: str, label: str, mesh: Mesh) -> Configuration:
    """A plausible configuration for a label (batch or out split over every axis)."""
    axes = tuple(range(len(mesh.shape)))
    if label == "replicate" or not axes:
        layout = tuple("R" for _ in axes)
        return Configuration("replicate", (), (layout,), (), layout)
    dim = label.split("=")[0]
    shard = "S(0)" if dim == "batch" else "S(1)"
    layout = tuple(shard for _ in axes)
    params = ((f"{node}.weight", tuple("R" if dim == "batch" else "S(0)" for _ in axes)),)
    sync = ((f"{node}.weight", axes),) if dim == "batch" else ()
    return Configuration(
        label,
        ((dim, axes),),
        (tuple("S(0)" if dim == "batch" else "R" for _ in axes),),
        params,
        layout,
        grad_sync_axes=sync,
    )


def synthetic_frontier_file(
    seed: int = 0,
    devices: tuple[int, ...] = (1, 2, 4, 8),
    plans_per_frontier: int = 6,
    global_batch_size: int = 64,
) -> FrontierFile:
    """Frontiers whose plans get faster and smaller with more devices, mutually non-dominated.

    Memory falls roughly as 1/devices and time as 1/sqrt(devices), with random spacing.
    """
    rng = np.random.default_rng(seed)
    frontiers = []
    for d in devices:
        mesh = Mesh.for_cluster(d, devices_per_node=4)
        n = 1 if d == 1 else plans_per_frontier
        times = np.sort(rng.uniform(0.05, 1.0, n)) / np.sqrt(d)
        mems = np.sort(rng.uniform(10e9, 40e9, n))[::-1] / d
        labels = ["replicate"] if d == 1 else ["replicate", f"batch={d}", f"out={d}"]
        plans, configurations = [], {}
        for i, (t, m) in enumerate(zip(times, mems)):
            ops = {node: labels[(i + j) % len(labels)] for j, node in enumerate(NODES)}
            for node, label in ops.items():
                configurations.setdefault(node, {})[label] = _configuration(node, label, mesh).to_json()
            layers = [
                Layer(node, "aten.linear.default", node, label, float(t) / 8, float(t) / 8, float(m) / 4)
                for node, label in ops.items()
            ]
            redist = [
                Redistribution("relu1", "fc1", ["S(0)"] * len(mesh.shape), ["R"] * len(mesh.shape), 1e-4)
            ]
            plans.append(
                Plan(
                    plan_id(d, i),
                    float(t),
                    float(int(m)),
                    ops,
                    summary=f"conv: {ops['conv1']}; fc: {ops['fc1']}",
                    layers=layers,
                    redistributions=redist if d > 1 else [],
                    throughput_samples_per_s=global_batch_size / float(t),
                )
            )
        frontiers.append(
            Frontier(d, mesh, plans, configurations, timing_s={"cost_graph": 0.01, "solve": 0.02})
        )
    job = {
        "model": {"name": "mlp"},
        "cluster": "cpu-local",
        "devices": list(devices),
        "training": {"global_batch_size": global_batch_size},
        "memory_budget": 16 * 2**30,
        "select": "fastest",
    }
    return FrontierFile(job=job, frontiers=frontiers)


@pytest.fixture
def frontier_file() -> FrontierFile:
    """A synthetic frontier file on 1, 2, 4, 8 devices."""
    return synthetic_frontier_file()


@pytest.fixture
def frontier_path(tmp_path, frontier_file):
    """The synthetic frontier file written to tmp_path/out/frontier.json."""
    path = tmp_path / "out" / "frontier.json"
    frontier_file.write(path)
    return path


@pytest.fixture
def make_frontier_file():
    """The factory :func:`synthetic_frontier_file` (seed, devices, plans_per_frontier, global_batch_size)."""
    return synthetic_frontier_file
