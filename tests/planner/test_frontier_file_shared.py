"""frontier.json version 2: the rows a frontier's plans share are stored once (issue 26).

A real planned frontier (the zoo GPT on 2 and 4 CPU devices, memory options on, so plans share
most of their per-operator rows) is written, read back and compared plan entry by plan entry;
a version 1 file (every row inline) is still read; every reader of the raw JSON (plan.json,
the plot's points) accepts the file's form.
"""

from __future__ import annotations

import json

import pytest

from tensoropt.config import Job
from tensoropt.planner import plan_job
from tensoropt.plans import (
    PLAN_SCHEMA_VERSION,
    SCHEMA_VERSION,
    FrontierFile,
    PlanFileError,
    load_frontier_file,
    load_plan_file,
    pack_frontier_json,
    plan_file_text,
    unpack_frontier_json,
    write_selection,
)


@pytest.fixture(scope="module")
def planned() -> FrontierFile:
    """A frontier file of the tiny zoo GPT on 2 and 4 devices, with recompute and ZeRO offered."""
    job = Job.from_dict({
        "model": {"name": "gpt", "kwargs": {"layers": 2, "width": 32, "heads": 2, "seq_len": 16,
                                            "vocab_size": 64}},
        "training": {"global_batch_size": 8, "memory_options": ["recompute", "zero1"]},
        "cluster": "cpu-local", "devices": [2, 4]})
    ff = plan_job(job)
    assert sum(len(f.plans) for f in ff.frontiers) >= 6, "too few plans to share rows"
    return ff


def test_every_plan_entry_reads_back_as_written(tmp_path, planned):
    path = tmp_path / "frontier.json"
    planned.write(path)
    again = load_frontier_file(path)
    assert again == planned
    written, read = planned.to_json(), again.to_json()
    for f_written, f_read in zip(written["frontiers"], read["frontiers"]):
        assert len(f_written["plans"]) == len(f_read["plans"])
        for p_written, p_read in zip(f_written["plans"], f_read["plans"]):
            assert json.dumps(p_read) == json.dumps(p_written)  # same fields, order, numbers
            # the entry's contract fields are written as before
            assert {"id", "time_s", "memory_bytes", "micro_batches", "pipeline", "ops", "layers",
                    "redistributions", "summary"} <= set(p_read)
    raw = json.loads(path.read_text())
    assert raw["version"] == SCHEMA_VERSION == 2
    assert unpack_frontier_json(raw) == {**written, "version": 2}
    # plan.json from the file's raw JSON is the same text as from the in-memory form, self-contained
    for f in written["frontiers"]:
        for p in f["plans"]:
            text = plan_file_text(raw, p["id"])
            assert text == plan_file_text(written, p["id"])
            plan = json.loads(text)
            assert plan["version"] == PLAN_SCHEMA_VERSION == 1
            assert all(isinstance(row, dict) for row in plan["layers"] + plan["redistributions"])
            assert isinstance(plan["ops"], dict) and set(plan["placements"]) == set(plan["ops"])


def test_shared_rows_are_stored_once(planned):
    packed = planned.to_json(shared=True)
    assert packed == pack_frontier_json(planned.to_json()), "the fast writer and the generic packer agree"
    assert pack_frontier_json(packed) is not packed and pack_frontier_json(packed) == packed
    for frontier, f in zip(planned.frontiers, packed["frontiers"]):
        rows = [json.dumps(layer.to_json()) for p in frontier.plans for layer in p.layers]
        assert len(f["layer_rows"]) == len(set(rows)) < len(rows), "each distinct row once"
        pairs = {pair for p in frontier.plans for pair in p.ops.items()}
        assert sorted(map(tuple, f["op_rows"])) == sorted(pairs)
        for plan, entry in zip(frontier.plans, f["plans"]):
            assert [f["layer_rows"][i] for i in entry["layers"]] == [x.to_json() for x in plan.layers]
            assert dict(f["op_rows"][i] for i in entry["ops"]) == plan.ops
            assert list(dict(f["op_rows"][i] for i in entry["ops"])) == list(plan.ops), "node order kept"
    full = len(json.dumps(planned.to_json()))
    assert len(json.dumps(packed)) < full / 2


def test_a_version_1_file_is_read(tmp_path, planned):
    old = {**planned.to_json(), "version": 1}  # version 1: every plan entry holds its rows
    path = tmp_path / "frontier.json"
    path.write_text(json.dumps(old))
    again = load_frontier_file(path)
    assert again == planned and again.version == 2
    plan_id = planned.frontiers[-1].plans[-1].id
    assert plan_file_text(old, plan_id) == plan_file_text(planned.to_json(), plan_id)
    # selecting in an old file writes it back in version 2's form; plan.json stays version 1
    write_selection(again, plan_id, path, tmp_path / "plan.json")
    raw = json.loads(path.read_text())
    assert raw["version"] == 2 and raw["selected"] == plan_id and "layer_rows" in raw["frontiers"][0]
    assert load_plan_file(tmp_path / "plan.json").plan == planned.find(plan_id)[1]


def test_unknown_version_and_bad_index_are_named(tmp_path, planned):
    path = tmp_path / "frontier.json"
    path.write_text(json.dumps({**planned.to_json(shared=True), "version": 3}))
    with pytest.raises(PlanFileError, match=r"frontier.json: schema version 3; this tensoropt reads version "
                                            r"1 and 2 \(re-run `tensoropt plan`"):
        load_frontier_file(path)
    packed = planned.to_json(shared=True)
    packed["frontiers"][0]["plans"][0]["layers"][0] = 10**6
    path.write_text(json.dumps(packed))
    with pytest.raises(PlanFileError, match="an index past its frontier's row table"):
        load_frontier_file(path)


def test_inline_rows_in_a_version_2_file_are_read(planned):
    """Outside tools may write a version 2 file with rows inline (no tables): it reads the same."""
    inline = {**planned.to_json(), "version": 2}
    assert FrontierFile.from_json(inline) == planned
    mixed = planned.to_json(shared=True)
    f = mixed["frontiers"][0]
    f["plans"][0]["layers"][0] = f["layer_rows"][f["plans"][0]["layers"][0]]  # one row inline
    assert FrontierFile.from_json(mixed) == planned
