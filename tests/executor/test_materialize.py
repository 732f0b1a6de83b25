"""Building on meta and materialising shard by shard (issue 16 item 3), in one process.

The initial values are one scheme for every plan: a module's ``reset_parameters`` then the
nearest ``_init_weights(module)`` above it, post-order, seeded per module path; a parent's init
that rewrites a child's parameter wins (HuggingFace's GPT-2 rescales ``c_proj`` that way); a
parameter no init writes keeps its constructor value; ``model.checkpoint`` replaces all of it.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from tensoropt.config import Job
from tensoropt.executor.job.data import InputSpec
from tensoropt.executor.job.materialize import build_skeleton, full_model, materialize
from tensoropt.executor.job.plan import ExecPlan
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.executor.state.peak_memory import PeakMemory
from tensoropt.training.trainer import Trainer

SINGLE = ExecPlan.from_json({"id": "single", "mesh": {"shape": [], "levels": []}, "placements": {}})


class Block(nn.Module):
    def __init__(self, width: int = 4):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.proj = nn.Linear(width, width)
        self.scale = nn.Parameter(torch.full((width,), 2.0))  # no module init writes it


class Net(nn.Module):
    """A HuggingFace-style root: ``_init_weights(module)`` applied to every module, post-order."""

    def __init__(self, width: int = 4, tie: bool = True):
        super().__init__()
        self.emb = nn.Embedding(8, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(2))
        self.head = nn.Linear(width, 8, bias=False)
        if tie:
            self.head.weight = self.emb.weight
        self.register_buffer("mask", torch.ones(3, 3).tril(), persistent=False)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, Block):  # the parent rescales a child's weight (GPT-2's c_proj)
            nn.init.constant_(module.proj.weight, 0.5)

    def forward(self, tokens, labels):
        h = self.emb(tokens)
        for b in self.blocks:
            h = b.proj(torch.relu(b.fc(h))) * b.scale
        return nn.functional.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())


def net_factory(**kwargs) -> nn.Module:
    return Net(**kwargs)


def _spec(model: str = f"{__name__}:net_factory", **kwargs) -> TrainSpec:
    tokens = InputSpec((3,), "int64", 8)
    return TrainSpec(model, (tokens, tokens), 4, kwargs, optimizer="sgd", lr=0.1, seed=3)


def test_the_skeleton_holds_no_parameter_memory():
    spec = TrainSpec("torch.nn:Linear", (InputSpec((8,)),), 4, {"in_features": 8192, "out_features": 8192})
    peak = PeakMemory(torch.device("cpu"))
    peak.start()
    skeleton = build_skeleton(spec)  # 256 MiB of parameters, on meta
    assert skeleton.module.weight.is_meta and skeleton.module.bias.is_meta
    assert peak.read() < 64 * 2**20


def test_init_scheme_parent_wins_ties_hold_and_constructor_values_stay():
    model = full_model(build_skeleton(_spec()))
    assert model.head.weight is model.emb.weight  # still tied
    for block in model.blocks:
        assert torch.equal(block.proj.weight, torch.full((4, 4), 0.5))  # the parent's init is the last
        assert 0 < float(block.fc.weight.detach().std()) < 0.1  # _init_weights's normal(0.02)
        assert torch.equal(block.scale, torch.full((4,), 2.0))  # constructor value kept
    assert torch.equal(model.mask, torch.ones(3, 3).tril())  # buffers keep their constructed values
    assert not torch.equal(model.blocks[0].fc.weight, model.blocks[1].fc.weight)  # a seed per module


def test_same_values_every_time_and_keep_gets_every_key():
    calls: dict[str, list] = {}
    materialize(build_skeleton(_spec()), lambda keys, v: calls.setdefault(keys[0], []).append((keys, v)))
    assert calls["emb.weight"][-1][0] == ["emb.weight", "head.weight"]  # a tied parameter: both keys
    again = full_model(build_skeleton(_spec()))
    for key, value in again.named_parameters():
        torch.testing.assert_close(calls[key][-1][1], value.detach(), rtol=0, atol=0)
    other_seed = full_model(build_skeleton(TrainSpec(**{**_spec().__dict__, "seed": 4})))
    assert not torch.equal(other_seed.emb.weight, again.emb.weight)


def test_a_parameter_no_init_can_make_is_refused_by_name():
    class Opaque(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Module()
            self.inner.reset_parameters = lambda: None  # claims an init, writes nothing
            self.inner.w = nn.Parameter(torch.ones(2))

    skeleton = build_skeleton(_spec())
    skeleton.module.extra = Opaque()
    with pytest.raises(ValueError, match=r"'extra\.inner\.w'.*model\.checkpoint"):
        materialize(skeleton, lambda keys, v: None)


def test_single_process_trainer_starts_from_the_reference_values():
    spec = _spec(tie=False)
    trainer = Trainer(spec, SINGLE)
    reference = dict(spec.build_model().named_parameters())
    for key, value in trainer.full_params().items():
        torch.testing.assert_close(value, reference[key].detach(), rtol=0, atol=0)


def _job_spec(checkpoint: str) -> TrainSpec:
    job = {"model": {"factory": "toy_models:MLP", "task": "classification", "input_shape": [8],
                     "num_classes": 4, "checkpoint": checkpoint},
           "training": {"global_batch_size": 8, "optimizer": "sgd", "steps": 1},
           "cluster": "cpu-local", "devices": [1]}
    return TrainSpec.from_job(Job.from_dict(json.loads(json.dumps(job))))


VALUES = {"fc1.weight": torch.randn(16, 8), "fc1.bias": torch.randn(16),
          "fc2.weight": torch.randn(4, 16), "fc2.bias": torch.randn(4)}


@pytest.mark.parametrize("form", ["torch.save", "safetensors", "dcp"])
def test_model_checkpoint_gives_the_initial_values(tmp_path, form):
    if form == "torch.save":
        path = tmp_path / "w.pt"
        torch.save({"state_dict": VALUES}, path)
    elif form == "safetensors":
        from safetensors.torch import save_file

        path = tmp_path / "w.safetensors"
        save_file(VALUES, str(path))
    else:
        import torch.distributed.checkpoint as dcp

        path = tmp_path / "dcp"
        dcp.save({f"model.{k}": v for k, v in VALUES.items()}, checkpoint_id=str(path), no_dist=True)
    params = Trainer(_job_spec(str(path)), SINGLE).full_params()
    for key, value in VALUES.items():
        torch.testing.assert_close(params[key], value, rtol=0, atol=0)


def test_model_checkpoint_errors_name_the_key_and_the_fix(tmp_path):
    path = tmp_path / "w.pt"
    torch.save({k: v for k, v in VALUES.items() if k != "fc2.bias"}, path)
    with pytest.raises(ValueError, match=r"no tensor named 'fc2\.bias'.*state_dict"):
        Trainer(_job_spec(str(path)), SINGLE)
    torch.save({**VALUES, "fc2.bias": torch.zeros(5)}, path)
    with pytest.raises(ValueError, match=r"'fc2\.bias' has shape \(5,\), the model's \(4,\)"):
        Trainer(_job_spec(str(path)), SINGLE)
    with pytest.raises(ValueError, match="does not exist"):
        Trainer(_job_spec(str(tmp_path / "missing.pt")), SINGLE)


def test_peak_memory_sees_a_full_copy_made_in_the_loop():
    peak = PeakMemory(torch.device("cpu"))
    peak.start()
    quiet = peak.read()
    copy = torch.ones(16 << 20)  # 64 MiB, touched
    seen = peak.read()
    del copy
    assert seen - quiet >= 60 * 2**20
    peak.start()  # a new loop: the high-water mark starts from the current level
    assert peak.read() < seen
