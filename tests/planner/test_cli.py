"""The CLI: select/explain on a synthetic frontier file, exit codes, and command discovery."""

from __future__ import annotations

import json
import sys
import types

import pytest

from tensoropt import cli
from tensoropt.plans import load_frontier_file, plan_file_text


def test_select_writes_plan_and_records_selected(frontier_path, capsys):
    rc = cli.main(["select", str(frontier_path), "--devices", "4", "--memory-budget", "17179869184"])
    assert rc == 0
    ff = load_frontier_file(frontier_path)
    expected = min((p for p in ff.frontier(4).plans if p.memory_bytes <= 16 * 2**30), key=lambda p: p.time_s)
    assert ff.selected == expected.id
    plan_json = frontier_path.parent / "plan.json"
    assert plan_json.read_text() == plan_file_text(ff.to_json(), expected.id)
    out = capsys.readouterr().out
    assert f"selected {expected.id}" in out and "split:" in out


def test_select_to_named_output_with_units_and_folder_argument(frontier_path, tmp_path):
    out = tmp_path / "mine.json"
    rc = cli.main(
        [
            "select",
            str(frontier_path.parent),
            "--devices",
            "8",
            "--memory-budget",
            "16 GiB",
            "--rule",
            "fastest",
            "-o",
            str(out),
        ]
    )
    assert rc == 0
    assert json.loads(out.read_text())["devices"] == 8
    assert not (frontier_path.parent / "plan.json").exists()


def test_select_infeasible_exit_code_2_and_nothing_written(frontier_path, capsys):
    before = frontier_path.read_text()
    rc = cli.main(["select", str(frontier_path), "--devices", "2", "--memory-budget", "1MiB"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "no plan fits 1.0 MiB per device on 2 devices" in err
    assert "smallest memory any plan needs there is" in err
    assert frontier_path.read_text() == before
    assert not (frontier_path.parent / "plan.json").exists()


def test_select_devices_auto_uses_nproc_without_gpus(frontier_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["select", str(frontier_path), "--devices", "auto", "--nproc", "2"]) == 0
    assert json.loads((frontier_path.parent / "plan.json").read_text())["devices"] == 2
    assert cli.main(["select", str(frontier_path), "--devices", "auto"]) == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--devices", "3"], "no frontier for 3 devices"),
        (["--devices", "0"], "--devices must be >= 1"),
        (["--memory-budget", "lots"], "--memory-budget: cannot parse 'lots'"),
    ],
)
def test_select_bad_arguments_exit_1(frontier_path, capsys, argv, message):
    assert cli.main(["select", str(frontier_path), *argv]) == 1
    assert message in capsys.readouterr().err


def test_select_unreadable_frontier_file(tmp_path, capsys):
    assert cli.main(["select", str(tmp_path / "nope.json")]) == 1
    assert "nope.json: cannot read" in capsys.readouterr().err


def test_explain_prints_layers_and_redistributions(frontier_path, capsys):
    assert cli.main(["select", str(frontier_path), "--devices", "8", "--memory-budget", "64GiB"]) == 0
    capsys.readouterr()
    assert cli.main(["explain", str(frontier_path.parent / "plan.json")]) == 0
    out = capsys.readouterr().out
    ff = load_frontier_file(frontier_path)
    _, plan = ff.find(ff.selected)
    assert f"plan {plan.id} on 8 devices" in out
    for layer in plan.layers:
        assert layer.node in out and layer.config in out
    assert "S(0),S(0),S(0) -> R,R,R" in out
    # a plan of the frontier file by id
    assert cli.main(["explain", str(frontier_path), "--id", "d2-p1", "--sort", "time"]) == 0
    assert "plan d2-p1 on 2 devices" in capsys.readouterr().out


def test_missing_command_module_is_skipped_and_broken_one_reported(monkeypatch, capsys):
    broken = types.ModuleType("tensoropt.commands.zzbroken")

    def add_parser(subparsers):
        raise RuntimeError("half written")

    broken.add_parser = add_parser
    monkeypatch.setitem(sys.modules, "tensoropt.commands.zzbroken", broken)
    monkeypatch.setattr(cli, "COMMANDS", ("select", "zzmissing", "zzbroken"))
    text = cli.build_parser().format_help()
    assert "select" in text and "zzmissing" not in text and "unavailable" in text
    assert cli.main(["zzbroken"]) == 1
    assert (
        "this command is unavailable here (RuntimeError in add_parser: half written)"
        in capsys.readouterr().err
    )
    assert cli.main([]) == 1


def test_progress_bar_in_logs_prints_each_stage_once_and_throttles(monkeypatch):
    import io

    from tensoropt.progress import ProgressBar

    out = io.StringIO()
    bar = ProgressBar(stream=out, width=10, log_every_s=3600)
    for i in range(100):
        bar("solving 8 devices", i / 100)
    bar("8 devices: 12 plans", 1.0)
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("[..........]   0%") and lines[1].startswith("[##########] 100%")
    assert lines[1].endswith("8 devices: 12 plans")


def test_explain_sorted_by_memory_and_time():
    from tensoropt.commands.explain import explain_text
    from tensoropt.configspace.configuration import Mesh
    from tensoropt.plans import Layer, Plan, PlanFile

    layers = [
        Layer(f"n{i}", "aten.linear.default", f"m{i}", "replicate", t, 0.0, m)
        for i, (t, m) in enumerate([(1e-3, 10), (3e-3, 30), (2e-3, 20)])
    ]
    plan_file = PlanFile(Plan("d1-p0", 6e-3, 60, {}, layers=layers), 1, Mesh((), ()), {}, {})

    def order(text):
        return [line.split()[0] for line in text.splitlines() if line.split()[:1] in (["n0"], ["n1"], ["n2"])]

    assert order(explain_text(plan_file, "graph")) == ["n0", "n1", "n2"]
    assert order(explain_text(plan_file, "memory")) == ["n1", "n2", "n0"]
    assert order(explain_text(plan_file, "time")) == ["n1", "n2", "n0"]
    assert [x.node for x in plan_file.plan.layers] == ["n0", "n1", "n2"]  # the plan itself is not reordered
