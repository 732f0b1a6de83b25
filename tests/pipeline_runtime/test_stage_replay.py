"""Replayed stages against eager ones, and the counted labels of a last stage's loss (one process)."""

from __future__ import annotations

import copy

import pytest
import torch
from pipeline_jobs import gpt_spec, padded_llama_spec, plan

from tensoropt.pipeline_runtime.replay import ReplayedStage
from tensoropt.pipeline_runtime.stage_modules import build_stages, load_initial_values
from tensoropt.pipeline_runtime.token_count import label_counter

ROWS = 4


def _stages(spec, blocks):
    stages = build_stages(spec, plan("x", 2, "1F1B", blocks)["pipeline"], ROWS)
    return stages, [load_initial_values(stages, s, torch.device("cpu")) for s in range(2)]


def _micro_batch(spec, k: int) -> dict[str, torch.Tensor]:
    regions = [((k * ROWS, ROWS), *((0, n) for n in s.shape)) for s in spec.inputs]
    return dict(zip(spec.input_names, spec.batch_source().local(0, regions)))


def _two_micro_batches(stages, modules, spec):
    """Forward and backward of micro-batches 0 and 1 through both stages in 1F1B's order on stage 0
    (both forwards before the first backward); the losses and every parameter's gradient sum."""
    names = stages.input_names
    outs, losses = [], []
    for k in range(2):
        batch = _micro_batch(spec, k)
        outs.append(modules[0](**{n: batch[n] for n in names[0]}))
    for k in range(2):
        batch = _micro_batch(spec, k)
        received = outs[k].detach().requires_grad_()
        loss = modules[1](received, **{n: batch[n] for n in names[1]})
        loss.backward()
        torch.autograd.backward(outs[k], received.grad)
        losses.append(float(loss.detach()))
    inner = [getattr(m, "inner", m) for m in modules]
    return losses, {k: p.grad.clone() for m in inner for k, p in m.named_parameters()}


def test_replayed_stages_give_the_eager_losses_and_gradients():
    spec = gpt_spec("momentum")
    stages, eager = _stages(spec, [[0, 1], [2, 3]])
    copies = [copy.deepcopy(m) for m in eager]
    replayed = [ReplayedStage(copies[0], stages.input_names[0], received=False),
                ReplayedStage(copies[1], stages.input_names[1], received=True)]
    losses, grads = _two_micro_batches(stages, eager, spec)
    replay_losses, replay_grads = _two_micro_batches(stages, replayed, spec)
    assert [m.mode for m in replayed] == ["replay", "replay"] and [m.traces for m in replayed] == [1, 1]
    assert replay_losses == pytest.approx(losses, rel=1e-6)
    assert set(replay_grads) == set(grads)
    for key, g in grads.items():
        assert torch.allclose(replay_grads[key], g, rtol=1e-5, atol=1e-7), key


def test_the_label_count_follows_the_models_own_label_shift():
    """HF Llama shifts its labels inside the model (pad with -100, drop the first): the counter cuts
    those operators from the last stage, so it counts what the loss averages over."""
    spec = padded_llama_spec()
    stages = build_stages(spec, plan("x", 2, "1F1B", [[0, 2], [3, 5]])["pipeline"], ROWS)
    counter = label_counter(stages.modules[1])
    assert counter is not None and counter.input_names == ["labels"]
    assert label_counter(stages.modules[0]) is None  # the first stage returns no loss
    labels = _micro_batch(spec, 0)["labels"]
    shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:]
    assert counter({"labels": labels}) == int((shifted != -100).sum())
    counts = counter.per_micro_batch({"labels": labels}, 2)
    assert sum(counts) == counter({"labels": labels}) and counts[0] != counts[1]
