"""The job as a run needs it: its model built with the job's overrides, its cluster, its defaults.

One resolution for every stage: ``tensoropt plan`` (the planner), ``tensoropt run`` (the executor's
``TrainSpec.from_job``) and elastic selection call these functions, so they build the same model
and read the same budget. It sits below both the planner and the executor (docs/architecture.md,
"Layers").

Example:
    >>> from tensoropt.config import FieldError, Job
    >>> job = Job(model={"name": "mlp"}, cluster="cpu-local", devices=[1])
    >>> resolve_job(job).training.global_batch_size > 0
    True
"""

from __future__ import annotations

import dataclasses

from tensoropt.config import FieldError, Job


class PlanningError(RuntimeError):
    """A stage of planning failed; the message names the stage, the device count and the fix."""


def job_model_kwargs(job: Job) -> dict:
    """The model constructor's keyword arguments: a factory's ``model.kwargs`` exactly; for a zoo
    preset, ``model.kwargs`` plus the job-level overrides (num_classes, seq_len, vocab_size, input_shape).

    Example:
        >>> from tensoropt.config import Job
        >>> job = Job(model={"name": "mlp", "num_classes": 7}, cluster="cpu-local", devices=[1])
        >>> job_model_kwargs(job)["num_classes"]
        7
    """
    m = job.model
    overrides = dict(m.kwargs)
    if m.factory is not None:  # a user factory is called with exactly model.kwargs
        return overrides
    for key in ("num_classes", "seq_len", "vocab_size"):
        if getattr(m, key) is not None:
            overrides[key] = getattr(m, key)
    if m.input_shape is not None and m.name is not None:
        overrides["input_shape"] = tuple(m.input_shape)
    return overrides


def build_job_model(job: Job, device: str | None = "meta"):
    """Build the job's model and its spec (inputs, classes) with the job's overrides.

    Args:
        job: the job.
        device: where to build the parameters (``"meta"`` allocates nothing).

    Returns:
        ``(module, spec)`` as :func:`tensoropt.models.build_model` returns them; for a user
        factory with ``task``/``input_shape`` in the job the spec describes those inputs; a
        factory without ``task`` (the model contract: ``inputs``/``targets``/``loss``) comes
        wrapped with its loss in a :class:`tensoropt.models.contract.TrainingStep`.

    Example:
        >>> from tensoropt.config import Job
        >>> job = Job(model={"name": "mlp"}, cluster="cpu-local", devices=[1])
        >>> build_job_model(job)[1].input_shape
        (1024,)
    """
    from tensoropt.models import build_model
    from tensoropt.models.kwarg_errors import kwarg_error

    m = job.model
    overrides = job_model_kwargs(job)
    name = m.name if m.name is not None else m.factory
    try:
        model, spec = build_model(name, device=device, **overrides)
    except Exception as e:  # a library's own validation errors too (HF's StrictDataclassFieldValidationError)
        refused = kwarg_error(e, overrides) if m.factory is not None else None
        if refused is not None and refused[0] is not None:
            raise PlanningError(f"model.kwargs.{refused[0]}: {name!r} refused {overrides[refused[0]]!r}: "
                                f"{refused[1]}") from None
        if isinstance(e, TypeError) or refused is not None or (m.factory is not None and overrides):
            where = "model.kwargs" if m.factory is not None else "model"
            why = refused[1] if refused else f"{type(e).__name__}: {e}" if not isinstance(e, TypeError) else e
            raise PlanningError(f"{where}: cannot build {name!r} with kwargs {overrides}: {why}") from None
        if isinstance(e, ValueError):
            raise PlanningError(f"model: cannot build {name!r}: {e}") from None
        raise
    if m.contract:
        from tensoropt.models.contract import ContractError, training_step

        try:
            return training_step(model, m.inputs, m.targets, m.loss), spec
        except ContractError as e:
            raise PlanningError(str(e)) from None
    if m.factory is not None and m.task is not None:
        spec = _factory_spec(spec, job)
    return model, spec


def _factory_spec(spec, job: Job):
    """A user factory's spec from the job's task, input_shape, num_classes, seq_len, vocab_size."""
    m = job.model
    if m.task == "classification":
        if m.input_shape is None or m.num_classes is None:
            raise PlanningError(
                "model: a factory model with task classification needs model.input_shape "
                "and model.num_classes"
            )
        task = "vector" if len(m.input_shape) == 1 else "image"
        return dataclasses.replace(
            spec, task=task, input_shape=tuple(m.input_shape), num_classes=m.num_classes
        )
    if m.seq_len is None or m.vocab_size is None:
        raise PlanningError(
            "model: a factory model with task language_model needs model.seq_len and model.vocab_size"
        )
    return dataclasses.replace(
        spec, task="lm", input_shape=(m.seq_len,), seq_len=m.seq_len, vocab_size=m.vocab_size
    )


def resolve_job(job: Job, spec=None, cluster=None) -> Job:
    """The job with defaults filled in: model task/shapes from the preset, budget from the device.

    Example:
        >>> from tensoropt.config import Job
        >>> r = resolve_job(Job(model={"name": "vgg16"}, cluster="h100x8", devices=[8]))
        >>> r.model.task, r.model.input_shape, r.model.num_classes, r.memory_budget
        ('classification', [3, 224, 224], 1000, 85899345920)
    """
    if spec is None:
        spec = build_job_model(job)[1]
    if cluster is None:
        cluster = load_job_cluster(job)
    task = {"lm": "language_model", "image": "classification", "vector": "classification"}.get(spec.task)
    model = dataclasses.replace(
        job.model,
        task=job.model.task or task,
        input_shape=job.model.input_shape or (list(spec.input_shape) if task == "classification" else None),
        num_classes=job.model.num_classes or spec.num_classes,
        seq_len=job.model.seq_len or spec.seq_len,
        vocab_size=job.model.vocab_size or spec.vocab_size,
    )
    budget = job.memory_budget if job.memory_budget is not None else int(cluster.device.memory_bytes)
    batch = job.training.global_batch_size or spec.default_batch_size
    try:  # the preset's batch is known only now: training.micro_batches must divide it
        training = dataclasses.replace(job.training, global_batch_size=batch)
    except FieldError as e:
        raise PlanningError(f"training.{e}") from None
    return dataclasses.replace(job, model=model, training=training, memory_budget=budget)


def load_job_cluster(job: Job):
    """The job's cluster profile (``estimators.profiles.Cluster``), errors naming the job key.

    Example:
        >>> from tensoropt.config import Job
        >>> load_job_cluster(Job(model={"name": "mlp"}, cluster="cpu-local", devices=[1])).backend
        'gloo'
    """
    from estimators.profiles import ProfileError, load_cluster

    try:
        cluster = load_cluster(job.cluster)
    except ProfileError as e:
        raise PlanningError(f"cluster: {e}") from None
    too_many = [d for d in job.devices if d > cluster.max_devices]
    if too_many:
        raise PlanningError(
            f"devices: {too_many} exceed the {cluster.max_devices} devices of cluster "
            f"{cluster.name!r} ({cluster.num_nodes} nodes x {cluster.devices_per_node}); "
            "use a larger cluster profile or fewer devices"
        )
    return cluster


def tokens_per_sample(job: Job) -> int | None:
    """Tokens in one sample of a (resolved) job with token inputs, else None: a language model's
    ``seq_len``, or the length of a factory model's first 1-D integer input (``input_ids: {shape: [128],
    dtype: int64}``). A zoo model's task comes from its preset: resolve the job first (:func:`resolve_job`).

    Example:
        >>> from tensoropt.config import Job
        >>> tokens_per_sample(resolve_job(Job(model={"name": "gpt2-small", "seq_len": 512}, cluster="h100x8",
        ...                                   devices=[1])))
        512
        >>> tokens_per_sample(Job(model={"factory": "m:f", "inputs": {"input_ids": {"shape": [64],
        ...     "dtype": "int64", "high": 100}}}, cluster="h100x8", devices=[1]))
        64
        >>> tokens_per_sample(Job(model={"name": "vgg16"}, cluster="h100x8", devices=[1])) is None
        True
    """
    m = job.model
    if m.task == "language_model" and m.seq_len:
        return int(m.seq_len)
    for spec in (m.inputs or {}).values():
        if spec["dtype"].startswith("int") and len(spec["shape"]) == 1:
            return int(spec["shape"][0])
    return None
