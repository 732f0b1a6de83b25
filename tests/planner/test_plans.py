"""frontier.json / plan.json: round trips, the plan.json text, versioning, atomic writes."""

from __future__ import annotations

import json
import os

import pytest

from tensoropt.configspace.configuration import Configuration
from tensoropt.plans import (
    FrontierFile,
    PlanFile,
    PlanFileError,
    load_frontier_file,
    load_plan_file,
    plan_file_text,
    unpack_frontier_json,
    write_text_atomic,
)


def test_frontier_file_round_trip(tmp_path, frontier_file):
    path = tmp_path / "frontier.json"
    frontier_file.write(path)
    again = load_frontier_file(path)
    assert again == frontier_file
    assert json.loads(path.read_text()) == frontier_file.to_json(shared=True)
    assert unpack_frontier_json(json.loads(path.read_text())) == frontier_file.to_json()
    assert FrontierFile.from_json(json.loads(json.dumps(frontier_file.to_json()))) == frontier_file


def test_frontier_json_has_the_issue_schema(frontier_file):
    data = frontier_file.to_json()
    assert data["version"] == 2 and "job" in data and "selected" in data
    for f in data["frontiers"]:
        assert isinstance(f["devices"], int) and isinstance(f["mesh"], list)
        times = [p["time_s"] for p in f["plans"]]
        assert times == sorted(times)
        for p in f["plans"]:
            assert {"id", "time_s", "memory_bytes", "ops", "summary", "layers"} <= set(p)
            for node, label in p["ops"].items():
                assert label in f["configurations"][node]
            for layer in p["layers"]:
                assert set(layer) == {"node", "op", "module", "config", "compute_s", "comm_s", "memory_bytes"}


def test_plan_file_text_round_trip(tmp_path, frontier_file):
    data = frontier_file.to_json()
    for frontier in frontier_file.frontiers:
        for plan in frontier.plans:
            text = plan_file_text(data, plan.id)
            assert text.endswith("\n")
            path = tmp_path / f"{plan.id}.json"
            path.write_text(text)
            pf = load_plan_file(path)
            assert pf.plan == plan
            assert pf.devices == frontier.devices and pf.mesh == frontier.mesh
            assert pf.job == frontier_file.job
            assert set(pf.placements) == set(plan.ops)
            for node, label in plan.ops.items():
                assert pf.placements[node] == frontier.configuration(node, label)
                assert isinstance(pf.placements[node], Configuration)
            # deterministic: the same text every time (the plot embeds it)
            assert plan_file_text(json.loads(json.dumps(data)), plan.id) == text


def test_plan_file_text_errors(frontier_file):
    data = frontier_file.to_json()
    with pytest.raises(PlanFileError, match="no plan with id 'd3-p0'"):
        plan_file_text(data, "d3-p0")
    node, label = next(iter(data["frontiers"][1]["plans"][0]["ops"].items()))
    del data["frontiers"][1]["configurations"][node][label]
    with pytest.raises(PlanFileError, match=f"no configuration '{label}' recorded for node '{node}'"):
        plan_file_text(data, data["frontiers"][1]["plans"][0]["id"])


def test_version_and_malformed_files_are_refused(tmp_path, frontier_file):
    data = frontier_file.to_json()
    data["version"] = 99
    path = tmp_path / "frontier.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PlanFileError, match=r"frontier.json: schema version 99"):
        load_frontier_file(path)
    path.write_text("{not json")
    with pytest.raises(PlanFileError, match="invalid JSON"):
        load_frontier_file(path)
    path.write_text(json.dumps({"version": 1, "job": {}}))
    with pytest.raises(PlanFileError, match="malformed frontier file"):
        load_frontier_file(path)
    with pytest.raises(PlanFileError, match="malformed plan file"):
        PlanFile.from_json({"version": 1, "id": "x"}, "p.json")


def test_atomic_write_leaves_old_content_and_no_temp_file_on_error(tmp_path, monkeypatch):
    path = tmp_path / "frontier.json"
    write_text_atomic(path, "old\n")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_text_atomic(path, "new\n")
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["frontier.json"]
