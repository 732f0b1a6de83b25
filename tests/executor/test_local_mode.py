"""Which plans the executor runs on local tensors (no DTensor dispatch), decided without a process group.

Parity of the local mode with the 1-process run is in test_parity.py (the MLP's data-parallel
plan runs in it); here: the mode is chosen exactly for pure batch splits laid out alike.
"""

from __future__ import annotations

import pytest
import torch

from tensoropt.capture.graph import build_graph
from tensoropt.configspace import configurations
from tensoropt.configspace.configuration import Mesh
from tensoropt.executor.job.program import export_program, lazy_views
from tensoropt.executor.program.interpreter import PlanInterpreter
from tensoropt.models import build_model

pytestmark = pytest.mark.timeout(120)


def _setup():
    torch.manual_seed(0)
    model, _ = build_model("mlp", in_features=8, hidden=[16, 16], num_classes=4)
    example = (torch.randn(8, 8), torch.randint(0, 4, (8,)))
    ep = export_program(model, example)
    graph = build_graph(ep)
    operands = {n: d["operands"] for n, d in graph.nx.nodes(data=True)}
    return ep, operands, configurations(graph, Mesh((2,), ("gpu",)))


def _interpreter(ep, operands, placements, local=True):
    mesh = object()  # the choice reads the plan only; no process group is needed
    return PlanInterpreter(ep.graph_module, placements, mesh, operands, lazy_views(ep, placements),
                           local=local)


def _pick(confs, label):
    return {name: next((c for c in cs if c.label == label), next(c for c in cs if c.label == "replicate"))
            for name, cs in confs.items()}


def test_data_parallel_plan_runs_on_local_tensors():
    ep, operands, confs = _setup()
    dp = _pick(confs, "batch=2")
    assert _interpreter(ep, operands, dp).batch_axes == (0,)
    assert _interpreter(ep, operands, dp, local=False).batch_axes is None


def test_a_sharded_weight_or_a_layout_change_goes_through_dtensor():
    ep, operands, confs = _setup()
    dp = _pick(confs, "batch=2")
    linears = [n for n in dp if n.startswith("linear")]
    tp = dict(dp, **{linears[1]: next(c for c in confs[linears[1]] if c.label == "out=2")})
    assert _interpreter(ep, operands, tp).batch_axes is None
    # every node replicated except the input batch split: a redistribution (S(0) -> R) in between
    rep = _pick(confs, "replicate")
    rep["x"] = dp["x"]
    assert _interpreter(ep, operands, rep).batch_axes is None


@pytest.mark.parametrize("smoothing, want", [(0.0, (0,)), (0.1, None)])
def test_a_smoothed_loss_goes_through_dtensor(smoothing, want):
    class Smoothed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x, y):
            return torch.nn.functional.cross_entropy(self.fc(x), y, label_smoothing=smoothing)

    example = (torch.randn(8, 8), torch.randint(0, 4, (8,)))
    ep = export_program(Smoothed(), example)
    graph = build_graph(ep)
    operands = {n: d["operands"] for n, d in graph.nx.nodes(data=True)}
    dp = _pick(configurations(graph, Mesh((2,), ("gpu",))), "batch=2")
    assert _interpreter(ep, operands, dp).batch_axes == want


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_partial_loss_with_uneven_label_counts_matches_one_process(tmp_path):
    """The local mode's loss stays a partial sum (its label count all-reduced during forward):
    with ignored labels only on rank 0, losses and parameters still equal the 1-process run."""
    import dataclasses

    from hand_plans import SPECS, mlp_plans
    from launch_helpers import parity_errors, run_plans, single_process

    spec = dataclasses.replace(SPECS["mlp"], dataset="toy_models:mlp_dataset_ignored")
    dp = next(p for p in mlp_plans(2) if p["id"] == "mlp-dp")
    rc, _ = run_plans([("mlp", spec, dp)], 2, tmp_path)
    assert rc == 0
    assert parity_errors("mlp", "mlp-dp", tmp_path, single_process(spec)) == []


def test_the_partial_loss_share_sums_to_the_global_mean():
    from tensoropt.executor.ops.local_ops import partial_mean_cross_entropy

    torch.manual_seed(0)
    logits, labels = torch.randn(8, 4), torch.randint(0, 4, (8,))
    labels[:3] = -100
    count = torch.tensor([float((labels != -100).sum())], dtype=torch.float64)
    shares = [partial_mean_cross_entropy(logits[i:i + 4], labels[i:i + 4], -100, count) for i in (0, 4)]
    want = torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100)
    assert torch.allclose(shares[0] + shares[1], want)


def _count_all_reduce_worker(rank: int, store_path: str, out_path: str) -> None:
    """One of 2 ranks: the data-parallel MLP without the global batch at hand (label count all-reduced)."""
    import dataclasses
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch.distributed as dist
    from hand_plans import SPECS, mlp_plans

    from tensoropt.executor.job.plan import ExecPlan
    from tensoropt.executor.state.worker import end_process_group
    from tensoropt.training.trainer import Trainer

    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    try:
        spec = dataclasses.replace(SPECS["mlp"], dataset="toy_models:mlp_dataset_ignored")
        trainer = Trainer(spec, ExecPlan.from_json(next(p for p in mlp_plans(2) if p["id"] == "mlp-dp")))
        values = trainer._placeholder_values(trainer.batch(0))
        trainer.interpreter.global_inputs = {}  # as a caller without the global batch runs it
        loss = trainer.interpreter.run(*values)[0]
        assert loss.placements[0].is_partial()
        loss.backward()
        trainer._sync_grads()
        grads = {k: p.grad.full_tensor() for k, p in trainer.params.items()}
        value = loss.full_tensor().item()  # collectives: on every rank
        if rank == 0:
            torch.save({"loss": value, "grads": grads}, out_path)
    finally:
        end_process_group()


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_label_count_all_reduced_when_the_global_batch_is_not_at_hand(tmp_path):
    import dataclasses

    import torch.multiprocessing as mp
    from hand_plans import SPECS

    from tensoropt.executor.job.plan import ExecPlan
    from tensoropt.training.trainer import Trainer

    out = tmp_path / "out.pt"
    mp.start_processes(_count_all_reduce_worker, args=(str(tmp_path / "store"), str(out)), nprocs=2,
                       start_method="spawn")
    got = torch.load(out)
    spec = dataclasses.replace(SPECS["mlp"], dataset="toy_models:mlp_dataset_ignored")
    single = Trainer(spec, ExecPlan.from_json({"mesh": {"shape": [], "levels": []}, "placements": {}}))
    loss = single.interpreter.run(*single._placeholder_values(single.batch(0)))[0]
    loss.backward()
    assert got["loss"] == pytest.approx(loss.item(), rel=1e-5)
    for key, p in single.params.items():
        assert torch.allclose(got["grads"][key], p.grad, rtol=1e-5, atol=1e-7), key
