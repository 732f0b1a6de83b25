"""The selection margin (issue 29 item 3): a plan's predicted gain over a simpler plan must exceed the
estimator's measured error for the model's family, else the simpler plan is selected; select and
explain say so."""

from __future__ import annotations

import json
import statistics

import pytest
import yaml

from estimators.time_errors import load_time_errors
from tensoropt import cli
from tensoropt.config import Job
from tensoropt.configspace.configuration import Configuration, Mesh
from tensoropt.planner import plan_job
from tensoropt.plans import Frontier, FrontierFile, Plan, Redistribution, load_frontier_file, load_plan_file
from tensoropt.selector import frontier_margin, select

MESH = Mesh((2,), ("gpu",))
BATCH = Configuration("batch=2", (("batch", (0,)),), (("S(0)",),), (("fc.weight", ("R",)),), ("S(0)",),
                      grad_sync_axes=(("fc.weight", (0,)),))
OUT = Configuration("out=2", (("out", (0,)),), (("R",),), (("fc.weight", ("S(0)",)),), ("S(1)",))
LM_NODES = [["ids", "input", [8, 16], "int64", {}],
            ["emb", "aten.embedding.default", [8, 16, 32], "float32", {}],
            ["att", "aten.scaled_dot_product_attention.default", [8, 2, 16, 16], "float32", {}]]
CNN_NODES = [["x", "input", [8, 3, 8, 8], "float32", {}],
             ["conv", "aten.conv2d.default", [8, 4, 8, 8], "float32", {}]]


def _moves(n: int) -> list[Redistribution]:
    return [Redistribution(f"a{i}", f"b{i}", ["S(0)"], ["R"], 1e-3) for i in range(n)]


def _frontier_file(fast_s: float, dp_s: float = 1.0, nodes=LM_NODES, dp_memory: float = 100.0,
                   also: list[Plan] = ()) -> FrontierFile:
    """A 2-device frontier: the fastest plan (out=2, three redistributions), ``also``, and the
    data-parallel plan recorded apart (off the frontier: slower, and no leaner)."""
    fast = Plan("d2-p0", fast_s, 100.0, {"fc": "out=2"}, redistributions=_moves(3))
    dp = Plan("d2-dp", dp_s, dp_memory, {"fc": "batch=2"})
    configurations = {"fc": {"out=2": OUT.to_json(), "batch=2": BATCH.to_json()}}
    frontier = Frontier(2, MESH, [fast, *also], configurations, data_parallel=dp)
    return FrontierFile({"cluster": "cpu-local"}, [frontier], graph={"nodes": nodes})


def test_gain_below_the_margin_selects_the_data_parallel_plan():
    ff = _frontier_file(fast_s=0.97)  # 3 % faster
    chosen = select(ff, devices=2, margin=0.05)
    assert chosen.plan.id == "d2-dp" and chosen.rule_plan.id == "d2-p0"
    assert chosen.gain == pytest.approx(0.03)
    assert chosen.to_json()["gain"] == pytest.approx(0.03) and chosen.to_json()["plan"] == "d2-dp"


def test_gain_above_the_margin_keeps_the_faster_plan():
    ff = _frontier_file(fast_s=0.90)  # 10 % faster
    chosen = select(ff, devices=2, margin=0.05)
    assert chosen.plan.id == "d2-p0" and chosen.gain is None
    assert select(ff, devices=2, margin=0.0).plan.id == "d2-p0"  # 0: off
    assert select(_frontier_file(fast_s=0.97), devices=2, margin=None).plan.id == "d2-p0"


def test_without_a_data_parallel_plan_in_reach_fewer_redistributions_win():
    middle = Plan("d2-p1", 0.98, 90.0, {"fc": "out=2"}, redistributions=_moves(1))
    slow = Plan("d2-p2", 1.20, 80.0, {"fc": "out=2"})  # no move, but 19 % slower: beyond the margin
    ff = _frontier_file(fast_s=0.96, dp_s=2.0, also=[middle, slow])
    assert select(ff, devices=2, margin=0.05).plan.id == "d2-p1"
    assert select(ff, devices=2, margin=0.25).plan.id == "d2-p2"  # DP is 52 % slower: not within 25 %
    assert select(ff, devices=2, margin=0.6).plan.id == "d2-dp"


def test_the_margin_respects_the_memory_budget():
    ff = _frontier_file(fast_s=0.97, dp_memory=500.0)
    assert select(ff, devices=2, margin=0.05, memory_budget_bytes=200.0).plan.id == "d2-p0"
    assert select(ff, devices=2, margin=0.05, memory_budget_bytes=600.0).plan.id == "d2-dp"


def test_auto_margin_is_the_measured_error_of_the_family(tmp_path, monkeypatch):
    families = {"lm": {"error": 0.04, "plans": 8, "models": ["hf-bert"], "source": "a launch"},
                "cnn": {"error": 0.30, "plans": 2, "models": ["cnn"], "source": "a launch"}}
    (tmp_path / "time_errors.yaml").write_text(
        yaml.safe_dump({"default_error": 0.2, "clusters": {"cpu-local": families}}))
    monkeypatch.setenv("TENSOROPT_CONFIGS", str(tmp_path))
    lm = _frontier_file(fast_s=0.97)
    m = frontier_margin(lm)
    assert (m.family, m.cluster, m.fraction, m.source) == ("lm", "cpu-local", 0.04, "a launch")
    assert select(lm, devices=2).plan.id == "d2-dp"  # 3 % gain, within the LMs' 4 %
    assert select(_frontier_file(fast_s=0.95), devices=2).plan.id == "d2-p0"  # 5 % gain: beyond it
    cnn = _frontier_file(fast_s=0.80, nodes=CNN_NODES)  # 20 % faster, but the CNN's error is 30 %
    assert frontier_margin(cnn).fraction == 0.30 and select(cnn, devices=2).plan.id == "d2-dp"
    other = FrontierFile({"cluster": "h100x8"}, lm.frontiers, graph=lm.graph)
    assert frontier_margin(other).fraction == 0.2  # the table's default_error
    assert load_time_errors(tmp_path / "time_errors.yaml").error("cpu-local", "mlp").error == 0.2


def test_the_repository_table_is_measured_and_covers_the_runtime_families():
    table = load_time_errors()
    assert table.path.endswith("time_errors.yaml")
    families = table.clusters["cpu-local"]
    assert {"lm", "cnn", "mlp", "transformer"} <= set(families)
    for entry in families.values():  # each the median of its measured samples
        assert entry.samples and entry.error == pytest.approx(statistics.median(entry.samples))
        assert entry.plans == len(entry.samples) and entry.models and "runtime.py" in entry.source


def test_select_and_explain_show_the_margin(tmp_path, capsys):
    path = tmp_path / "frontier.json"
    _frontier_file(fast_s=0.97).write(path)
    assert cli.main(["select", str(path), "--devices", "2", "--margin", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "selected d2-dp" in out
    assert "margin 5.0 % (--margin)" in out and "d2-p0 is predicted 3.0 % faster than d2-dp" in out
    plan = load_plan_file(tmp_path / "plan.json")
    assert plan.plan.id == "d2-dp" and plan.placements["fc"].label == "batch=2"
    assert plan.selection["margin"]["fraction"] == 0.05 and plan.selection["rule_plan"] == "d2-p0"
    assert load_frontier_file(path).selection["plan"] == "d2-dp"
    assert cli.main(["explain", str(tmp_path / "plan.json")]) == 0
    explained = capsys.readouterr().out
    assert "selected by rule fastest: margin 5.0 %" in explained and "within the margin" in explained
    assert cli.main(["select", str(path), "--devices", "2", "--margin", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "selected d2-p0" in out and "no simpler plan within it: d2-p0 is kept" in out
    assert cli.main(["explain", str(path)]) == 0  # the frontier file's selected plan
    assert "margin 1.0 % (--margin); no simpler plan within it" in capsys.readouterr().out
    assert cli.main(["select", str(path), "--devices", "2", "--margin", "2"]) == 1
    assert "--margin must be 'auto' or a fraction" in capsys.readouterr().err


def test_a_planned_frontier_records_the_data_parallel_plan_and_select_writes_its_plan_json(tmp_path):
    job = Job.from_dict({"model": {"name": "mlp"}, "cluster": "cpu-local", "devices": [2],
                         "training": {"global_batch_size": 8}})
    ff = plan_job(job)
    frontier = ff.frontier(2)
    dp = frontier.data_parallel
    assert dp is not None and dp.id == "d2-dp" and set(dp.ops.values()) <= {"batch=2", "replicate"}
    assert all(dp.time_s >= p.time_s or dp.memory_bytes >= p.memory_bytes for p in frontier.plans[:1])
    path = tmp_path / "frontier.json"
    ff.write(path)
    data = json.loads(path.read_text())
    assert data["frontiers"][0]["data_parallel"]["id"] == "d2-dp"
    assert load_frontier_file(path).frontier(2).data_parallel == dp
    assert cli.main(["select", str(path), "--devices", "2", "--margin", "0.99"]) == 0
    plan = load_plan_file(tmp_path / "plan.json")
    assert plan.plan.id == "d2-dp"  # every plan is within 99 %: the simplest, data parallelism
    assert all(plan.placements[n].label == label for n, label in dp.ops.items())
