"""Profiles: every shipped profile loads, every constant is cited, bad input names file and key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from estimators.profiles import (
    Cluster,
    ProfileError,
    cluster_to_dict,
    configs_dirs,
    load_cluster,
    load_device,
)

DEVICES = ["h100-sxm-80gb", "a100-80gb", "a100-40gb", "v100-32gb", "cpu"]
CLUSTERS = ["h100x8", "h100-4x8-ib", "a100-2x8", "v100-16x1-25gbe", "cpu-local"]


@pytest.mark.parametrize("name", DEVICES)
def test_devices_load_and_cite_every_constant(name):
    d = load_device(name)
    assert d.peak_flops("float32") > 0 and d.memory_bytes > 0 and d.memory_bandwidth_gbps > 0
    for key in (
        "peak_tflops",
        "memory_bandwidth_gbps",
        "memory_bytes",
        "matmul_efficiency",
        "memory_efficiency",
        "kernel_launch_s",
    ):
        assert d.sources.get(key), f"{name}: {key} not cited"


@pytest.mark.parametrize("name", CLUSTERS)
def test_clusters_load_and_cite_links(name):
    c = load_cluster(name)
    for key in (
        "intra_node.bandwidth_gbps",
        "intra_node.latency_s",
        "inter_node.bandwidth_gbps",
        "inter_node.latency_s",
    ):
        assert c.sources.get(key), f"{name}: {key} not cited"
    assert Cluster.from_dict(cluster_to_dict(c)) == c


def test_cluster_shapes_match_their_names():
    assert load_cluster("h100-4x8-ib").max_devices == 32
    assert load_cluster("v100-16x1-25gbe").inter_node.bandwidth_gbps == pytest.approx(25 / 8)
    assert load_cluster("cpu-local").backend == "gloo" and not load_cluster("cpu-local").has_all_to_all
    assert load_cluster("h100x8").has_all_to_all


def test_load_by_path_and_inline(tmp_path):
    data = yaml.safe_load((configs_dirs()[1] / "clusters" / "a100-2x8.yaml").read_text())
    p = tmp_path / "mine.yaml"
    p.write_text(yaml.safe_dump(data))
    assert load_cluster(str(p)) == load_cluster("a100-2x8")
    assert load_cluster(data) == load_cluster("a100-2x8")


def test_load_by_name_from_another_directory(tmp_path):
    code = "from estimators.profiles import load_cluster; print(load_cluster('h100x8').devices_per_node)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert out.stdout.strip() == "8"


def _cluster_yaml(tmp_path: Path, **changes) -> str:
    data = yaml.safe_load((configs_dirs()[1] / "clusters" / "h100x8.yaml").read_text())
    for dotted, value in changes.items():
        cur = data
        *head, last = dotted.split(".")
        for h in head:
            cur = cur[h]
        if value is None:
            del cur[last]
        else:
            cur[last] = value
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(data))
    return str(p)


@pytest.mark.parametrize(
    "change, words",
    [
        ({"intra_node.bandwidth_gbps": -1}, ["bad.yaml", "intra_node.bandwidth_gbps", "> 0"]),
        ({"intra_node.latency_s": "fast"}, ["bad.yaml", "intra_node.latency_s", "number"]),
        ({"inter_node": None}, ["bad.yaml", "inter_node", "mapping"]),
        ({"sources.inter_node.bandwidth_gbps": None}, ["bad.yaml", "inter_node.bandwidth_gbps", "citation"]),
        ({"backend": "mpi"}, ["bad.yaml", "backend"]),
        ({"device": "tpu-v9"}, ["tpu-v9", "known"]),
        ({"bandwith": 3}, ["bad.yaml", "bandwith", "unknown"]),
    ],
)
def test_bad_profiles_name_file_and_key(tmp_path, change, words):
    # "sources.inter_node.bandwidth_gbps" is one key containing dots: handle it specially
    if "sources.inter_node.bandwidth_gbps" in change:
        data = yaml.safe_load((configs_dirs()[1] / "clusters" / "h100x8.yaml").read_text())
        del data["sources"]["inter_node.bandwidth_gbps"]
        p = tmp_path / "bad.yaml"
        p.write_text(yaml.safe_dump(data))
        path = str(p)
    else:
        path = _cluster_yaml(tmp_path, **change)
    with pytest.raises(ProfileError) as e:
        load_cluster(path)
    for w in words:
        assert w in str(e.value)


def test_unknown_name_lists_known_profiles():
    with pytest.raises(ProfileError, match="h100x8"):
        load_cluster("no-such-cluster")
