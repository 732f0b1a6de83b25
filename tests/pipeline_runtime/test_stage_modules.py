"""Stage modules without processes: each holds its blocks' parameters under the model's names, and
the stages chained by hand give the whole model's loss and gradients."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from pipeline_jobs import gpt_spec, llama_spec

from tensoropt.pipeline.schedules import PipelineError
from tensoropt.pipeline_runtime.stage_modules import build_stages, load_initial_values

CPU = torch.device("cpu")


def _chain(spec, blocks: list[list[int]]):
    """Loss and gradients of the stages run one after the other on step 0's batch, and of the model."""
    rows = spec.global_batch_size
    stages = build_stages(spec, {"stages": len(blocks), "blocks": blocks}, rows)
    modules = [load_initial_values(stages, s, CPU) for s in range(len(blocks))]
    source = spec.batch_source()
    shapes = [(rows, *s.shape) for s in spec.inputs]
    batch = source.local(0, [tuple((0, n) for n in shape) for shape in shapes])
    named = dict(zip(spec.input_names, batch))
    x = None
    for s, module in enumerate(modules):
        kwargs = {n: named[n] for n in stages.input_names[s]}
        x = module(**kwargs) if s == 0 else module(x, **kwargs)
    x.backward()
    reference = spec.build_model()
    expected = reference(*batch)
    expected.backward()
    return x, expected, modules, dict(reference.named_parameters())


@pytest.mark.parametrize("which, blocks", [("gpt", [[0, 1], [2, 3]]), ("gpt", [[0, 0], [1, 2], [3, 3]]),
                                           ("llama", [[0, 2], [3, 5]])])
def test_stages_chained_give_the_models_loss_and_gradients(which, blocks):
    spec = gpt_spec() if which == "gpt" else llama_spec()
    loss, expected, modules, reference = _chain(spec, blocks)
    assert abs(float(loss.detach()) - float(expected.detach())) <= 1e-6 * abs(float(expected.detach()))
    names = [set(dict(m.named_parameters())) for m in modules]
    assert set().union(*names) == set(reference), "every parameter in some stage, under the model's name"
    assert sum(len(n) for n in names) == len(reference), "no parameter in two stages"
    for module in modules:
        for key, p in module.named_parameters():
            assert torch.allclose(p.grad, reference[key].grad, rtol=1e-5, atol=1e-7), key


def test_a_stage_holds_only_its_blocks():
    stages = build_stages(gpt_spec(), {"stages": 2, "blocks": [[0, 1], [2, 3]]}, 4)
    first, last = (set(dict(m.named_parameters())) for m in stages.modules)
    assert {"wte.weight", "wpe.weight"} <= first and not any(k.startswith("blocks.1.") for k in first)
    assert "head.weight" in last and not any(k.startswith(("blocks.0.", "wte")) for k in last)
    assert stages.input_names == [["tokens"], ["labels"]]
    assert tuple(stages.boundary_meta[0].shape) == (4, 8, 32)


def test_a_weight_tied_across_stages_is_a_copy_in_each_stage_with_one_initial_value():
    spec = gpt_spec()
    tied = dataclasses.replace(spec, job=None, model="gpt", model_kwargs={**spec.job["model"]["kwargs"],
                                                                         "tie_weights": True})
    stages = build_stages(tied, {"stages": 2, "blocks": [[0, 1], [2, 3]]}, 4)
    assert len(stages.ties) == 1 and sorted(stages.ties[0]) == [0, 1]
    key0, key1 = stages.ties[0][0], stages.ties[0][1]
    first, last = (load_initial_values(stages, s, torch.device("cpu")) for s in (0, 1))
    w0, w1 = first.get_parameter(key0), last.get_parameter(key1)
    assert w0 is not w1 and torch.equal(w0, w1)
    untied = build_stages(spec, {"stages": 2, "blocks": [[0, 1], [2, 3]]}, 4)
    assert untied.ties == []


def test_block_ranges_are_checked():
    spec = gpt_spec()
    with pytest.raises(PipelineError, match=r"consecutive blocks 0..3 \(embedding, blocks.0, blocks.1, head"):
        build_stages(spec, {"stages": 2, "blocks": [[0, 1], [3, 3]]}, 4)
    with pytest.raises(PipelineError, match="block_names"):
        build_stages(spec, {"stages": 2, "blocks": [[0, 1], [2, 3]]}, 4,
                     block_names=["embedding", "layers.0", "layers.1", "head"])
