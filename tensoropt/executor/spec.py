"""What the executor trains: model, data, optimizer, steps (a plain, JSON-serialisable spec).

``TrainSpec.from_job`` turns the planner's YAML job into this form; tests build it directly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from tensoropt.executor.data import InputSpec, load_factory

OPTIMIZERS = ("sgd", "momentum", "adamw")


@dataclass(frozen=True)
class TrainSpec:
    """A training run, independent of the plan.

    Attributes:
        model: a zoo model name (``tensoropt.models``) or a factory ``"module:function"``.
        model_kwargs: keyword arguments of the model constructor.
        inputs: per-sample input specs, in the order the model's forward takes them.
        global_batch_size: samples per step over all devices.
        optimizer: ``sgd``, ``momentum`` or ``adamw``.
        lr: learning rate.
        seed: seeds the initial weights and the synthetic data.
        steps: number of training steps.
        dataset: optional ``"module:function"``; called as ``f(step, global_batch_size, seed)``,
            returns the global batch (a tuple of tensors) of that step.
    """

    model: str
    inputs: tuple[InputSpec, ...]
    global_batch_size: int
    model_kwargs: dict = field(default_factory=dict)
    optimizer: str = "sgd"
    lr: float = 0.01
    seed: int = 0
    steps: int = 3
    dataset: str | None = None

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"TrainSpec.optimizer: {self.optimizer!r} is not one of {OPTIMIZERS}")
        if self.global_batch_size < 1:
            raise ValueError(f"TrainSpec.global_batch_size must be >= 1, got {self.global_batch_size}")
        if self.steps < 0:
            raise ValueError(f"TrainSpec.steps must be >= 0, got {self.steps}")

    def build_model(self) -> torch.nn.Module:
        """Build the model with the spec's seed (same initial weights on every rank and world size).

        Example:
            >>> spec = TrainSpec("torch.nn:Linear", (InputSpec((2,)),), 4,
            ...                   {"in_features": 2, "out_features": 1})
            >>> spec.build_model().weight.shape
            torch.Size([1, 2])
        """
        torch.manual_seed(self.seed)
        if ":" in self.model:
            return load_factory(self.model)(**self.model_kwargs)
        try:
            from tensoropt import models
        except ImportError as err:
            raise ValueError(f"model {self.model!r}: the model zoo is not available ({err})") from err
        return models.build(self.model, **self.model_kwargs)

    def make_optimizer(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        """The spec's optimizer over ``params``."""
        if self.optimizer == "sgd":
            return torch.optim.SGD(params, lr=self.lr)
        if self.optimizer == "momentum":
            return torch.optim.SGD(params, lr=self.lr, momentum=0.9)
        return torch.optim.AdamW(params, lr=self.lr)

    def to_json(self) -> dict:
        """JSON form (``from_json`` reads it back)."""
        data = asdict(self)
        data["inputs"] = [asdict(s) | {"shape": list(s.shape)} for s in self.inputs]
        return data

    @staticmethod
    def from_json(data: dict) -> TrainSpec:
        """Inverse of :meth:`to_json`."""
        data = dict(data)
        data["inputs"] = tuple(InputSpec.from_json(s) for s in data["inputs"])
        return TrainSpec(**data)
