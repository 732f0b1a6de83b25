"""The replayed local program (issue 16): traced once, replayed, equal to the DTensor interpreter.

* single process: the replayed step of each toy model equals the interpreter's (losses and
  parameters), is traced once for four steps and again for a batch of another shape;
* 2 processes, one launch: tensor-parallel and mixed plans replayed and interpreted side by side
  give the same losses and parameters (1e-6), and the replayed programs hold only functional
  collectives;
* ``defer_waits`` moves a collective's wait past the ops that do not read it;
* Inductor compiles the program of a tiny model (one smoke test) to the same losses;
* ``tensoropt run --compile inductor`` without a C++ compiler stops before any worker starts.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import torch.fx as fx
from hand_plans import SPECS, all_plans
from launch_helpers import ENV, single_process

from tensoropt.executor.job.data import InputSpec, synthetic_batch
from tensoropt.executor.job.plan import ExecPlan
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.executor.program.lowering import defer_waits
from tensoropt.launch import LaunchOptions, launch_workers
from tensoropt.training.trainer import Trainer

SINGLE = ExecPlan.from_json({"id": "single", "mesh": {"shape": [], "levels": []}, "placements": {}})


def _max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("model", ["mlp", "cnn", "gpt"])
def test_single_process_replay_equals_interpreter(model):
    spec = SPECS[model]
    ref_losses, ref_params = single_process(spec, steps=4)
    trainer = Trainer(spec, SINGLE, mode="replay")
    losses = [s["loss"] for s in trainer.train(4).steps]
    assert trainer.program.traces == 1  # step 0 measures through the interpreter, 1-3 replay one trace
    assert losses == pytest.approx(ref_losses, rel=1e-6)
    assert _max_diff(trainer.full_params(), ref_params) < 1e-6


def test_a_batch_of_another_shape_is_traced_again():
    spec = SPECS["mlp"]
    trainer = Trainer(spec, SINGLE, mode="replay")
    reference = Trainer(spec, SINGLE, mode="interpret")
    for rows in (8, 8, 3):
        x = torch.randn(rows, 8, generator=torch.Generator().manual_seed(rows))
        y = torch.arange(rows) % 4
        loss = trainer.program.run(trainer._placeholder_values((x, y)))
        expected = reference.interpreter.run(*reference._placeholder_values((x, y)))
        expected = expected[0] if isinstance(expected, (tuple, list)) else expected
        assert float(loss.detach()) == pytest.approx(float(expected.detach()), rel=1e-6)
        trainer.optimizer.zero_grad(set_to_none=True)
    assert trainer.program.traces == 2


def test_defer_waits_moves_the_wait_past_independent_ops():
    g = fx.Graph()
    x = g.placeholder("x")
    reduced = g.call_function(torch.ops._c10d_functional.all_reduce.default, (x, "sum", "0"))
    wait = g.call_function(torch.ops._c10d_functional.wait_tensor.default, (reduced,))
    busy = g.call_function(torch.ops.aten.mul.Tensor, (x, x))
    busier = g.call_function(torch.ops.aten.relu.default, (busy,))
    total = g.call_function(torch.ops.aten.add.Tensor, (wait, busier))
    g.output(total)
    gm = fx.GraphModule(torch.nn.Module(), g)
    assert defer_waits(gm) == 1
    order = [n.name for n in gm.graph.nodes]
    assert order.index(wait.name) == order.index(total.name) - 1
    assert order.index(reduced.name) < order.index(busy.name)  # the collective is still issued first
    assert defer_waits(gm) == 0


WIDE = TrainSpec("mlp", (InputSpec((64,)), InputSpec((), "int64", 8)), 8,
                 {"in_features": 64, "hidden": [512, 512, 512], "num_classes": 8}, optimizer="adamw", lr=0.01)
"""An MLP whose last hidden layer's gradient (1 MiB) fills the first gradient bucket."""


def _data_parallel(spec: TrainSpec, plan_id: str) -> dict:
    """Every node of ``spec``'s model split on the batch over 2 devices (replicated where it cannot be)."""
    from tensoropt.baselines import data_parallel_index
    from tensoropt.capture import capture
    from tensoropt.configspace import configurations
    from tensoropt.configspace.configuration import Mesh

    batch = synthetic_batch(list(spec.inputs), spec.global_batch_size, spec.seed, 0)
    mesh = Mesh((2,), ("gpu",))
    placements = {name: confs[data_parallel_index(confs, mesh)].to_json()
                  for name, confs in configurations(capture(spec.build_model(), batch), mesh).items()}
    return {"id": plan_id, "devices": 2, "mesh": {"shape": [2], "levels": ["gpu"]}, "placements": placements}


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_replay_equals_interpreter_at_two_processes(tmp_path):
    chosen = {"mlp-tp", "cnn-convout", "gpt-tp", "gpt-dp"}
    cases = [(SPECS[name], plan) for name, plan in all_plans(2) if plan["id"] in chosen]
    cases.append((WIDE, _data_parallel(WIDE, "wide-dp")))
    mlp_dp = next(plan for name, plan in all_plans(2) if plan["id"] == "mlp-dp")
    cases.append((dataclasses.replace(SPECS["mlp"], global_batch_size=7), {**mlp_dp, "id": "mlp-dp-uneven"}))
    chosen |= {"wide-dp", "mlp-dp-uneven"}  # 7 rows: 4 on rank 0, 3 on rank 1 (rank-specific programs)
    runs = []
    for spec, plan in cases:
        for mode in ("replay", "interpret"):
            runs.append({"spec": spec.to_json(), "plan": plan, "executor": {"mode": mode},
                         "metrics": str(tmp_path / f"{plan['id']}-{mode}.json"),
                         "params_out": str(tmp_path / f"{plan['id']}-{mode}.pt")})
    rc = launch_workers({"steps": 4, "runs": runs}, LaunchOptions(2, timeout_s=500), env=ENV)
    assert rc == 0
    for plan_id in sorted(chosen):
        replay = json.loads((tmp_path / f"{plan_id}-replay.json").read_text())
        interp = json.loads((tmp_path / f"{plan_id}-interpret.json").read_text())
        assert replay["executor"]["mode"] == "replay" and replay["executor"]["traces"] == 1
        assert [s["loss"] for s in replay["steps"]] == pytest.approx([s["loss"] for s in interp["steps"]],
                                                                     rel=1e-6), plan_id
        params = torch.load(tmp_path / f"{plan_id}-replay.pt")
        assert _max_diff(params, torch.load(tmp_path / f"{plan_id}-interpret.pt")) < 1e-6, plan_id
        assert replay["executor"]["collectives"] >= 1, plan_id  # the gradient or activation collectives
    # the first gradient bucket's all-reduce is issued during backward: earlier layers' backward overlaps it
    wide = json.loads((tmp_path / "wide-dp-replay.json").read_text())["executor"]
    assert wide["collectives"] >= 2 and wide["overlapped_nodes"] >= 10, wide


@pytest.mark.slow
def test_inductor_compiles_the_replayed_program():
    """The CNN: batch norm updates its running statistics in place (Inductor functionalises them)."""
    pytest.importorskip("torch._inductor")
    spec = SPECS["cnn"]
    plain = Trainer(spec, SINGLE, mode="replay", compile="none")
    compiled = Trainer(spec, SINGLE, mode="replay", compile="inductor")
    a = [s["loss"] for s in plain.train(3).steps]
    b = [s["loss"] for s in compiled.train(3).steps]
    assert compiled.program.traces == 1
    call = next(iter(compiled.program.programs.values()))[1]
    assert call is not next(iter(compiled.program.programs.values()))[0].gm  # the compiled callable ran
    assert b == pytest.approx(a, rel=1e-5)
    assert _max_diff(compiled.full_params(), plain.full_params()) < 1e-5
    assert _max_diff(compiled.buffers, plain.buffers) < 1e-5  # running mean/var updated as in eager
    assert float(compiled.buffers["bn.num_batches_tracked"]) == 3


def test_run_refuses_a_compile_backend_that_cannot_run_before_any_worker(tmp_path, monkeypatch, capsys):
    from tensoropt import cli, launch

    job = str(Path(__file__).resolve().parents[2] / "configs/jobs/cpu-demo.yaml")
    plan = tmp_path / "p2.json"
    plan.write_text('{"id": "d2-p0", "devices": 2, "mesh": {"shape": [2], "levels": ["gpu"]}, '
                    '"placements": {}}')
    monkeypatch.setenv("PATH", str(tmp_path))  # no C++ compiler on it
    monkeypatch.delenv("CXX", raising=False)

    def no_launch(*args, **kwargs):
        raise AssertionError("a worker was launched")

    monkeypatch.setattr(launch, "launch_workers", no_launch)
    assert cli.main(["run", job, "--plan", str(plan), "--compile", "inductor"]) == 1
    assert "needs a C++ compiler" in capsys.readouterr().err
    interpreted = ["run", job, "--plan", str(plan), "--compile", "inductor", "--executor", "interpret"]
    assert cli.main(interpreted) == 1
    assert "needs executor mode replay" in capsys.readouterr().err
