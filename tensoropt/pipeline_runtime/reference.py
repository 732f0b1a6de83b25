"""The one-process reference of a pipelined run: the whole model, the whole batch, the same optimizer.

Example:
    >>> from tensoropt.executor.data import InputSpec
    >>> from tensoropt.executor.spec import TrainSpec
    >>> spec = TrainSpec("torch.nn:Linear", (InputSpec((2,)),), 4, {"in_features": 2, "out_features": 1})
    >>> losses, params = reference_run(spec, 0)
    >>> losses, sorted(params)
    ([], ['bias', 'weight'])
"""

from __future__ import annotations

import torch


def reference_run(spec, steps: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Train ``spec``'s model for ``steps`` steps on one process, eagerly (the initial weights
    and batches every plan gets); the loss per step and the final parameters by name.

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
        loss = model(*source.local(step, regions))
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().clone() for k, v in model.named_parameters()}
