"""The elastic/checkpoint options of `tensoropt run`: parsing, checks, torchrun command, RUN.json."""

from __future__ import annotations

import argparse

import pytest

from tensoropt.elastic import add_run_arguments, check_run_arguments, launch_options, run_entry
from tensoropt.launch import torchrun_command

pytestmark = pytest.mark.timeout(60)


def _parse(*argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--plan", default=None)
    parser.add_argument("--nnodes", default="1")  # defined by the run command already: kept
    add_run_arguments(parser)
    return parser.parse_args(list(argv))


def test_elastic_command_line_becomes_a_c10d_torchrun():
    args = _parse("--elastic", "--nnodes", "1:2", "--nproc-per-node", "1",
                  "--rdzv-endpoint", "127.0.0.1:29400", "--rdzv-conf", "last_call_timeout=1",
                  "--checkpoint-dir", "ck", "--checkpoint-every", "5")
    assert check_run_arguments(args) is None
    cmd = torchrun_command(launch_options(args, 4, {"model": "mlp"}), "tensoropt.executor.state.worker",
                           ["r.json"])
    text = " ".join(cmd)
    assert "--standalone" not in cmd
    for part in ("--nproc-per-node 1", "--nnodes 1:2", "--rdzv-backend c10d",
                 "--rdzv-endpoint 127.0.0.1:29400", "--max-restarts 3",
                 "--rdzv-conf last_call_timeout=1", "--rdzv-id tensoropt-"):
        assert part in text, text
    entry = run_entry(args, "out/frontier.json", None)
    assert entry["select"] == {"frontier": "out/frontier.json", "job": None}
    assert entry["checkpoint"]["every"] == 5 and entry["checkpoint"]["dir"].endswith("/ck")


@pytest.mark.parametrize("argv, problem", [
    (("--elastic", "--nnodes", "1:2", "--checkpoint-dir", "ck"), "--rdzv-endpoint"),
    (("--elastic", "--nnodes", "1:2", "--rdzv-endpoint", "h:1"), "--checkpoint-dir"),
    (("--elastic", "--rdzv-endpoint", "h:1", "--checkpoint-dir", "ck", "--plan", "p.json"), "drop --plan"),
    (("--checkpoint-every", "5",), "needs --checkpoint-dir"),
    (("--checkpoint-dir", "ck", "--checkpoint-every", "-1"), ">= 0"),
])
def test_bad_option_combinations_are_explained(argv, problem):
    assert problem in check_run_arguments(_parse(*argv))


def test_fixed_plan_with_checkpoints_keeps_its_plan():
    args = _parse("--plan", "p.json", "--checkpoint-dir", "ck")
    assert sorted(run_entry(args, None, None)) == ["checkpoint"]
    assert run_entry(_parse(), None, None) == {}
    assert launch_options(_parse(), 2, {}).nproc_per_node == 2


def _frontier_file(path, pipelined: bool):
    """A one-plan frontier.json for 2 devices, its plan pipelined or not."""
    from tensoropt.plans import Frontier, FrontierFile, Mesh, Plan

    stages = {"stages": 2, "schedule": "1F1B", "micro_batches": 2, "blocks": [[0, 0], [1, 1]]}
    plan = Plan("d2-p0", 0.5, 1024, {}, pipeline=stages if pipelined else None)
    FrontierFile({}, [Frontier(2, Mesh((2,), ("gpu",)), [plan])]).write(path)
    return path


@pytest.mark.parametrize("pipelined, module",
                         [(True, "tensoropt.training.loop"), (False, "tensoropt.training.worker")])
def test_an_elastic_start_that_may_select_a_pipelined_plan_runs_the_loop(tmp_path, monkeypatch, pipelined,
                                                                          module):
    """A job without trainer keys: elastic starts go through the executor's worker, unless the
    frontier lists a pipelined plan; then through the trainer's loop, told to keep pipelined plans
    (it hands one to the pipelined runtime)."""
    from tensoropt.cli import main
    from tensoropt.config import Job

    launched = []
    monkeypatch.setattr("tensoropt.commands.run.launch_run",
                        lambda module, config, *rest: launched.append((module, config)) or 0)
    job = tmp_path / "job.yaml"
    job.write_text(Job(model={"name": "mlp"}, cluster="cpu-local", devices=[1, 2]).to_yaml())
    frontier = _frontier_file(tmp_path / "frontier.json", pipelined)
    rc = main(["run", str(job), "--elastic", "--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-endpoint",
               "127.0.0.1:1", "--checkpoint-dir", str(tmp_path / "ck"), "--frontier", str(frontier),
               "--keep-checkpoints", "3",
               "--metrics", str(tmp_path / "metrics.json")])  # the loop writes beside it, not in out/
    assert rc == 0
    [(started, config)] = launched
    assert started == module
    select = config["select"] if pipelined else config["runs"][0]["select"]
    assert select["frontier"] == str(frontier) and bool(select.get("pipelined")) == pipelined
    keep = config["keep_checkpoints"] if pipelined else config["runs"][0]["checkpoint"]["keep"]
    assert keep == 3  # both runtimes keep --keep-checkpoints complete checkpoints


@pytest.mark.parametrize("where", ["flag", "job"])
def test_compile_reaches_the_loop_of_a_start_that_may_select_a_pipelined_plan(tmp_path, monkeypatch, capsys,
                                                                              where):
    """An elastic start that may select a pipelined plan and a compile backend (the flag, or the
    job's executor.compile): the loop's RUN.json carries it to whichever runtime a start picks (the
    pipelined runtime compiles its stages); a backend the pipelined runtime does not take (none
    today: the list is narrowed here) is refused before launch, naming its source and the two ways
    out (no compile; no pipelined plan in the selection)."""
    from tensoropt.cli import main
    from tensoropt.config import Job

    launched = []
    monkeypatch.setattr("tensoropt.commands.run.launch_run",
                        lambda module, config, *rest: launched.append((module, config)) or 0)
    job = tmp_path / "job.yaml"
    extra = {"executor": {"compile": "inductor"}} if where == "job" else {}
    job.write_text(Job.from_dict({"model": {"name": "mlp"}, "cluster": "cpu-local", "devices": [1, 2],
                                  **extra}).to_yaml())
    frontier = _frontier_file(tmp_path / "frontier.json", True)
    flag = ["--compile", "inductor"] if where == "flag" else []
    argv = ["run", str(job), "--elastic", "--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-endpoint",
            "127.0.0.1:1", "--checkpoint-dir", str(tmp_path / "ck"), "--frontier", str(frontier),
            "--metrics", str(tmp_path / "metrics.json")]
    assert main([*argv, *flag]) == 0, capsys.readouterr().err
    [(module, config)] = launched
    assert module == "tensoropt.training.loop" and config["compile"] == "inductor"
    assert config["select"]["pipelined"]
    launched.clear()
    monkeypatch.setattr("tensoropt.commands.run_pipelined.PIPELINED_COMPILE_BACKENDS", ("none",))
    rc = main([*argv, *flag])
    err = capsys.readouterr().err
    assert rc == 1 and not launched, err
    source = "--compile inductor is refused" if where == "flag" else "the job's executor.compile: inductor"
    for part in (source, "does not compile its stages with inductor", "Pass --compile none",
                 "planner.pipeline: off"):
        assert part in err, err
    assert main([*argv, "--compile", "none"]) == 0  # the way out
    assert [(m, c["compile"]) for m, c in launched] == [("tensoropt.training.loop", "none")]
