"""Communication model: monotone in size and devices, hierarchical levels, gloo's missing all-to-all,
calibrated fits (derived by hand, and against real gloo all-reduces)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from estimators.calibration import fit_alpha_beta
from estimators.collectives import CommModel, flat_time_s, ring_coefficients
from estimators.profiles import COLLECTIVES, CollectiveFit, Link, load_cluster
from tensoropt.configspace.configuration import Mesh
from tensoropt.launch import LaunchOptions, launch_module

HERE = Path(__file__).resolve().parent

CLUSTERS = ["h100x8", "h100-4x8-ib", "a100-2x8", "v100-16x1-25gbe", "cpu-local"]


@pytest.mark.parametrize("name", CLUSTERS)
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_monotone_in_size_and_device_count(name, collective):
    cluster = load_cluster(name)
    sizes = [0, 4, 4096, 1 << 20, 1 << 26]
    prev_by_p = None
    p = 2
    while p <= cluster.max_devices:
        mesh = Mesh.for_cluster(p, cluster.devices_per_node)
        cm = CommModel(cluster, mesh)
        times = [cm.time_s(collective, n, range(len(mesh.shape))) for n in sizes]
        assert times == sorted(times), f"{name} {collective} p={p}: not monotone in size"
        if prev_by_p is not None:
            assert all(t >= q - 1e-15 for t, q in zip(times, prev_by_p)), (
                f"{name} {collective}: p={p} cheaper"
            )
        prev_by_p = times
        p *= 2


def test_node_level_axis_costs_more_than_gpu_level():
    cluster = load_cluster("h100-4x8-ib")
    mesh = Mesh.for_cluster(16, 8)  # (2 nodes) x (2, 2, 2) gpus
    cm = CommModel(cluster, mesh)
    assert mesh.levels[0] == "node" and mesh.levels[1] == "gpu"
    for coll in COLLECTIVES:
        assert cm.time_s(coll, 1 << 24, (0,)) > cm.time_s(coll, 1 << 24, (1,)), coll


def test_hierarchical_all_reduce_is_rs_ar_ag():
    cluster = load_cluster("a100-2x8")
    mesh = Mesh.for_cluster(16, 8)
    cm = CommModel(cluster, mesh)
    n = 1 << 26
    intra, inter = cluster.intra_node, cluster.inter_node
    expected = (
        flat_time_s("reduce_scatter", n, 8, intra)
        + flat_time_s("all_reduce", n / 8, 2, inter)
        + flat_time_s("all_gather", n, 8, intra)
    )
    assert cm.time_s("all_reduce", n, range(4)) == pytest.approx(expected)
    # cheaper than a flat ring over the slow link, dearer than a flat ring over the fast one
    assert flat_time_s("all_reduce", n, 16, intra) < expected < flat_time_s("all_reduce", n, 16, inter)


def test_ring_formulas_from_costs_md():
    link = Link(bandwidth_gbps=10.0, latency_s=1e-5)
    n, p = 1e8, 4
    assert flat_time_s("all_reduce", n, p, link) == pytest.approx(2 * 3 * 1e-5 + 2 * 3 / 4 * n / 1e10)
    assert flat_time_s("all_gather", n, p, link) == pytest.approx(3 * 1e-5 + 3 / 4 * n / 1e10)
    assert flat_time_s("broadcast", n, p, link) == pytest.approx(2 * 1e-5 + n / 1e10)
    assert ring_coefficients("reduce_scatter", 8) == (7.0, 7 / 8)


def test_gloo_all_to_all_is_an_all_gather():
    cluster = load_cluster("cpu-local")
    cm = CommModel(cluster, Mesh((2,), ("gpu",)))
    assert cm.time_s("all_to_all", 1000, (0,)) == pytest.approx(cm.time_s("all_gather", 2000, (0,)))
    nccl = CommModel(load_cluster("h100x8"), Mesh((2,), ("gpu",)))
    assert nccl.time_s("all_to_all", 1000, (0,)) < nccl.time_s("all_gather", 2000, (0,))


def _fitted_cluster(*fits: CollectiveFit):
    """cpu-local's hardware with this test's own intra-node link and fits (no measured numbers)."""
    link = Link(bandwidth_gbps=2.0, latency_s=3e-5)
    return dataclasses.replace(load_cluster("cpu-local"), intra_node=link, fits=fits)


def test_calibrated_fit_replaces_formula_where_it_matches():
    small = CollectiveFit("all_reduce", 2, "gpu", alpha_s=5e-4, beta_s_per_byte=2.5e-10)
    large = CollectiveFit("all_reduce", 2, "gpu", alpha_s=1e-3, beta_s_per_byte=3e-10, min_bytes=8e6)
    cm = CommModel(_fitted_cluster(small, large), Mesh((2, 2), ("gpu", "gpu")))
    # 2 processes: the fit itself, alpha + beta n (by hand: 0.5 ms + 0.25 ns/B x 4 MB = 1.5 ms)
    assert cm.time_s("all_reduce", 4e6, (0,)) == pytest.approx(1.5e-3)
    # from 8 MB both fits apply and the dearer one counts: max(0.5 + 4.0, 1.0 + 4.8) ms at 16 MB
    assert cm.time_s("all_reduce", 16e6, (1,)) == pytest.approx(5.8e-3)
    # 4 processes have no fit: the 2-process one scaled by the ring's latency steps 2(p-1) (2 -> 6)
    # and bandwidth factor 2(p-1)/p (1 -> 1.5): 3 x 0.5 ms + 1.5 x 1.0 ms at 4 MB
    assert cm.time_s("all_reduce", 4e6, (0, 1)) == pytest.approx(3.0e-3)
    # no all-gather fit at all: the ring formula on the link, (p-1) alpha + (p-1)/p n / B
    assert cm.time_s("all_gather", 4e6, (0,)) == pytest.approx(3e-5 + 0.5 * 4e6 / 2e9)


@pytest.mark.distributed
def test_a_fit_from_two_measured_sizes_predicts_a_third(tmp_path):
    """Real gloo all-reduces on 2 processes: the alpha-beta fit through 64 KiB and 4 MiB (the
    calibration's fit, estimators.calibration) predicts the time measured at 1 MiB within a
    factor of 3 (gloo changes algorithm near 1 MB, and the machine may be loaded)."""
    out = tmp_path / "allreduce.json"
    sizes = (65536, 1048576, 4194304)
    rc = launch_module("allreduce_probe", [str(out), ",".join(map(str, sizes)), "20"],
                       LaunchOptions(2, timeout_s=240), env={"PYTHONPATH": str(HERE)})
    assert rc == 0, "the all-reduce probe failed (its messages are above)"
    measured_s = {int(k): v for k, v in json.loads(out.read_text()).items()}
    ends = (sizes[0], sizes[2])
    alpha_s, beta_s_per_byte = fit_alpha_beta(ends, [measured_s[n] for n in ends])
    cm = CommModel(_fitted_cluster(CollectiveFit("all_reduce", 2, "gpu", alpha_s, beta_s_per_byte)),
                   Mesh((2,), ("gpu",)))
    predicted_s = cm.time_s("all_reduce", sizes[1], (0,))
    assert 1 / 3 <= predicted_s / measured_s[sizes[1]] <= 3, (predicted_s, measured_s)


def test_empty_group_and_bad_input():
    cm = CommModel(load_cluster("h100x8"), Mesh((2,), ("gpu",)))
    assert cm.time_s("all_reduce", 1 << 20, ()) == 0.0
    with pytest.raises(ValueError, match="unknown collective"):
        cm.time_s("gossip", 1, (0,))
    with pytest.raises(ValueError, match="out of range"):
        cm.time_s("all_reduce", 1, (3,))
