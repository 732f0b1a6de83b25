"""What the executor trains: model, data, optimizer, steps (a plain, JSON-serialisable spec).

``TrainSpec.from_job`` turns the planner's YAML job into this form; tests build it directly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from tensoropt.executor.data import _DTYPES, InputSpec, load_factory
from tensoropt.precision import get_precision

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
        dtype: ``float32``, ``bfloat16`` or ``float16`` (the graph's compute dtype: parameters and
            float inputs; with a mixed ``precision`` the parameters are kept in float32); ``float64``
            for numerical checks of ill-conditioned models.
        job: the planner's job (``Job.to_dict()``) when the model comes from a job: the model is
            then built exactly as the planner built it (``tensoropt.planner.build_job_model``).
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
    dtype: str = "float32"
    job: dict | None = None
    precision: str | None = None
    """A mixed precision (``bf16-mixed`` | ``fp16-mixed``, :mod:`tensoropt.precision`): float32 master
    parameters cast to ``dtype`` (its compute dtype) where used; None or a pure one: all in ``dtype``."""

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"TrainSpec.optimizer: {self.optimizer!r} is not one of {OPTIMIZERS}")
        if self.global_batch_size < 1:
            raise ValueError(f"TrainSpec.global_batch_size must be >= 1, got {self.global_batch_size}")
        if self.dtype not in ("float32", "bfloat16", "float16", "float64"):
            raise ValueError(f"TrainSpec.dtype: {self.dtype!r} is not float32, bfloat16, float16 or float64")
        compute = self.mixed.compute_dtype if self.mixed is not None else self.dtype
        if compute != self.dtype:  # a pure precision's dtype may be replaced (float64 checks)
            raise ValueError(f"TrainSpec.precision {self.precision!r} computes in {compute}, but "
                             f"TrainSpec.dtype is {self.dtype!r}")
        if self.steps < 0:
            raise ValueError(f"TrainSpec.steps must be >= 0, got {self.steps}")

    def build_model(self) -> torch.nn.Module:
        """The whole model with the executor's initial weights (the 1-process reference).

        Built as every rank builds its shards (:mod:`tensoropt.executor.materialize`: parameters on
        meta, then each module's init from a seed derived from the spec's seed and the module's
        path), so any plan at any device count starts from exactly these values.

        Example:
            >>> spec = TrainSpec("torch.nn:Linear", (InputSpec((2,)),), 4,
            ...                   {"in_features": 2, "out_features": 1})
            >>> spec.build_model().weight.shape
            torch.Size([1, 2])
        """
        from tensoropt.executor.materialize import build_skeleton, full_model

        return full_model(build_skeleton(self))

    def construct_model(self) -> torch.nn.Module:
        """Call the model's constructor (the job's, the factory's or the zoo's) and cast to the dtype.

        :func:`tensoropt.executor.materialize.build_skeleton` calls it with parameters sent to meta.

        Example:
            >>> spec = TrainSpec("torch.nn:Linear", (InputSpec((2,)),), 4,
            ...                   {"in_features": 2, "out_features": 1})
            >>> spec.construct_model().weight.shape
            torch.Size([1, 2])
        """
        if self.job is not None:
            from tensoropt.config import Job
            from tensoropt.planner import build_job_model

            model = build_job_model(Job.from_dict(self.job), device=None)[0]
        elif ":" in self.model:
            model = load_factory(self.model)(**self.model_kwargs)
        else:
            from tensoropt.models import build_model

            model = build_model(self.model, **self.model_kwargs)[0]
        return model.to(_DTYPES[self.dtype]) if self.dtype != "float32" else model

    @staticmethod
    def from_job(job, steps: int | None = None, dataset: str | None = None) -> TrainSpec:
        """The training run a planner job describes (model, synthetic inputs, optimizer, seed).

        Example:
            >>> from tensoropt.config import Job
            >>> job = Job.from_dict({"model": {"name": "mlp", "kwargs": {"in_features": 8, "hidden": [16],
            ...     "num_classes": 4}}, "cluster": "cpu-local", "devices": [2],
            ...     "training": {"global_batch_size": 4}})
            >>> spec = TrainSpec.from_job(job)
            >>> [i.shape for i in spec.inputs], spec.inputs[1].high, spec.global_batch_size
            ([(8,), ()], 4, 4)
        """
        from tensoropt.config import Job
        from tensoropt.planner import build_job_model, job_model_kwargs

        if isinstance(job, dict):
            job = Job.from_dict(job)
        _, mspec = build_job_model(job, device="meta")
        if mspec.task in ("image", "vector"):
            inputs = (InputSpec(tuple(mspec.input_shape)), InputSpec((), "int64", mspec.num_classes))
        elif mspec.task == "lm":
            tokens = InputSpec((mspec.seq_len,), "int64", mspec.vocab_size)
            inputs = (tokens, tokens)
        elif dataset is None:
            raise ValueError(
                f"model {mspec.name!r}: give model.task (classification | language_model) in the job, "
                "or a dataset factory, so the executor knows what inputs to feed"
            )
        else:
            inputs = ()
        t = job.training
        name = job.model.name or job.model.factory
        return TrainSpec(
            model=name, inputs=inputs, global_batch_size=t.global_batch_size or mspec.default_batch_size,
            model_kwargs=job_model_kwargs(job), optimizer=t.optimizer, lr=t.learning_rate, seed=t.seed,
            steps=steps if steps is not None else t.steps, dataset=dataset,
            dtype=get_precision(t.precision).compute_dtype, precision=t.precision,
            job=job.to_dict(),
        )

    @property
    def mixed(self):
        """The mixed :class:`~tensoropt.precision.Precision` of this run, or None (all in ``dtype``).

        Example:
            >>> TrainSpec("m:f", (), 4, dtype="bfloat16", precision="bf16-mixed").mixed.param_dtype
            'float32'
        """
        p = get_precision(self.precision) if self.precision is not None else None
        return p if p is not None and p.mixed else None

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
