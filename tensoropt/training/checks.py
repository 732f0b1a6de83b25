"""What ``tensoropt run`` checks of the trainer's keys before any worker starts: each problem one
line naming the key and the way out.

Example:
    >>> from tensoropt.config import Job
    >>> job = Job(model={"name": "mlp"}, cluster="cpu-local", devices=[1],
    ...           optimizer={"no_decay": ["bias", "norm"]})
    >>> launch_problems(job, ["fc.weight", "fc.bias"])  # doctest: +ELLIPSIS
    ["optimizer.no_decay: 'norm' names none of the model's 2 parameters (e.g. fc.weight, fc.bias); ..."]
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from tensoropt.training.metrics import writable_directory_error
from tensoropt.training.optimizer import unmatched_words

__all__ = ["launch_problems", "micro_batch_problem", "trainer_keys"]


def trainer_keys(job, plan: dict | None = None) -> list[str]:
    """The trainer keys ``job`` sets (and ``training.micro_batches`` when the plan runs more than
    one, or, with no plan chosen yet, when the job plans more than one): with any, ``tensoropt
    run`` trains with :mod:`tensoropt.training.loop`.

    Example:
        >>> from tensoropt.config import Job
        >>> job = Job(model={"name": "mlp"}, cluster="cpu-local", devices=[1],
        ...           training={"max_grad_norm": 1.0}, lr_scheduler={"warmup_steps": 2})
        >>> trainer_keys(job), trainer_keys(Job(model={"name": "mlp"}, cluster="cpu-local", devices=[1]))
        (['lr_scheduler', 'training.max_grad_norm'], [])
    """
    from tensoropt.config import CheckpointConfig, LrSchedulerConfig, MetricsConfig

    keys = [name for name, default in (("optimizer", None), ("lr_scheduler", LrSchedulerConfig()),
                                       ("metrics", MetricsConfig()), ("validation", None),
                                       ("checkpoint", CheckpointConfig()))
            if getattr(job, name) != default]
    if job.training.max_grad_norm:
        keys.append("training.max_grad_norm")
    if int((plan or {}).get("micro_batches", 1)) > 1 or (plan is None and job.training.micro_batches != 1):
        keys.append("training.micro_batches")  # without a plan yet (elastic): any the job may plan
    return keys


def launch_problems(job, parameter_names: Iterable[str], plan: dict | None = None) -> list[str]:
    """Every problem of the job's trainer keys against its model (``parameter_names``: the
    ``named_parameters()`` names) and the plan it runs (plan.json's content), empty when none.

    Checks: ``optimizer.no_decay`` words that name no parameter; a ``metrics.tensorboard`` directory
    that cannot be written; the plan's micro-batches against its per-device batch
    (:func:`micro_batch_problem`).
    """
    names = list(parameter_names)
    problems = []
    if job.optimizer is not None:
        for word in unmatched_words(names, job.optimizer.no_decay):
            shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
            problems.append(f"optimizer.no_decay: {word!r} names none of the model's {len(names)} "
                            f"parameters (e.g. {shown}); drop it or give a word of their names")
    if job.metrics.tensorboard is not None:
        error = writable_directory_error(job.metrics.tensorboard, "metrics.tensorboard")
        if error:
            problems.append(error)
    if plan is not None:
        problem = micro_batch_problem(plan, job.training.global_batch_size, job.training.micro_batches)
        if problem:
            problems.append(problem)
    return problems


def micro_batch_problem(plan: dict, global_batch_size: int | None, setting: int | str = "auto") -> str | None:
    """Why ``plan``'s micro-batch count cannot run its per-device batch (or differs from the job's
    ``training.micro_batches``), else None.

    Each operator that splits the batch ``d`` ways holds ``B / d`` rows per device; ``m``
    micro-batches need ``B / (d m)`` whole rows.

    Example:
        >>> plan = {"id": "d4-p0", "micro_batches": 4, "mesh": {"shape": [4], "levels": ["gpu"]},
        ...         "placements": {"fc": {"splits": {"batch": [0]}}}}
        >>> micro_batch_problem(plan, 8)[:72]
        'training.micro_batches: plan d4-p0 runs 4 micro-batches, but its per-dev'
        >>> micro_batch_problem(plan, 16) is None
        True
    """
    m = int(plan.get("micro_batches", 1))
    if isinstance(setting, int) and setting != m:
        return (f"training.micro_batches: {setting}, but plan {plan.get('id')} was planned with {m} "
                f"micro-batches; plan again with this job, or set training.micro_batches: {m} (or auto)")
    if not global_batch_size:
        return None
    shape = (plan.get("mesh") or {}).get("shape") or []
    degree = 1
    for placement in (plan.get("placements") or {}).values():
        for dim, axes in (placement.get("splits") or {}).items():
            if dim == "batch":
                degree = max(degree, math.prod(shape[a] for a in axes))
    if global_batch_size % (degree * m):
        per_device = f"{global_batch_size / degree:g} samples ({global_batch_size} over a {degree}-way split)"
        return (f"training.micro_batches: plan {plan.get('id')} runs {m} micro-batches, but its per-device "
                f"batch of {per_device} does not split into {m}; choose a plan or a global batch divisible "
                f"by {degree * m}")
    return None
