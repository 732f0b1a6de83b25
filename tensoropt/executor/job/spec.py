"""What the executor trains: model, data, optimizer, steps (a plain, JSON-serialisable spec).

``TrainSpec.from_job`` turns the planner's YAML job into this form; tests build it directly.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import asdict, dataclass, field

import torch

from tensoropt.config import BATCH_NORM_MODES
from tensoropt.executor.job.data import _DTYPES, BatchSource, InputSpec, load_factory
from tensoropt.precision import get_precision

OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")


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
            then built exactly as the planner built it (``tensoropt.job_model.build_job_model``).
        data: the job's ``data`` section (``{"factory", "kwargs"}``: a map-style dataset), or None.
        input_names: the graph inputs' names (keys of a dataset's samples), in ``inputs`` order.
        batch_norm: ``synchronized`` or ``local``: a batch-split batch norm's statistics over the global
            batch or over each rank's rows (the job's ``training.batch_norm``).
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
    data: dict | None = None
    input_names: tuple[str, ...] = ()
    batch_norm: str = "synchronized"

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
        if self.batch_norm not in BATCH_NORM_MODES:
            raise ValueError(f"TrainSpec.batch_norm: {self.batch_norm!r} is not one of {BATCH_NORM_MODES}")

    def build_model(self) -> torch.nn.Module:
        """The whole model with the executor's initial weights (the 1-process reference).

        Built as every rank builds its shards (:mod:`tensoropt.executor.job.materialize`: parameters on
        meta, then each module's init from a seed derived from the spec's seed and the module's
        path), so any plan at any device count starts from exactly these values.

        Example:
            >>> spec = TrainSpec("torch.nn:Linear", (InputSpec((2,)),), 4,
            ...                   {"in_features": 2, "out_features": 1})
            >>> spec.build_model().weight.shape
            torch.Size([1, 2])
        """
        from tensoropt.executor.job.materialize import build_skeleton, full_model

        return full_model(build_skeleton(self))

    def construct_model(self) -> torch.nn.Module:
        """Call the model's constructor (the job's, the factory's or the zoo's) and cast to the dtype
        parameters are stored in (``dtype``; float32 in a mixed precision, whose graph is exported from
        a compute-dtype copy: :func:`tensoropt.executor.state.mixed_precision.compute_module`).

        :func:`tensoropt.executor.job.materialize.build_skeleton` calls it with parameters sent to meta.

        Example:
            >>> spec = TrainSpec("torch.nn:Linear", (InputSpec((2,)),), 4,
            ...                   {"in_features": 2, "out_features": 1})
            >>> spec.construct_model().weight.shape
            torch.Size([1, 2])
        """
        if self.job is not None:
            from tensoropt.config import Job
            from tensoropt.job_model import build_job_model

            model = build_job_model(Job.from_dict(self.job), device=None)[0]
        elif ":" in self.model:
            model = load_factory(self.model)(**self.model_kwargs)
        else:
            from tensoropt.models import build_model

            model = build_model(self.model, **self.model_kwargs)[0]
        stored = self.mixed.param_dtype if self.mixed is not None else self.dtype  # mixed: float32 masters
        return model.to(_DTYPES[stored]) if stored != "float32" else model

    @staticmethod
    def from_job(job, steps: int | None = None, dataset: str | None = None) -> TrainSpec:
        """The training run a planner job describes (model, inputs, data, optimizer, seed).

        The job is resolved as ``tensoropt plan`` resolves it (:func:`tensoropt.job_model.resolve_job`:
        the same defaults, batch size and budget), so ``run`` trains the model ``plan`` planned.

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
        from tensoropt.job_model import build_job_model, job_model_kwargs, resolve_job

        if isinstance(job, dict):
            job = Job.from_dict(job)
        model, mspec = build_job_model(job, device="meta")
        job = resolve_job(job, mspec)
        inputs, names = job_inputs(job, model, mspec, dataset)
        t = job.training
        name = job.model.name or job.model.factory
        return TrainSpec(
            model=name, inputs=inputs, global_batch_size=t.global_batch_size,
            model_kwargs=job_model_kwargs(job), optimizer=t.optimizer, lr=t.learning_rate, seed=t.seed,
            steps=steps if steps is not None else t.steps, dataset=dataset,
            dtype=get_precision(t.precision).compute_dtype, precision=t.precision,
            job=job.to_dict(), data=dataclasses.asdict(job.data) if job.data is not None else None,
            input_names=names, batch_norm=t.batch_norm,
        )

    def batch_source(self) -> BatchSource:
        """Where this run's batches come from (synthetic, ``data``, ``dataset`` or the model's examples).

        Example:
            >>> kwargs = {"in_features": 2, "out_features": 1}
            >>> spec = TrainSpec("torch.nn:Linear", (InputSpec((2,)),), 4, kwargs)
            >>> spec.batch_source().local(0, [((0, 4), (0, 2))])[0].shape
            torch.Size([4, 2])
        """
        dataset = None
        if self.data is not None:
            try:
                dataset = load_factory(self.data["factory"])(**self.data.get("kwargs", {}))
            except (TypeError, ValueError) as e:
                raise ValueError(f"data.factory {self.data['factory']!r}: {e}") from None
        example_fn = None
        if any(s.from_model for s in self.inputs):
            from tensoropt.config import Job
            from tensoropt.job_model import build_job_model

            user_model = build_job_model(Job.from_dict(self.job), device="meta")[0].model
            example_fn = _example_fn(user_model)
        names = self.input_names or tuple(f"input{i}" for i in range(len(self.inputs)))
        batch_fn = load_factory(self.dataset) if self.dataset else None
        return BatchSource(self.inputs, names, self.global_batch_size, self.seed, dataset=dataset,
                           batch_fn=batch_fn, example_fn=example_fn)

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
        if self.optimizer == "adam":
            return torch.optim.Adam(params, lr=self.lr)
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
        data["input_names"] = tuple(data.get("input_names", ()))
        return TrainSpec(**data)


def job_inputs(job, model, mspec, dataset=None) -> tuple[tuple[InputSpec, ...], tuple[str, ...]]:
    """(per-sample specs, names) of the graph inputs of a job's (built) model, in call order.

    A contract model: ``model.inputs`` (or its ``example_inputs``) then ``targets``; a zoo or
    ``task`` model: (inputs, labels) from its task; a factory model with neither: only with ``dataset``.

    Example:
        >>> from tensoropt.config import Job
        >>> from tensoropt.job_model import build_job_model
        >>> job = Job.from_dict({"model": {"name": "mlp"}, "cluster": "cpu-local", "devices": [1]})
        >>> job_inputs(job, *build_job_model(job))[1]
        ('x', 'labels')
    """
    m = job.model
    if m.contract:
        specs = []
        if m.inputs is not None:
            specs = [InputSpec(tuple(m.inputs[n]["shape"]), m.inputs[n]["dtype"], m.inputs[n]["high"])
                     for n in model.forward_names]
        else:
            for t in model.example_inputs(1, "meta")[:len(model.forward_names)]:
                dtype = str(t.dtype).removeprefix("torch.")
                specs.append(InputSpec(tuple(t.shape[1:]), dtype, None, from_model=True))
        if m.targets is not None:
            specs.append(InputSpec(tuple(m.targets["shape"]), m.targets["dtype"], m.targets["high"]))
        return tuple(specs), model.input_names
    if mspec.task in ("image", "vector"):
        specs = (InputSpec(tuple(mspec.input_shape)), InputSpec((), "int64", mspec.num_classes))
    elif mspec.task == "lm":
        tokens = InputSpec((mspec.seq_len,), "int64", mspec.vocab_size)
        specs = (tokens, tokens)
    elif dataset is None:
        raise ValueError(
            f"model {mspec.name!r}: give model.task (classification | language_model) in the job, "
            "or model.inputs (see docs/user-guide.md, \"Your own model\"), so the executor knows what to feed"
        )
    else:
        specs = ()
    return specs, _forward_names(model, len(specs))


def _forward_names(model, count: int) -> tuple[str, ...]:
    """The first ``count`` positional parameter names of ``model.forward`` (dataset sample keys)."""
    try:
        params = [p.name for p in inspect.signature(model.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return tuple(params[:count]) + tuple(f"input{i}" for i in range(len(params), count))


def _example_fn(user_model):
    """``batch_size -> tensors`` from the user model's ``example_inputs`` (tuple or dict)."""

    def examples(batch_size: int) -> tuple:
        out = user_model.example_inputs(batch_size)
        values = tuple(out.values()) if isinstance(out, dict) else (out,) if isinstance(out, torch.Tensor) \
            else tuple(out)
        if any(v.device.type == "meta" for v in values):
            raise ValueError(f"model.inputs: {type(user_model).__name__}.example_inputs made meta tensors; "
                             "create them on the CPU, or list the inputs under model.inputs")
        return values

    return examples
