"""The model contract in the job YAML: parsing, errors naming the key path, building, planning."""

from __future__ import annotations

import textwrap

import pytest
import torch

from tensoropt.config import ConfigError, Job, load_job
from tensoropt.models.contract import TrainingStep
from tensoropt.planner import PlanningError, build_job_model, plan_job

CLASSIFIER = {"factory": "contract_models:build_classifier", "kwargs": {"width": 8},
              "inputs": {"pixel_values": {"shape": [6]}},
              "targets": {"shape": [], "dtype": "int64", "high": 4}, "loss": "cross_entropy"}


def job(model: dict, devices=(1, 2), **extra) -> Job:
    return Job.from_dict({"model": model, "cluster": "cpu-local", "devices": list(devices),
                          "training": {"global_batch_size": 8}, **extra}, "job.yaml")


def test_yaml_contract_is_read_with_defaults(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(textwrap.dedent("""\
        model:
          factory: contract_models:Tagger
          kwargs: {vocab: 16}
          inputs:
            input_ids: {shape: [5], dtype: int64, high: 16}
            attention_mask: {shape: [5], dtype: int64, high: 2}
          targets: {shape: [5], dtype: int64, high: 16}
          loss: cross_entropy
        data: {factory: contract_models:recorded_dataset, kwargs: {size: 32, record_dir: /tmp}}
        cluster: cpu-local
        devices: [1, 2]
    """))
    j = load_job(path)
    assert j.model.inputs["input_ids"] == {"shape": [5], "dtype": "int64", "high": 16}
    assert j.model.targets["high"] == 16 and j.model.loss == "cross_entropy"
    assert j.data.factory == "contract_models:recorded_dataset" and j.data.kwargs["size"] == 32
    assert Job.from_dict(j.to_dict()) == j
    bare = job({"factory": "contract_models:ExampleInputsModel"})
    assert bare.model.loss == "model" and bare.model.inputs is None


@pytest.mark.parametrize("change, key_path, expected", [
    ({"inputs": {"pixel_values": {"shape": [6, 0]}}}, "model.inputs.pixel_values.shape[1]", ">= 1"),
    ({"inputs": {"pixel_values": {"shape": 6}}}, "model.inputs.pixel_values.shape", "list"),
    ({"inputs": {"pixel_values": {"shape": [6], "dtype": "int64"}}}, "model.inputs.pixel_values.high",
     "[0, high)"),
    ({"inputs": {"pixel_values": {"shape": [6], "dtype": "complex"}}}, "model.inputs.pixel_values.dtype",
     "float32"),
    ({"inputs": {"pixel_values": {"shape": [6], "hi": 3}}}, "model.inputs.pixel_values.hi", "shape, dtype"),
    ({"inputs": {"pixel_values": {"dtype": "float32"}}}, "model.inputs.pixel_values.shape", "shape of one"),
    ({"inputs": {"pixel_values": [3, 8, 8]}}, "model.inputs.pixel_values", "{shape: [...]"),
    ({"inputs": {"2d": {"shape": [6]}}}, "model.inputs.2d", "identifier"),
    ({"targets": {"shape": [], "dtype": "int64"}}, "model.targets.high", "[0, high)"),
    ({"targets": None}, "model.targets", "targets: {shape"),
    ({"loss": "mean squared"}, "model.loss", "model | cross_entropy"),
    ({"loss": "model"}, "model.targets", "loss: cross_entropy or"),
    ({"task": "classification"}, "model.task", "not both"),
])
def test_yaml_errors_name_the_key_path(change, key_path, expected):
    model = {**CLASSIFIER, **change}
    with pytest.raises(ConfigError) as err:
        job({k: v for k, v in model.items() if v is not None})
    assert err.value.key_path == key_path, str(err.value)
    assert expected in str(err.value) and str(err.value).startswith("job.yaml: " + key_path)


def test_contract_keys_need_a_factory():
    with pytest.raises(ConfigError, match=r"model\.loss: .*zoo model 'mlp'"):
        job({"name": "mlp", "loss": "cross_entropy"})


def test_factory_is_called_with_exactly_its_kwargs():
    # build_classifier(width) has no num_classes/seq_len/vocab_size: nothing may be added to kwargs
    model, _ = build_job_model(job({**CLASSIFIER, "kwargs": {"width": 5}}), device="meta")
    assert isinstance(model, TrainingStep) and model.model.fc1.out_features == 5
    with pytest.raises(PlanningError, match=r"model\.kwargs\.depth: .*unexpected keyword argument 'depth'"):
        build_job_model(job({**CLASSIFIER, "kwargs": {"depth": 2}}), device="meta")


def test_missing_inputs_without_example_inputs_names_the_key():
    with pytest.raises(PlanningError, match=r"model\.inputs: not given and Classifier has no example_inputs"):
        build_job_model(job({"factory": "contract_models:Classifier"}), device="meta")
    wrong = {**CLASSIFIER, "inputs": {"images": {"shape": [6]}}}
    with pytest.raises(PlanningError, match=r"model\.inputs\.images: Classifier\.forward takes no argument"):
        build_job_model(job(wrong), device="meta")


def test_a_logits_model_under_loss_model_is_told_what_to_use():
    bad = {"factory": "contract_models:Classifier", "inputs": {"pixel_values": {"shape": [6]}}}
    with pytest.raises(PlanningError, match=r"model\.loss: model: forward returned a tensor of shape \[8, 4\]"
                                            r".*loss: cross_entropy"):
        plan_job(job(bad, devices=[1]))


@pytest.mark.parametrize("model, loss_op", [
    (CLASSIFIER, "cross_entropy_loss"),
    ({"factory": "contract_models:Tagger",
      "inputs": {"input_ids": {"shape": [5], "dtype": "int64", "high": 16},
                 "attention_mask": {"shape": [5], "dtype": "int64", "high": 2}},
      "targets": {"shape": [5], "dtype": "int64", "high": 16}, "loss": "cross_entropy"},
     "cross_entropy_loss"),
    ({"factory": "contract_models:Classifier", "inputs": {"pixel_values": {"shape": [6]}},
      "targets": {"shape": [4]}, "loss": "contract_models:squared_error"}, "mean"),
    ({"factory": "contract_models:OutputWithLoss", "inputs": {"features": {"shape": [6]},
      "labels": {"shape": [], "dtype": "int64", "high": 3}}}, "cross_entropy_loss"),
    ({"factory": "contract_models:ExampleInputsModel"}, "mean"),
])
def test_every_form_plans_at_1_and_2_devices_with_the_loss_in_the_graph(model, loss_op):
    ff = plan_job(job(model))
    assert [f.devices for f in ff.frontiers] == [1, 2]
    assert all(f.plans for f in ff.frontiers)
    ops = ff.frontiers[1].plans[0].ops
    assert loss_op in ops  # the loss is a planned operator like any other
    names = list(model.get("inputs", {"x": 0, "y": 0})) + (["targets"] if "targets" in model else [])
    assert [n for n in ops if n in names] == names  # graph inputs are named like the job's inputs


def test_token_level_cross_entropy_matches_torch():
    from tensoropt.models.contract import cross_entropy

    logits, targets = torch.randn(2, 3, 5), torch.tensor([[1, -100, 4], [0, 2, -100]])
    want = torch.nn.functional.cross_entropy(logits.reshape(6, 5), targets.reshape(6))
    assert torch.allclose(cross_entropy(logits, targets), want)
    with pytest.raises(ValueError, match="model.targets.shape"):
        cross_entropy(logits, targets[:, :2])
