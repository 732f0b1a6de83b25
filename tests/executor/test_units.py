"""Executor pieces that need no process group: layouts, plans, data, memory, launch, metrics."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from torch.distributed.tensor import Partial, Replicate, Shard

from tensoropt.configspace.configuration import Configuration
from tensoropt.executor.job.data import InputSpec, load_factory, synthetic_batch
from tensoropt.executor.job.plan import ExecPlan
from tensoropt.executor.ops.placements import raw_output_layout, to_layout, to_placements
from tensoropt.executor.program.interpreter import preimage
from tensoropt.executor.state.memory import SavedTensors, storage_bytes, storage_keys
from tensoropt.executor.state.worker import end_process_group
from tensoropt.launch import LaunchOptions, torchrun_command
from tensoropt.training.trainer import RunResult, Trainer
from tensoropt.training.worker import metrics_json

pytestmark = pytest.mark.timeout(120)


def test_layouts_round_trip_through_dtensor_placements():
    layout = ("S(0)", "R", "P", "S(2)")
    assert to_placements(layout) == (Shard(0), Replicate(), Partial(), Shard(2))
    assert to_layout(to_placements(layout)) == layout
    assert to_layout((Shard(-1),), ndim=3) == ("S(2)",)
    with pytest.raises(ValueError, match="unknown placement 'X'"):
        to_placements(("X",))


def test_raw_output_has_partial_on_partial_axes_only():
    c = Configuration("batch=2,in=2", (("batch", (0,)), ("in", (1,))), (("S(0)", "S(1)"),), (),
                      ("S(0)", "R"), partial_axes=(1,))
    assert raw_output_layout(c) == ("S(0)", "P")


@pytest.mark.parametrize("target, dim_map, shape, mesh, want", [
    (("S(1)",), [0, 1, None, None], (4, 8, 3, 3), (2,), ("S(1)",)),   # flatten keeps the channel shard
    (("S(2)",), [0, None, 1], (4, 5, 6), (2,), ("R",)),               # nothing maps onto dim 2
    (("S(2)", "S(2)"), [0, 2, 1, None], (4, 2, 4, 4), (2, 2), ("S(1)", "R")),  # 2 heads cannot split 4 ways
    (("R", "S(0)"), [0, 1], (8, 3), (2, 2), ("R", "S(0)")),
])
def test_preimage_of_a_layout_through_views(target, dim_map, shape, mesh, want):
    assert preimage(target, dim_map, shape, mesh) == want


def test_plan_json_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="missing the key 'placements'"):
        ExecPlan.from_json({"mesh": {"shape": [2], "levels": ["gpu"]}})
    with pytest.raises(ValueError, match="'devices' is 4 but its mesh"):
        ExecPlan.from_json({"mesh": {"shape": [2], "levels": ["gpu"]}, "placements": {}, "devices": 4})
    bad = tmp_path / "plan.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read plan file"):
        ExecPlan.load(bad)


def test_synthetic_batches_depend_only_on_seed_and_step():
    specs = [InputSpec((3, 2)), InputSpec((), "int64", high=7)]
    a = synthetic_batch(specs, 6, seed=1, step=4)
    b = synthetic_batch(specs, 6, seed=1, step=4)
    c = synthetic_batch(specs, 6, seed=1, step=5)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])
    assert a[1].dtype == torch.int64 and int(a[1].max()) < 7 and a[0].shape == (6, 3, 2)
    with pytest.raises(ValueError, match="needs a positive 'high'"):
        InputSpec((), "int64")
    with pytest.raises(ValueError, match="has no callable 'nope'"):
        load_factory("math:nope")
    with pytest.raises(ValueError, match="not of the form 'package.module:function'"):
        load_factory("math.sqrt")


def test_saved_tensors_count_each_storage_once():
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(8, 4)
    with SavedTensors() as saved:
        h = torch.relu(x @ w)     # mm saves x (and w); relu saves its output h
        (h @ w).sum()             # mm saves h again and w again: no new storage
    bytes_ = saved.bytes(exclude=storage_keys([w]))
    assert bytes_ == x.nbytes + h.nbytes
    assert storage_bytes([x, x[:2], x.view(-1)]) == x.nbytes


def test_single_process_run_matches_the_eager_model():
    # the toy MLP from the executor tests against plain PyTorch on the same batches
    from hand_plans import SPECS

    spec = SPECS["mlp"]
    trainer = Trainer(spec, ExecPlan.from_json({"mesh": {"shape": [], "levels": []}, "placements": {}}))
    result = trainer.train(3)
    model = spec.build_model()
    opt = spec.make_optimizer(list(model.parameters()))
    losses = []
    for step in range(3):
        loss = model(*trainer.batch(step))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    assert [s["loss"] for s in result.steps] == pytest.approx(losses, rel=1e-6)
    for key, value in trainer.full_params().items():
        torch.testing.assert_close(value, dict(model.named_parameters())[key], rtol=1e-6, atol=1e-7)
    params = sum(p.numel() for p in model.parameters()) * 4
    assert result.memory_bytes >= 2 * params + 2 * params  # params, grads, AdamW's two moments


def test_metrics_document_has_the_issue_schema():
    r = RunResult("d2-p3", 2, [{"step": s, "loss": 1.0, "time_s": t} for s, t in enumerate([0.5, 0.1, 0.3])],
                  memory_bytes=1234, peak_bytes=5678, peak_tensor_bytes=4321)
    plan = ExecPlan.from_json({"id": "d2-p3", "mesh": {"shape": [2], "levels": ["gpu"]}, "placements": {},
                               "time_s": 0.2, "memory_bytes": 1000})
    m = metrics_json(r, plan)
    assert set(m) == {"plan_id", "devices", "steps", "predicted", "measured"}
    # median without the warm-up step
    assert m["measured"] == {"time_s": 0.2, "memory_bytes": 1234, "peak_bytes": 5678,
                             "peak_tensor_bytes": 4321}
    assert m["predicted"] == {"time_s": 0.2, "memory_bytes": 1000.0}


def test_torchrun_command_standalone_and_multinode():
    local = torchrun_command(LaunchOptions(4), "tensoropt.executor.state.worker", ["r.json"])
    assert "--standalone" in local and local[-3:] == ["-m", "tensoropt.executor.state.worker", "r.json"]
    multi = " ".join(torchrun_command(LaunchOptions(8, nnodes="2", node_rank=1, rdzv_endpoint="h:29500"),
                                      "m", []))
    assert "--nnodes 2" in multi and "--node-rank 1" in multi and "--rdzv-endpoint h:29500" in multi
    with pytest.raises(ValueError, match="needs --rdzv-endpoint"):
        LaunchOptions(2, nnodes="2")


def test_run_command_explains_bad_input(tmp_path, capsys):
    from tensoropt import cli

    job = str(Path(__file__).resolve().parents[2] / "configs/jobs/cpu-demo.yaml")
    bad = tmp_path / "plan.json"
    bad.write_text("{}")
    assert cli.main(["run", job, "--plan", str(bad)]) == 1
    assert "missing the key 'mesh'" in capsys.readouterr().err
    assert cli.main(["run", job]) == 1
    assert "give the device count with --nproc N" in capsys.readouterr().err
    plan = tmp_path / "p2.json"
    plan.write_text('{"id": "d2-p0", "devices": 2, "mesh": {"shape": [2], "levels": ["gpu"]}, '
                    '"placements": {}}')
    assert cli.main(["run", job, "--plan", str(plan), "--nproc", "4"]) == 1
    assert "is for 2 devices but --nproc 4" in capsys.readouterr().err


def test_dataset_factory_feeds_the_global_batch_of_each_step():
    from hand_plans import SPECS

    spec = dataclasses.replace(SPECS["mlp"], dataset="toy_models:mlp_dataset", lr=0.1, optimizer="sgd")
    trainer = Trainer(spec, ExecPlan.from_json({"mesh": {"shape": [], "levels": []}, "placements": {}}))
    import toy_models

    x, y = trainer.batch(3)
    want_x, want_y = toy_models.mlp_dataset(3, spec.global_batch_size, spec.seed)
    assert torch.equal(x, want_x) and torch.equal(y, want_y)
    result = trainer.train(20)
    assert result.steps[-1]["loss"] < result.steps[0]["loss"]  # it learns the rule
    assert [s["step"] for s in trainer.train(2, start_step=20).steps] == [20, 21]


def test_redistributed_values_keep_reshape_working(tmp_path):
    """A gathered value whose global strides are those of a transposed view (an attention
    output) must still reshape after a transpose: the local tensor is relaid, values unchanged."""
    import torch.distributed as dist
    from torch.distributed.tensor import DeviceMesh, DTensor

    from tensoropt.executor.ops.explicit_ops import consistent_strides

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        mesh = DeviceMesh("cpu", [0])
        # (b, h, t, d) laid out in (b, t, h, d) memory, as attention returns it
        global_value = torch.arange(48.0).reshape(2, 3, 4, 2).transpose(1, 2)
        gathered = DTensor.from_local(global_value.contiguous().requires_grad_(), mesh, [Replicate()],
                                      run_check=False, shape=global_value.shape, stride=global_value.stride())
        with pytest.raises(RuntimeError, match="view size"):
            gathered.transpose(1, 2).reshape(2, 4, 6)  # what DTensor does without the fix
        fixed = consistent_strides(gathered)
        out = fixed.transpose(1, 2).reshape(2, 4, 6)
        assert torch.equal(out.full_tensor(), global_value.transpose(1, 2).reshape(2, 4, 6))
        out.sum().backward()  # differentiable: the gradient reaches the gathered value
        assert consistent_strides(fixed) is fixed  # already consistent: the identity, no copy
    finally:
        end_process_group()
