"""The one-process reference of a pipelined run: the whole model, the whole batch, the same optimizer.

Example:
    >>> from tensoropt.executor.job.data import InputSpec
    >>> from tensoropt.executor.job.spec import TrainSpec
    >>> spec = TrainSpec("torch.nn:Linear", (InputSpec((2,)),), 4, {"in_features": 2, "out_features": 1})
    >>> losses, params = reference_run(spec, 0)
    >>> losses, sorted(params)
    ([], ['bias', 'weight'])
"""

from __future__ import annotations

import torch


def reference_run(spec, steps: int, micro_batches: int = 1) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Train ``spec``'s model for ``steps`` steps on one process, eagerly (the initial weights
    and batches every plan gets); the loss per step and the final parameters by name.

    With ``micro_batches`` m > 1 each step accumulates the gradients of m equal slices of the
    batch, each loss scaled by 1/m: the same sums, in the same grouping, as a pipelined run of m
    micro-batches (times its data-parallel degree). The step's loss is the sum of the scaled losses.

    Example:
        >>> # see the module docstring
        >>> reference_run(spec, 3)  # doctest: +SKIP
    """
    torch.manual_seed(spec.seed)
    model = spec.build_model()
    optimizer = spec.make_optimizer(list(model.parameters()))
    source = spec.batch_source()
    shapes = [(spec.global_batch_size, *s.shape) for s in spec.inputs]
    regions = [tuple((0, n) for n in shape) for shape in shapes]
    losses = []
    for step in range(steps):
        optimizer.zero_grad(set_to_none=False)
        batch = source.local(step, regions)
        rows = spec.global_batch_size // micro_batches
        loss = 0.0
        for k in range(micro_batches):
            part = model(*(t[k * rows:(k + 1) * rows] for t in batch)) / micro_batches
            part.backward()
            loss += float(part.detach())
        optimizer.step()
        losses.append(loss)
    return losses, {k: v.detach().clone() for k, v in model.named_parameters()}
