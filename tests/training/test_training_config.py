"""The trainer's job keys (issue 25): forms, defaults, the older keys as aliases, and one-line errors
naming the key path."""

from __future__ import annotations

import pytest

from tensoropt.config import ConfigError, Job, effective_optimizer, load_job

BASE = {"model": {"name": "mlp"}, "cluster": "cpu-local", "devices": [1],
        "training": {"global_batch_size": 8, "steps": 20}}


def job(**sections):
    data = {**BASE, **sections}
    if "training" in sections:
        data["training"] = {**BASE["training"], **sections["training"]}
    return Job.from_dict(data, "job.yaml")


def test_full_set_of_keys_loads_and_round_trips(tmp_path):
    j = job(optimizer={"name": "adamw", "lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1,
                       "no_decay": ["bias", "norm"]},
            lr_scheduler={"warmup_steps": 4, "decay": "cosine", "decay_steps": 10, "min_lr_ratio": 0.1},
            training={"max_grad_norm": 1.0, "micro_batches": "auto"},
            metrics={"log_every": 1, "jsonl": "out/m.jsonl", "tensorboard": "out/tb"},
            validation={"data": {"factory": "mypkg.data:held_out", "kwargs": {"n": 8}}, "every": 5,
                        "steps": 2},
            checkpoint={"export": "out/model"})
    assert (j.training.optimizer, j.training.learning_rate) == ("adamw", 3e-4)  # the aliases follow
    assert j.validation.data.factory == "mypkg.data:held_out" and j.training.micro_batches == "auto"
    assert Job.from_dict(j.to_dict()) == j
    path = tmp_path / "j.yaml"
    path.write_text(j.to_yaml())
    assert load_job(path) == j


def test_the_older_keys_describe_the_optimizer():
    j = job(training={"optimizer": "momentum", "learning_rate": 0.1})
    o = effective_optimizer(j)
    assert (o.name, o.lr, o.momentum, o.weight_decay) == ("momentum", 0.1, 0.9, 0.0)
    assert effective_optimizer(job()).weight_decay == 0.01  # torch's AdamW default


@pytest.mark.parametrize("sections, key, words", [
    ({"lr_scheduler": {"warmup_steps": 21}}, "lr_scheduler.warmup_steps", "longer than the run of 20 steps"),
    ({"lr_scheduler": {"min_lr_ratio": 1.5}}, "lr_scheduler.min_lr_ratio", "[0, 1]"),
    ({"lr_scheduler": {"min_lr_ratio": -0.1}}, "lr_scheduler.min_lr_ratio", "[0, 1]"),
    ({"lr_scheduler": {"decay": "step"}}, "lr_scheduler.decay", "constant | linear | cosine"),
    ({"training": {"micro_batches": 3}}, "training.micro_batches", "does not divide the global batch of 8"),
    ({"training": {"micro_batches": "some"}}, "training.micro_batches", "auto"),
    ({"training": {"max_grad_norm": -1}}, "training.max_grad_norm", ">= 0"),
    ({"optimizer": {"name": "lion"}}, "optimizer.name", "sgd | momentum | adam | adamw"),
    ({"optimizer": {"betas": [0.9, 1.0]}}, "optimizer.betas[1]", "[0, 1)"),
    ({"optimizer": {"name": "adamw", "momentum": 0.9}}, "optimizer.momentum", "name: momentum"),
    ({"optimizer": {"no_decay": "bias"}}, "optimizer.no_decay", "a list of words"),
    ({"optimizer": {"name": "sgd"}, "training": {"optimizer": "momentum"}}, "training.optimizer",
     "older spelling"),
    ({"metrics": {"log_every": 0}}, "metrics.log_every", ">= 1"),
    ({"metrics": {"every": 1}}, "metrics.every", "one of log_every, jsonl, tensorboard"),
    ({"validation": {"every": 5}}, "validation.data", "missing required key"),
    ({"validation": {"data": {"factory": "nocolon"}}}, "validation.data.factory", "package.module:function"),
    ({"checkpoint": {"export": ""}}, "checkpoint.export", "a directory path"),
])
def test_bad_input_names_the_key(sections, key, words):
    with pytest.raises(ConfigError) as info:
        job(**sections)
    message = str(info.value)
    assert message.startswith(f"job.yaml: {key}: ") and words in message and "\n" not in message
