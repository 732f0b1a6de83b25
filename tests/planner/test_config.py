"""The YAML job schema: valid jobs round-trip; every invalid one names file, key path and form."""

from __future__ import annotations

import textwrap

import pytest

from tensoropt.config import ConfigError, Job, load_job, parse_size

VALID = textwrap.dedent("""\
    model:
      name: vgg16
      task: classification
      input_shape: [3, 224, 224]
      num_classes: 1000
    training:
      global_batch_size: 64
      optimizer: adamw
      dtype: float32
      seed: 0
      steps: 100
    cluster: h100x8
    devices: [1, 2, 4, 8]
    memory_budget: 40GiB
    select: fastest
""")


def write(tmp_path, text: str, name: str = "job.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_valid_job_loads_with_sizes_in_bytes(tmp_path):
    job = load_job(write(tmp_path, VALID))
    assert job.model.name == "vgg16" and job.model.input_shape == [3, 224, 224]
    assert job.training.global_batch_size == 64 and job.training.optimizer == "adamw"
    assert job.devices == [1, 2, 4, 8]
    assert job.memory_budget == 40 * 2**30


def test_yaml_round_trip_is_exact(tmp_path):
    job = load_job(write(tmp_path, VALID))
    again = load_job(write(tmp_path, job.to_yaml(), "again.yaml"))
    assert again == job
    assert Job.from_dict(job.to_dict()) == job


def test_inline_cluster_and_factory_model(tmp_path):
    text = textwrap.dedent("""\
        model: {factory: "mypkg.models:build", kwargs: {width: 4}, task: classification, input_shape: [8]}
        cluster: {name: mine, device: cpu, devices_per_node: 2, num_nodes: 1}
        devices: 2
    """)
    job = load_job(write(tmp_path, text))
    assert job.model.factory == "mypkg.models:build" and job.model.kwargs == {"width": 4}
    assert isinstance(job.cluster, dict) and job.devices == [2]
    assert job.memory_budget is None and job.select == "fastest"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("40GiB", 40 * 2**30),
        ("40 GiB", 40 * 2**30),
        ("4e10", 4 * 10**10),
        ("40GB", 40 * 10**9),
        ("17179869184", 17179869184),
        (17179869184, 17179869184),
        ("1.5 KiB", 1536),
        ("512mib", 512 * 2**20),
        (4.0e10, 4 * 10**10),
    ],
)
def test_sizes_accepted(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["lots", "-4GiB", "0", 0, -5, "4 GiBs", "1.5", "", True, None, [1]])
def test_sizes_rejected(text):
    with pytest.raises(ValueError):
        parse_size(text)


def _replace(line_from: str, line_to: str) -> str:
    assert line_from in VALID
    return VALID.replace(line_from, line_to)


# (job text, expected key path in the message, a fragment of the expected form)
INVALID = [
    (_replace("memory_budget: 40GiB", "memory_budget: lots"), "memory_budget", "40GiB"),
    (_replace("memory_budget: 40GiB", "memory_budget: -4GiB"), "memory_budget", "size"),
    (_replace("memory_budget: 40GiB", "memory_budget: 0"), "memory_budget", "size"),
    (_replace("  steps: 100", "  steps: 100\n  lr: 0.1"), "training.lr", "one of global_batch_size"),
    (VALID + "colour: blue\n", "colour", "one of model"),
    (_replace("  num_classes: 1000", "  num_classes: 1000\n  width: 3"), "model.width", "one of name"),
    (_replace("global_batch_size: 64", "global_batch_size: big"), "training.global_batch_size", "integer"),
    (_replace("global_batch_size: 64", "global_batch_size: -8"), "training.global_batch_size", ">= 1"),
    (_replace("global_batch_size: 64", "global_batch_size: 6.5"), "training.global_batch_size", "integer"),
    (_replace("optimizer: adamw", "optimizer: adagrad"), "training.optimizer",
     "sgd | momentum | adam | adamw"),
    (_replace("dtype: float32", "dtype: float8"), "training.dtype", "float32"),
    (_replace("seed: 0", "seed: -1"), "training.seed", ">= 0"),
    (_replace("devices: [1, 2, 4, 8]", "devices: []"), "devices", "list of device counts"),
    (_replace("devices: [1, 2, 4, 8]", "devices: [1, 0]"), "devices[1]", ">= 1"),
    (_replace("devices: [1, 2, 4, 8]", "devices: [2, 2]"), "devices", "distinct"),
    (_replace("devices: [1, 2, 4, 8]", "devices: four"), "devices", "list of device counts"),
    (_replace("select: fastest", "select: cheapest"), "select", "fastest | fewest_devices | best_per_device"),
    (_replace("cluster: h100x8", "cluster: 8"), "cluster", "profile name"),
    (_replace("cluster: h100x8\n", ""), "cluster", "a value for cluster"),
    (_replace("  name: vgg16", "  factory: not a factory"), "model.factory", "package.module:function"),
    (_replace("  name: vgg16", "  name: vgg16\n  factory: a.b:c"), "model.name", "exactly one"),
    (
        _replace("  task: classification", "  task: detection"),
        "model.task",
        "classification | language_model",
    ),
    (_replace("input_shape: [3, 224, 224]", "input_shape: [3, -224, 224]"), "model.input_shape[1]", ">= 1"),
    (_replace("input_shape: [3, 224, 224]", "input_shape: 224"), "model.input_shape", "list of positive"),
    (VALID + "max_time_s: -1\n", "max_time_s", "> 0"),
    (VALID + "planner: {epsilon: -0.1}\n", "planner.epsilon", ">= 0"),
    (VALID + "planner: {compute: guess}\n", "planner.compute", "roofline | profiled"),
    (VALID.split("training:")[0] + "training: 5\ncluster: h100x8\ndevices: [1]\n", "training", "mapping"),
]


@pytest.mark.parametrize("text, key_path, form", INVALID, ids=[k for _, k, _ in INVALID])
def test_invalid_job_names_file_key_and_form(tmp_path, text, key_path, form):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_job(path)
    err = info.value
    message = str(err)
    assert message.startswith(f"{path}: {key_path}:"), message
    assert err.key_path == key_path
    assert form in message, message


def test_not_a_mapping_invalid_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="mapping with keys model"):
        load_job(write(tmp_path, "- just\n- a list\n"))
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_job(write(tmp_path, "model: {name: [unclosed\n"))
    with pytest.raises(ConfigError, match="cannot read the file"):
        load_job(tmp_path / "missing.yaml")


def test_direct_construction_validates_too():
    with pytest.raises(ValueError, match="training.optimizer"):
        Job(model={"name": "mlp"}, cluster="cpu-local", devices=[1], training={"optimizer": "rmsprop"})
