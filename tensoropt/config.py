"""The YAML job schema: nested dataclasses, validated on construction.

A job file is a 1:1 serialisation of :class:`Job`::

    model:
      name: vgg16                 # a zoo model, or
      # factory: mypkg.models:build   with kwargs: {...}
      task: classification        # or language_model
      input_shape: [3, 224, 224]  # per sample (classification)
      num_classes: 1000
      # or your own model (docs/user-guide.md, "Your own model"):
      # factory: mypkg.models:build     called with exactly kwargs
      # inputs: {input_ids: {shape: [128], dtype: int64, high: 32000}}
      # targets: {shape: [], dtype: int64, high: 10}    (optional; not passed to forward)
      # loss: model                     # model | cross_entropy | package.module:function
    data: {factory: mypkg.data:build, kwargs: {}}   # optional: a map-style Dataset of samples
    training:
      global_batch_size: 64
      optimizer: adamw            # sgd | momentum | adamw
      precision: fp32             # fp32 | bf16 | fp16 | bf16-mixed | fp16-mixed (dtype: the older alias)
      seed: 0
      steps: 100
      memory_options: []          # recompute, zero1, zero2, zero3: offered per operator (empty: none);
                                  # block_recompute, block_selective: whole-block checkpointing;
                                  # chunked_loss: the head + cross entropy over chunks of tokens
      checkpoint_modules: []      # module paths checkpointed as blocks (empty: the repeated modules)
      loss_chunk_tokens: 2048     # chunked_loss: tokens per chunk of the fused head + cross entropy
      batch_norm: synchronized    # synchronized | local: batch-norm statistics under a batch split
    cluster: h100x8               # a profile name or path, or an inline mapping
    devices: [1, 2, 4, 8]         # device counts to plan for
    memory_budget: 40GiB          # per device
    select: fastest               # fastest | fewest_devices | best_per_device
    executor:                     # how `tensoropt run` executes the plan (optional)
      mode: replay                # replay (a traced local program) | interpret (the DTensor reference)
      compile: none               # none | inductor (compiles the replayed program)

Every field is checked in ``__post_init__``; :func:`load_job` turns a failure into a
:class:`ConfigError` that names the file, the full key path (``training.global_batch_size``)
and the expected form. Unknown keys are rejected the same way.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tensoropt.sizes import SIZE_FORM, format_size, parse_size

__all__ = ["CheckpointConfig", "ConfigError", "DataConfig", "ExecutorConfig", "FieldError", "Job",
           "LrSchedulerConfig", "MetricsConfig", "ModelConfig", "OptimizerConfig", "PlannerConfig",
           "TrainingConfig",
           "ValidationConfig", "SIZE_FORM", "effective_optimizer", "format_size", "load_job", "parse_size"]

OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
"""Optimizers the estimators and the executor know (they differ in optimizer-state memory)."""

BATCH_NORM_MODES = ("synchronized", "local")
"""``training.batch_norm``: a batch-split batch norm's statistics over the global batch (the model one
process trains, as ``torch.nn.SyncBatchNorm``) or over each rank's rows (plain DDP's batch norm)."""

DTYPES = ("float32", "bfloat16", "float16")
"""Training dtypes of parameters and activations."""

TASKS = ("classification", "language_model")
"""What the model's head computes, which decides the synthetic inputs and the loss."""

SELECT_RULES = ("fastest", "fewest_devices", "best_per_device")
"""Selection rules of :mod:`tensoropt.selector`."""

LOSSES = ("model", "cross_entropy")
"""The named losses of ``model.loss``; anything else is a ``"package.module:function"``."""

INPUT_DTYPES = ("float32", "float64", "bfloat16", "float16", "int64", "int32", "bool")
"""dtypes of ``model.inputs`` / ``model.targets`` entries (integers need ``high``)."""

_FACTORY_FORM = 'a factory "package.module:function"'

class FieldError(ValueError):
    """A field of one dataclass is invalid (raised by ``__post_init__``; path relative to it).

    Example:
        >>> str(FieldError("steps", "must be >= 1, got 0", "a positive integer"))
        'steps: must be >= 1, got 0 (expected a positive integer)'
    """

    def __init__(self, key: str, problem: str, expected: str):
        self.key, self.problem, self.expected = key, problem, expected
        super().__init__(f"{key}: {problem} (expected {expected})")


class ConfigError(ValueError):
    """A job file is invalid: names the file, the full key path and the expected form.

    Example:
        >>> str(ConfigError("job.yaml", "training.steps", "must be >= 1, got 0", "a positive integer"))
        'job.yaml: training.steps: must be >= 1, got 0 (expected a positive integer)'
    """

    def __init__(self, file: str, key_path: str, problem: str, expected: str):
        self.file, self.key_path, self.problem, self.expected = file, key_path, problem, expected
        where = ": ".join(part for part in (file, key_path) if part)
        text = f"{problem} (expected {expected})"
        super().__init__(f"{where}: {text}" if where else text)


# ---------------------------------------------------------------------------------------------
# field checks (one line each; they raise FieldError with the field's key)


def _int(value: Any, key: str, minimum: int = 1, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(key, f"got {type(value).__name__} {value!r}", f"an integer >= {minimum}")
    if value < minimum:
        raise FieldError(key, f"must be >= {minimum}, got {value}", f"an integer >= {minimum}")
    return value


def _choice(value: Any, key: str, choices: tuple[str, ...], optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if value not in choices:
        raise FieldError(key, f"got {value!r}", "one of " + " | ".join(choices))
    return value


def _str(value: Any, key: str, expected: str, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        raise FieldError(key, f"got {type(value).__name__} {value!r}", expected)
    return value


def _size(value: Any, key: str, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    try:
        return parse_size(value)
    except ValueError as e:
        raise FieldError(key, str(e), SIZE_FORM) from None


def _positive_float(value: Any, key: str, optional: bool = False, zero_ok: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise FieldError(key, f"got {value!r}", "a finite number")
    if value < 0 or (value == 0 and not zero_ok):
        bound = ">= 0" if zero_ok else "> 0"
        raise FieldError(key, f"must be {bound}, got {value}", f"a number {bound}")
    return float(value)


# ---------------------------------------------------------------------------------------------
# the schema


@dataclass
class ModelConfig:
    """Which model to plan, and the shape of its inputs.

    Example:
        >>> ModelConfig(name="vgg16").name
        'vgg16'
    """

    name: str | None = None
    """A zoo model: mlp, alexnet, vgg16, resnet50, wide-resnet, gpt2-small, gpt-1.3b, bert-base."""
    factory: str | None = None
    """Instead of name: a user model factory "package.module:function" that returns an nn.Module."""
    kwargs: dict = field(default_factory=dict)
    """Keyword arguments passed to the zoo preset or the factory (override the preset's defaults)."""
    task: str | None = None
    """classification | language_model; empty: the zoo preset's task (required with a factory)."""
    input_shape: list[int] | None = None
    """Shape of one input sample without the batch dim (classification), e.g. [3, 224, 224]."""
    num_classes: int | None = None
    """Number of classes of a classification head; empty: the preset's."""
    seq_len: int | None = None
    """Sequence length of a language model; empty: the preset's."""
    vocab_size: int | None = None
    """Vocabulary size of a language model; empty: the preset's."""
    inputs: dict | None = None
    """A factory model's forward keyword arguments, one sample each (the batch dim is added in
    front): name -> ``{shape: [...], dtype: float32, high: N}`` (integers are drawn from [0, high)).
    Empty: the model's ``example_inputs(batch_size)`` method gives them."""
    targets: dict | None = None
    """What the loss compares against, one sample (``{shape, dtype, high}``); not passed to forward."""
    loss: str | None = None
    """model (forward returns the loss, or an output with a ``loss`` entry, or a tuple led by it) |
    cross_entropy (forward returns logits; needs ``targets``) | ``package.module:function`` called as
    ``function(output, targets)``. Empty: model (for a factory model without ``task``)."""
    checkpoint: str | None = None
    """Initial weights for ``tensoropt run``: a ``torch.save`` state-dict file, a ``.safetensors``
    file or a distributed-checkpoint directory, keys as in the model's ``state_dict()``; each rank
    reads only what its shards need. Empty: the executor's seeded init (reset_parameters /
    _init_weights per module)."""

    def __post_init__(self):
        _str(self.name, "name", "a zoo model name such as vgg16", optional=True)
        _str(self.checkpoint, "checkpoint", "a state-dict file, a .safetensors file or a DCP directory",
             optional=True)
        _str(self.factory, "factory", _FACTORY_FORM, optional=True)
        if (self.name is None) == (self.factory is None):
            raise FieldError("name", "give exactly one of model.name and model.factory",
                             'a zoo model name such as vgg16, or factory: "package.module:function"')
        if self.factory is not None and not re.fullmatch(r"[\w.]+:[\w.]+", self.factory):
            raise FieldError("factory", f"got {self.factory!r}", _FACTORY_FORM)
        self._check_contract()
        if not isinstance(self.kwargs, dict) or not all(isinstance(k, str) for k in self.kwargs):
            raise FieldError("kwargs", f"got {self.kwargs!r}", "a mapping of keyword arguments")
        _choice(self.task, "task", TASKS, optional=True)
        if self.input_shape is not None:
            if not isinstance(self.input_shape, (list, tuple)) or not self.input_shape:
                raise FieldError("input_shape", f"got {self.input_shape!r}", "a list of positive integers")
            self.input_shape = [_int(d, f"input_shape[{i}]") for i, d in enumerate(self.input_shape)]
        _int(self.num_classes, "num_classes", optional=True)
        _int(self.seq_len, "seq_len", optional=True)
        _int(self.vocab_size, "vocab_size", optional=True)

    @property
    def contract(self) -> bool:
        """Whether the model follows the "your own model" contract (a factory without ``task``).

        Example:
            >>> ModelConfig(factory="m:build", loss="model").contract, ModelConfig(name="mlp").contract
            (True, False)
        """
        return self.factory is not None and self.task is None

    def _check_contract(self) -> None:
        """``inputs``/``targets``/``loss``: their forms, and that they go with a factory, not ``task``."""
        given = [k for k in ("inputs", "targets", "loss") if getattr(self, k) is not None]
        if given and self.factory is None:
            raise FieldError(given[0], f"model.{given[0]} is given with the zoo model {self.name!r}",
                             "model.factory (your own model) beside it, or no model." + given[0])
        if given and self.task is not None:
            raise FieldError("task", f"model.task {self.task!r} is given beside model.{given[0]}",
                             "either task (the older form: forward(inputs, labels) returns the loss) or "
                             "inputs/targets/loss, not both")
        if self.inputs is not None:
            if not isinstance(self.inputs, dict) or not self.inputs:
                raise FieldError("inputs", f"got {self.inputs!r}",
                                 "a mapping: forward's argument name -> {shape, dtype, high}")
            self.inputs = {_input_name(k): tensor_spec(v, f"inputs.{k}") for k, v in self.inputs.items()}
        if self.targets is not None:
            self.targets = tensor_spec(self.targets, "targets")
            if self.inputs is not None and "targets" in self.inputs:
                raise FieldError("inputs.targets", "an input named 'targets' beside model.targets",
                                 "another name for the forward argument (the loss's targets are 'targets')")
        if self.loss is not None and self.loss not in LOSSES and not (
                isinstance(self.loss, str) and re.fullmatch(r"[\w.]+:[\w.]+", self.loss)):
            raise FieldError("loss", f"got {self.loss!r}",
                             'model | cross_entropy | a function "package.module:function"')
        if self.loss == "cross_entropy" and self.targets is None:
            raise FieldError("targets", "loss: cross_entropy needs model.targets",
                             "targets: {shape: [], dtype: int64, high: NUM_CLASSES} (or [T] for tokens)")
        if self.contract and self.loss is None:
            self.loss = "model"
        if self.loss == "model" and self.targets is not None:
            raise FieldError("targets", "model.targets is given but loss: model does not read it",
                             "loss: cross_entropy or package.module:function beside targets (or no targets; "
                             "labels a forward takes go under model.inputs)")


def _input_name(key: Any) -> str:
    if not isinstance(key, str) or not key.isidentifier():
        raise FieldError(f"inputs.{key}", f"got {key!r}", "a forward argument name (a Python identifier)")
    return key


def tensor_spec(value: Any, key: str) -> dict:
    """A checked ``{shape, dtype, high}`` entry of ``model.inputs`` or ``model.targets``.

    Args:
        value: the YAML mapping.
        key: its key path below ``model`` (errors name ``model.<key>.shape`` and so on).

    Returns:
        ``{"shape": [...], "dtype": "...", "high": int or None}`` with the defaults filled in.

    Example:
        >>> tensor_spec({"shape": [128], "dtype": "int64", "high": 50257}, "inputs.input_ids")
        {'shape': [128], 'dtype': 'int64', 'high': 50257}
        >>> tensor_spec({"shape": [3, 32, 32]}, "inputs.pixel_values")["dtype"]
        'float32'
    """
    form = "{shape: [...], dtype: float32 | int64 | ..., high: N (integers)}"
    if not isinstance(value, dict):
        raise FieldError(key, f"got {type(value).__name__} {value!r}", form)
    unknown = [k for k in value if k not in ("shape", "dtype", "high")]
    if unknown:
        raise FieldError(f"{key}.{unknown[0]}", f"unknown key in model.{key}", "one of shape, dtype, high")
    if "shape" not in value:
        raise FieldError(f"{key}.shape", "missing", "the shape of one sample, e.g. [128] or [] for a scalar")
    shape = value["shape"]
    if not isinstance(shape, (list, tuple)):
        raise FieldError(f"{key}.shape", f"got {shape!r}", "a list of positive integers ([] for a scalar)")
    shape = [_int(d, f"{key}.shape[{i}]") for i, d in enumerate(shape)]
    dtype = _choice(value.get("dtype", "float32"), f"{key}.dtype", INPUT_DTYPES)
    high = _int(value.get("high"), f"{key}.high", optional=True)
    if dtype.startswith(("int", "uint")) and high is None:
        raise FieldError(f"{key}.high", f"an {dtype} input needs high", "values are drawn from [0, high)")
    return {"shape": shape, "dtype": dtype, "high": high}


@dataclass
class DataConfig:
    """Real training data: a factory returning a map-style ``torch.utils.data.Dataset``.

    Each sample is a mapping keyed like ``model.inputs`` (and ``targets``); each rank reads only
    the rows of each global batch its batch shard holds.

    Example:
        >>> DataConfig(factory="mypkg.data:build", kwargs={"n": 4}).kwargs
        {'n': 4}
    """

    factory: str
    """The dataset factory "package.module:function", called with exactly ``kwargs``."""
    kwargs: dict = field(default_factory=dict)
    """Its keyword arguments."""

    def __post_init__(self):
        _str(self.factory, "factory", _FACTORY_FORM)
        if not re.fullmatch(r"[\w.]+:[\w.]+", self.factory):
            raise FieldError("factory", f"got {self.factory!r}", _FACTORY_FORM)
        if not isinstance(self.kwargs, dict) or not all(isinstance(k, str) for k in self.kwargs):
            raise FieldError("kwargs", f"got {self.kwargs!r}", "a mapping of keyword arguments")


@dataclass
class TrainingConfig:
    """How the model is trained: batch, optimizer, precision, steps.

    Example:
        >>> TrainingConfig(global_batch_size=64, optimizer="sgd").optimizer
        'sgd'
    """

    global_batch_size: int | None = None
    """Samples per step over all devices; empty: the zoo preset's default batch size."""
    optimizer: str = "adamw"
    """sgd | momentum | adam | adamw (optimizer state: 0, 1x, 2x, 2x the parameters); the older spelling
    of ``optimizer.name``."""
    precision: str | None = None
    """fp32 | bf16 | fp16 | bf16-mixed | fp16-mixed (:mod:`tensoropt.precision`); empty: from ``dtype``,
    else fp32. The mixed modes compute in 16 bits on float32 master parameters and optimizer state."""
    dtype: str | None = None
    """The older spelling of a pure precision: float32 | bfloat16 | float16 (fp32 | bf16 | fp16).
    Set beside ``precision`` it must mean the same; after loading it holds the alias of a pure
    precision and is empty for a mixed one."""
    seed: int = 0
    """Seed of the initial weights and of the synthetic data."""
    steps: int = 100
    """Total training steps of `tensoropt run`."""
    learning_rate: float = 1e-3
    """Learning rate of the optimizer; the older spelling of ``optimizer.lr``."""
    memory_options: list = field(default_factory=list)
    """Memory options the planner may give each operator: recompute, zero1, zero2, zero3 (empty: none);
    block_recompute, block_selective: whole-block activation checkpointing of each block; chunked_loss:
    the head's matmul and the cross entropy fused, run over chunks (:mod:`estimators.chunked_loss`)."""
    checkpoint_modules: list = field(default_factory=list)
    """Module paths (as in ``named_modules()``) the block options checkpoint as blocks; a container of
    indexed children (``model.layers``) names each child. Empty: the repeated modules the capture finds
    (transformer layers, residual stages)."""
    loss_chunk_tokens: int = 2048
    """Tokens (rows of the logits) per chunk of the ``chunked_loss`` option: its transient is one chunk's
    logits (float32 probabilities and a float32 temporary: 2 x 4 B x tokens x vocabulary)."""
    batch_norm: str = "synchronized"
    """synchronized | local: where a plan splits a batch norm's batch, its statistics are summed over the
    ranks (one all-reduce of 2 x channels numbers in forward and one in backward, priced by the planner;
    training equals one process's) or taken over each rank's rows (no collective; plain DDP's batch norm)."""
    max_grad_norm: float = 0.0
    """Clip the gradients' global norm to this before each update (0: no clipping)."""
    micro_batches: int | str = 1
    """Gradient accumulation, planned: N micro-batches per step (N divides the global batch), or
    ``auto`` (the planner tries 1, 2, 4, ... and keeps the Pareto set over counts and splits)."""

    def __post_init__(self):
        _int(self.global_batch_size, "global_batch_size", optional=True)
        _choice(self.optimizer, "optimizer", OPTIMIZERS)
        self.precision, self.dtype = _precision(self.precision, self.dtype)
        _int(self.seed, "seed", minimum=0)
        _int(self.steps, "steps")
        self.learning_rate = _positive_float(self.learning_rate, "learning_rate")
        self.memory_options = _memory_options(self.memory_options)
        self.checkpoint_modules = _checkpoint_modules(self.checkpoint_modules)
        _int(self.loss_chunk_tokens, "loss_chunk_tokens")
        _choice(self.batch_norm, "batch_norm", BATCH_NORM_MODES)
        self.max_grad_norm = _positive_float(self.max_grad_norm, "max_grad_norm", zero_ok=True)
        self.micro_batches = _micro_batches(self.micro_batches, self.global_batch_size)


def _precision(precision: Any, dtype: Any) -> tuple[str, str | None]:
    """(precision, dtype) of ``training``: one resolved from the other, both checked to agree."""
    from tensoropt.precision import DTYPE_ALIASES, PRECISIONS

    _choice(precision, "precision", tuple(PRECISIONS), optional=True)
    _choice(dtype, "dtype", DTYPES, optional=True)
    if precision is not None and dtype is not None and DTYPE_ALIASES[dtype] != precision:
        raise FieldError("dtype", f"training.dtype {dtype!r} means precision {DTYPE_ALIASES[dtype]!r}, but "
                         f"training.precision is {precision!r}",
                         "only training.precision (training.dtype is its older alias)")
    name = precision or (DTYPE_ALIASES[dtype] if dtype is not None else "fp32")
    alias = {v: k for k, v in DTYPE_ALIASES.items()}.get(name)
    return name, alias


def _memory_options(value: Any) -> list:
    from tensoropt.configspace.options import MEMORY_OPTIONS

    expected = f"a list of some of {list(MEMORY_OPTIONS)}"
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise FieldError("memory_options", f"got {value!r}", expected)
    for v in value:
        if v not in MEMORY_OPTIONS:
            raise FieldError("memory_options", f"unknown option {v!r}", expected)
    return list(dict.fromkeys(value))


def _checkpoint_modules(value: Any) -> list:
    expected = "a list of module paths, e.g. [model.layers]"
    if value is None:
        return []
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise FieldError("checkpoint_modules", f"got {value!r}", expected)
    return list(dict.fromkeys(value))


@dataclass
class PlannerConfig:
    """Knobs of the planner itself (all optional).

    Example:
        >>> PlannerConfig(epsilon=0.01).epsilon, PlannerConfig().epsilon
        (0.01, 'auto')
    """

    epsilon: float | str = "auto"
    """auto: the frontier thinned to at most ``max_plans`` plans by the least epsilon that allows it
    (exact before thinning, except the largest eliminations of deep models, boxed at 0.05 % with their
    bound tracked; the proven bound of both is printed and kept in frontier.json); 0: the exact
    frontier, every plan; > 0: a (1+epsilon)-approximate frontier (boxes in the solver, faster on
    huge models)."""
    max_plans: int = 50
    """With ``epsilon: auto``, the most plans kept per device count."""
    compute: str = "roofline"
    """Compute-time estimator: roofline | profiled (times local shard shapes on this machine)."""
    space: str = "auto"
    """Configuration space: full (every split of every axis) | hierarchical (each cluster level's
    axes go to one parallel dim: DP, TP and their node x GPU hybrids) | auto (full up to
    ``full_space_max_devices``, hierarchical beyond: the full space grows as ~(dims+1)^log2(P))."""
    full_space_max_devices: int = 8
    """With ``space: auto``, the largest device count planned in the full space."""
    pipeline: Any = "off"
    """Pipeline parallelism (issue 27): off (the default while the stage search is slower than the
    planner's targets at scale, docs/results.md) | auto (pipelined plans beside the others beyond
    one node, or when no plan fits the memory budget) | ``{stages: [2, 4], schedules: [1F1B, GPipe],
    micro_batches: [8, 16]}`` (every combination that can run; micro_batches optional; schedules
    among 1F1B, GPipe, Interleaved1F1B: two virtual stages per rank)."""

    def __post_init__(self):
        if isinstance(self.epsilon, str) and self.epsilon != "auto":
            raise FieldError("epsilon", f"got {self.epsilon!r}", "auto, 0 (exact) or a number > 0")
        if self.epsilon != "auto":
            self.epsilon = _positive_float(self.epsilon, "epsilon", zero_ok=True)
        self.max_plans = _int(self.max_plans, "max_plans")
        _choice(self.compute, "compute", ("roofline", "profiled"))
        _choice(self.space, "space", ("auto", "full", "hierarchical"))
        self.full_space_max_devices = _int(self.full_space_max_devices, "full_space_max_devices")
        self.pipeline = _pipeline(self.pipeline)

    def hierarchical_for(self, num_devices: int) -> bool:
        """Whether ``num_devices`` is planned in the hierarchical space.

        Example:
            >>> PlannerConfig().hierarchical_for(8), PlannerConfig().hierarchical_for(16)
            (False, True)
        """
        return self.space == "hierarchical" or (
            self.space == "auto" and num_devices > self.full_space_max_devices)


PIPELINE_KEYS = ("stages", "schedules", "micro_batches")
"""Keys of a ``planner.pipeline`` mapping."""


def _pipeline(value: Any) -> str | dict:
    """Check ``planner.pipeline``: auto, off, or a mapping of lists (stages >= 2, known schedules).

    Example:
        >>> _pipeline({"stages": [2]}), _pipeline("off")
        ({'stages': [2], 'schedules': ['1F1B'], 'micro_batches': None}, 'off')
    """
    if isinstance(value, str):
        return _choice(value, "pipeline", ("auto", "off"))
    if not isinstance(value, dict):
        raise FieldError("pipeline", f"got {type(value).__name__} {value!r}",
                         "auto, off or {stages: [...], schedules: [...], micro_batches: [...]}")
    unknown = sorted(set(value) - set(PIPELINE_KEYS))
    if unknown:
        raise FieldError(f"pipeline.{unknown[0]}", "unknown key", "one of " + ", ".join(PIPELINE_KEYS))
    stages = value.get("stages")
    if not isinstance(stages, list) or not stages:
        raise FieldError("pipeline.stages", f"got {stages!r}", "a list of stage counts, e.g. [2, 4]")
    stages = [_int(v, "pipeline.stages", minimum=2) for v in stages]
    schedules = value.get("schedules") or ["1F1B"]
    if not isinstance(schedules, list):
        raise FieldError("pipeline.schedules", f"got {schedules!r}", "a list such as [1F1B, GPipe]")
    schedules = [_choice(v, "pipeline.schedules", ("1F1B", "GPipe", "Interleaved1F1B")) for v in schedules]
    micro = value.get("micro_batches")
    if micro is not None:
        if not isinstance(micro, list) or not micro:
            raise FieldError("pipeline.micro_batches", f"got {micro!r}", "a list of micro-batch counts")
        micro = [_int(v, "pipeline.micro_batches") for v in micro]
    return {"stages": stages, "schedules": schedules, "micro_batches": micro}


EXECUTOR_MODES = ("replay", "interpret")
"""How ``tensoropt run`` executes a plan: the replayed local program, or the DTensor interpreter."""

COMPILE_BACKENDS = ("none", "inductor")
"""What compiles the replayed local program: nothing, or Inductor."""


@dataclass
class ExecutorConfig:
    """How ``tensoropt run`` executes the plan (both optional).

    Example:
        >>> ExecutorConfig(compile="inductor").mode
        'replay'
    """

    mode: str = "replay"
    """replay (trace each plan's step once into a local program and replay it) | interpret (the
    DTensor interpreter every step: the reference, slower)."""
    compile: str = "none"
    """none | inductor: compile the replayed local program with Inductor (CPU: needs a C++ compiler)."""

    def __post_init__(self):
        _choice(self.mode, "mode", EXECUTOR_MODES)
        _choice(self.compile, "compile", COMPILE_BACKENDS)
        if self.compile != "none" and self.mode != "replay":
            raise FieldError("compile", f"{self.compile!r} with mode {self.mode!r}",
                             "compile: none, or mode: replay (only the replayed program is compiled)")


# ---------------------------------------------------------------------------------------------
# the training loop's sections (optimizer, lr_scheduler, metrics, validation, checkpoint)

OPTIMIZER_DEFAULT_WEIGHT_DECAY = {"sgd": 0.0, "momentum": 0.0, "adam": 0.0, "adamw": 0.01}
"""``optimizer.weight_decay`` when not given: torch's default of each optimizer."""

DECAYS = ("constant", "linear", "cosine")
"""``lr_scheduler.decay``: how the learning rate falls after the warmup."""


def _micro_batches(value: Any, global_batch_size: int | None) -> int | str:
    """``training.micro_batches``: ``auto`` or a count >= 1 dividing the global batch (when given)."""
    if value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FieldError("micro_batches", f"got {value!r}",
                         "auto, or an integer >= 1 dividing the global batch")
    if global_batch_size is not None and global_batch_size % value:
        raise FieldError("micro_batches", f"{value} does not divide the global batch of {global_batch_size} "
                         f"samples, so no plan's per-device batch splits into {value} micro-batches",
                         f"a divisor of {global_batch_size}, or auto")
    return value


def _unit_float(value: Any, key: str, upper_open: bool = False) -> float:
    """A number in [0, 1] (or [0, 1) with ``upper_open``)."""
    form = "a number in [0, 1)" if upper_open else "a number in [0, 1]"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise FieldError(key, f"got {value!r}", form)
    if value < 0 or value > 1 or (upper_open and value == 1):
        raise FieldError(key, f"must be {form[9:]}, got {value}", form)
    return float(value)


@dataclass
class OptimizerConfig:
    """The optimizer of ``tensoropt run`` (torchtitan's keys; ``training.optimizer`` and
    ``training.learning_rate`` are the older spellings of ``name`` and ``lr``).

    Example:
        >>> o = OptimizerConfig(name="adamw", lr=3e-4, no_decay=["bias", "norm"])
        >>> o.weight_decay, o.betas
        (0.01, [0.9, 0.999])
    """

    name: str = "adamw"
    """sgd | momentum (SGD with momentum) | adam | adamw."""
    lr: float = 1e-3
    """The peak learning rate (the schedule's multiplier scales it: ``lr_scheduler``)."""
    betas: list = field(default_factory=lambda: [0.9, 0.999])
    """Adam/AdamW's two moment coefficients, each in [0, 1)."""
    eps: float = 1e-8
    """Adam/AdamW's denominator term (> 0)."""
    momentum: float | None = None
    """SGD's momentum, in [0, 1) (only with ``name: momentum``; default 0.9)."""
    weight_decay: float | None = None
    """Weight decay (>= 0); empty: torch's default (0.01 for adamw, 0 otherwise)."""
    no_decay: list = field(default_factory=list)
    """Words: a parameter whose name contains one of them takes no weight decay (e.g. bias, norm,
    embedding); each must match at least one of the model's parameters (checked before a run)."""

    def __post_init__(self):
        _choice(self.name, "name", OPTIMIZERS)
        self.lr = _positive_float(self.lr, "lr")
        if not isinstance(self.betas, (list, tuple)) or len(self.betas) != 2:
            raise FieldError("betas", f"got {self.betas!r}", "two numbers in [0, 1), e.g. [0.9, 0.95]")
        self.betas = [_unit_float(b, f"betas[{i}]", upper_open=True) for i, b in enumerate(self.betas)]
        self.eps = _positive_float(self.eps, "eps")
        if self.momentum is not None and self.name != "momentum":
            raise FieldError("momentum", f"given with optimizer {self.name!r}",
                             "name: momentum beside it (SGD with momentum), or no optimizer.momentum")
        if self.name == "momentum":
            self.momentum = _unit_float(0.9 if self.momentum is None else self.momentum, "momentum",
                                        upper_open=True)
        if self.weight_decay is None:
            self.weight_decay = OPTIMIZER_DEFAULT_WEIGHT_DECAY[self.name]
        self.weight_decay = _positive_float(self.weight_decay, "weight_decay", zero_ok=True)
        if not isinstance(self.no_decay, (list, tuple)):
            raise FieldError("no_decay", f"got {self.no_decay!r}",
                             "a list of words, e.g. [bias, norm, embedding]")
        self.no_decay = [_str(w, f"no_decay[{i}]", "a word of parameter names, e.g. bias")
                         for i, w in enumerate(self.no_decay)]


@dataclass
class LrSchedulerConfig:
    """The learning-rate schedule: linear warmup to ``optimizer.lr``, then a decay to
    ``min_lr_ratio * lr`` over ``decay_steps`` (:mod:`tensoropt.training.schedule` has the formula).

    Example:
        >>> LrSchedulerConfig(warmup_steps=10, decay="cosine").min_lr_ratio
        0.0
    """

    warmup_steps: int = 0
    """Steps of linear warmup: step s (from 0) uses ``lr * (s + 1) / (warmup_steps + 1)``; at most
    ``training.steps``."""
    decay: str = "constant"
    """constant | linear | cosine: the shape after the warmup."""
    decay_steps: int | None = None
    """Steps the decay takes; empty: the rest of the run (``training.steps - warmup_steps``)."""
    min_lr_ratio: float = 0.0
    """Where the decay ends, as a fraction of ``lr``, in [0, 1]."""

    def __post_init__(self):
        _int(self.warmup_steps, "warmup_steps", minimum=0)
        _choice(self.decay, "decay", DECAYS)
        _int(self.decay_steps, "decay_steps", optional=True)
        self.min_lr_ratio = _unit_float(self.min_lr_ratio, "min_lr_ratio")


@dataclass
class MetricsConfig:
    """What ``tensoropt run`` reports while it trains.

    Example:
        >>> MetricsConfig(log_every=1).log_every, MetricsConfig().jsonl
        (1, None)
    """

    log_every: int = 10
    """Every this many steps: one progress line and one JSON line in ``metrics.jsonl``."""
    jsonl: str | None = None
    """Path of ``metrics.jsonl``; empty: beside ``--metrics``, else ``out/<job>/metrics.jsonl``."""
    tensorboard: str | None = None
    """A directory for TensorBoard event files (torch's ``SummaryWriter``; the ``tensorboard`` extra)."""

    def __post_init__(self):
        _int(self.log_every, "log_every")
        _str(self.jsonl, "jsonl", "a file path", optional=True)
        _str(self.tensorboard, "tensorboard", "a directory path", optional=True)


@dataclass
class ValidationConfig:
    """Forward-only loss on held-out data, every ``every`` steps over ``steps`` batches.

    Example:
        >>> ValidationConfig(data={"factory": "mypkg.data:held_out"}, every=50).steps
        10
    """

    data: DataConfig
    """The held-out dataset ``{factory, kwargs}`` (samples keyed like the training data's)."""
    every: int = 100
    """Validate every this many training steps (and after the last)."""
    steps: int = 10
    """Global batches of held-out data per validation."""

    def __post_init__(self):
        if not isinstance(self.data, DataConfig):
            self.data = _build(DataConfig, self.data, "data")
        _int(self.every, "every")
        _int(self.steps, "steps")


@dataclass
class CheckpointConfig:
    """What ``tensoropt run`` writes beside its DCP checkpoints.

    Example:
        >>> CheckpointConfig(export="out/model").export
        'out/model'
    """

    export: str | None = None
    """A directory: the consolidated trained model (``tensoropt.save_model``) written at the end."""

    def __post_init__(self):
        _str(self.export, "export", "a directory path", optional=True)


def check_training_sections(job: Job) -> None:
    """Cross-section checks of the training loop's keys (called by ``Job.__post_init__``).

    The aliases ``training.optimizer``/``training.learning_rate`` must agree with ``optimizer``
    (where both are set away from their defaults; the section then fills them); the warmup must
    fit the run.

    Example:
        >>> Job(model={"name": "mlp"}, cluster="cpu-local", devices=[1], training={"steps": 5},
        ...     lr_scheduler={"warmup_steps": 9})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        tensoropt.config.FieldError: lr_scheduler.warmup_steps: 9 warmup steps are longer than the ...
    """
    t, o = job.training, job.optimizer
    if o is not None:
        if t.optimizer not in ("adamw", o.name):
            raise FieldError("training.optimizer", f"{t.optimizer!r} but optimizer.name is {o.name!r}",
                             "only optimizer.name (training.optimizer is its older spelling)")
        if t.learning_rate not in (1e-3, o.lr):
            raise FieldError("training.learning_rate", f"{t.learning_rate} but optimizer.lr is {o.lr}",
                             "only optimizer.lr (training.learning_rate is its older spelling)")
        job.training = dataclasses.replace(t, optimizer=o.name, learning_rate=o.lr)
    s = job.lr_scheduler
    if s.warmup_steps > job.training.steps:
        raise FieldError("lr_scheduler.warmup_steps", f"{s.warmup_steps} warmup steps are longer than the "
                         f"run of {job.training.steps} steps (training.steps)",
                         "at most training.steps warmup steps")


def effective_optimizer(job: Job) -> OptimizerConfig:
    """The job's optimizer settings: its ``optimizer`` section, or the one the older keys describe.

    Example:
        >>> job = Job(model={"name": "mlp"}, cluster="cpu-local", devices=[1],
        ...           training={"optimizer": "sgd", "learning_rate": 0.1})
        >>> effective_optimizer(job).name, effective_optimizer(job).lr
        ('sgd', 0.1)
    """
    if job.optimizer is not None:
        return job.optimizer
    return OptimizerConfig(name=job.training.optimizer, lr=job.training.learning_rate)


@dataclass
class Job:
    """A planning job: model, training, cluster, device counts, budget and selection rule.

    Example:
        >>> job = Job(model=ModelConfig(name="mlp"), cluster="cpu-local", devices=[1, 2],
        ...           memory_budget="1GiB")
        >>> job.memory_budget, job.select
        (1073741824, 'fastest')
    """

    model: ModelConfig
    """The model to plan (see ModelConfig)."""
    cluster: str | dict
    """A profile name (configs/clusters/NAME.yaml), a path (relative to the job file), or a mapping."""
    devices: list[int]
    """Device counts to plan for, e.g. [1, 2, 4, 8] (each gets its own frontier)."""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    """How the model is trained (see TrainingConfig)."""
    memory_budget: int | None = None
    """Memory per device the selected plan must fit, e.g. 40GiB; empty: the device's memory."""
    select: str = "fastest"
    """Selection rule: fastest | fewest_devices | best_per_device."""
    max_time_s: float | None = None
    """Optional step-time limit in seconds a selected plan must meet."""
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    """Planner knobs (see PlannerConfig)."""
    data: DataConfig | None = None
    """Real training data for ``tensoropt run`` (see DataConfig); empty: synthetic inputs."""
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    """How ``tensoropt run`` executes the plan (see ExecutorConfig)."""
    optimizer: OptimizerConfig | None = None
    """The optimizer (see OptimizerConfig); empty: ``training.optimizer`` and ``training.learning_rate``."""
    lr_scheduler: LrSchedulerConfig = field(default_factory=LrSchedulerConfig)
    """The learning-rate schedule (see LrSchedulerConfig); default: constant."""
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    """What the run reports while it trains (see MetricsConfig)."""
    validation: ValidationConfig | None = None
    """Held-out loss during the run (see ValidationConfig); empty: none."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """What the run writes at the end (see CheckpointConfig)."""

    def __post_init__(self):
        if not isinstance(self.executor, ExecutorConfig):
            self.executor = _build(ExecutorConfig, {} if self.executor is None else self.executor, "executor")
        if self.data is not None and not isinstance(self.data, DataConfig):
            self.data = _build(DataConfig, self.data, "data")
        if not isinstance(self.model, ModelConfig):
            self.model = _build(ModelConfig, self.model, "model")
        if not isinstance(self.training, TrainingConfig):
            self.training = _build(TrainingConfig, {} if self.training is None else self.training, "training")
        if not isinstance(self.planner, PlannerConfig):
            self.planner = _build(PlannerConfig, {} if self.planner is None else self.planner, "planner")
        self._build_training_sections()
        if not isinstance(self.cluster, (str, dict)) or not self.cluster:
            raise FieldError("cluster", f"got {self.cluster!r}",
                             "a cluster profile name such as h100x8, a path to a profile, or a mapping")
        if isinstance(self.devices, int) and not isinstance(self.devices, bool):
            self.devices = [self.devices]
        if not isinstance(self.devices, (list, tuple)) or not self.devices:
            raise FieldError("devices", f"got {self.devices!r}",
                             "a non-empty list of device counts, e.g. [1, 2, 4]")
        self.devices = [_int(d, f"devices[{i}]") for i, d in enumerate(self.devices)]
        if len(set(self.devices)) != len(self.devices):
            raise FieldError("devices", f"repeated device count in {self.devices}", "distinct device counts")
        self.devices = sorted(self.devices)
        self.memory_budget = _size(self.memory_budget, "memory_budget", optional=True)
        _choice(self.select, "select", SELECT_RULES)
        self.max_time_s = _positive_float(self.max_time_s, "max_time_s", optional=True)
        check_training_sections(self)

    def _build_training_sections(self) -> None:
        """optimizer, lr_scheduler, metrics, validation and checkpoint from their mappings."""
        if self.optimizer is not None and not isinstance(self.optimizer, OptimizerConfig):
            self.optimizer = _build(OptimizerConfig, self.optimizer, "optimizer")
        for name, cls in (("lr_scheduler", LrSchedulerConfig), ("metrics", MetricsConfig),
                          ("checkpoint", CheckpointConfig)):
            value = getattr(self, name)
            if not isinstance(value, cls):
                setattr(self, name, _build(cls, {} if value is None else value, name))
        if self.validation is not None and not isinstance(self.validation, ValidationConfig):
            self.validation = _build(ValidationConfig, self.validation, "validation")

    def to_dict(self) -> dict:
        """Plain-data form (YAML/JSON ready); ``Job.from_dict(job.to_dict()) == job``.

        Example:
            >>> Job(model={"name": "mlp"}, cluster="cpu-local", devices=[2]).to_dict()["devices"]
            [2]
        """
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        """YAML text of :meth:`to_dict` (what :func:`load_job` reads back).

        Example:
            >>> "cluster: cpu-local" in Job(model={"name": "mlp"}, cluster="cpu-local", devices=[2]).to_yaml()
            True
        """
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @staticmethod
    def from_dict(data: Any, source: str = "<job>") -> Job:
        """Build and validate a job from plain data; errors name ``source`` and the key path.

        Example:
            >>> Job.from_dict({"model": {"name": "mlp"}, "cluster": "cpu-local", "devices": [1]}).devices
            [1]
        """
        try:
            return _build(Job, data, "")
        except ConfigError as e:
            raise ConfigError(source, e.key_path, e.problem, e.expected) from None


def load_job(path: str | Path) -> Job:
    """Read and validate a YAML job file.

    Raises:
        ConfigError: naming the file, the full key path and the expected form.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "j.yaml")
        >>> text = "model: {name: mlp}\\ncluster: cpu-local\\ndevices: [1, 2]\\nmemory_budget: 1 GiB\\n"
        >>> _ = open(p, "w").write(text)
        >>> load_job(p).memory_budget
        1073741824
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(str(path), "", f"cannot read the file: {e.strerror}",
                          "a readable YAML job file") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(str(path), "", f"invalid YAML: {e}",
                          "a YAML mapping (see docs/user-guide.md)") from None
    job = Job.from_dict(data, str(path))
    job.cluster = _cluster_beside(job.cluster, path)
    return job


def _cluster_beside(cluster: str | dict, job_path: Path) -> str | dict:
    """A relative cluster *path* is read relative to the job file when a file is there."""
    if not isinstance(cluster, str) or not (cluster.endswith((".yaml", ".yml")) or "/" in cluster):
        return cluster
    candidate = job_path.parent / cluster
    if Path(cluster).is_absolute() or not candidate.is_file():
        return cluster
    relative = os.path.relpath(candidate)
    return relative if not relative.startswith("..") else str(candidate.resolve())


def _build(cls: type, data: Any, prefix: str):
    """Construct dataclass ``cls`` from a mapping, turning every failure into a ConfigError."""
    where = prefix or "the job"
    names = [f.name for f in dataclasses.fields(cls)]
    if not isinstance(data, dict):
        raise ConfigError("", prefix, f"got {type(data).__name__} {data!r}",
                          f"a mapping with keys {', '.join(names)}")
    for key in data:
        if key not in names:
            raise ConfigError("", _join(prefix, str(key)), f"unknown key in {where}",
                              f"one of {', '.join(names)}")
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    for key in required:
        if key not in data:
            raise ConfigError("", _join(prefix, key), f"missing required key in {where}",
                              f"a value for {key}")
    try:
        return cls(**data)
    except FieldError as e:
        raise ConfigError("", _join(prefix, e.key), e.problem, e.expected) from None
    except ConfigError as e:
        raise ConfigError("", _join(prefix, e.key_path), e.problem, e.expected) from None


def _join(prefix: str, key: str) -> str:
    if not prefix:
        return key
    return f"{prefix}{key}" if key.startswith("[") else f"{prefix}.{key}"
