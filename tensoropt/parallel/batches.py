"""Batches as a user's loop has them: a mapping of the job's input names to tensors.

:func:`micro_batches` splits a batch for gradient accumulation; :func:`local_inputs` checks a
batch against the step's graph (every input there, one batch size, the per-sample shapes the
plan was made for) and cuts this rank's region of each input out of a global batch.

Example:
    >>> batch = {"input_ids": torch.arange(8).reshape(4, 2), "labels": torch.arange(4)}
    >>> [mb["labels"].tolist() for mb in micro_batches(batch, 2)]
    [[0, 1], [2, 3]]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from tensoropt.executor.job.data import narrow


class BatchError(ValueError):
    """A batch does not fit the parallel model's inputs; the message names the input and the fix."""


def micro_batches(batch, n: int) -> list:
    """Split ``batch`` (a mapping of names to tensors, or a tuple of tensors) into ``n`` equal
    micro-batches along dim 0, for gradient accumulation (``train_step(mb, loss_scale=1 / n)``).

    Raises:
        BatchError: ``n`` < 1, or the batch's rows do not divide by ``n``.

    Example:
        >>> [t.tolist() for (t,) in micro_batches((torch.arange(4),), 2)]
        [[0, 1], [2, 3]]
        >>> try:
        ...     micro_batches({"x": torch.zeros(3, 2)}, 2)
        ... except BatchError as e:
        ...     print(str(e)[:64])
        micro_batches: the batch has 3 rows, which do not split into 2 e
    """
    if int(n) < 1:
        raise BatchError(f"micro_batches: n must be >= 1, got {n}")
    names, tensors = _items(batch)
    rows = _rows(names, tensors)
    if rows % n:
        raise BatchError(f"micro_batches: the batch has {rows} rows, which do not split into {n} equal "
                         f"micro-batches; use a batch size that is a multiple of {n}")
    size = rows // n
    parts = [[t.narrow(0, i * size, size) for t in tensors] for i in range(n)]
    if names is None:
        return [tuple(p) for p in parts]
    return [dict(zip(names, p)) for p in parts]


def _items(batch) -> tuple[list[str] | None, list[torch.Tensor]]:
    if isinstance(batch, Mapping):
        return list(batch), list(batch.values())
    if isinstance(batch, torch.Tensor):
        return None, [batch]
    if isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        return None, list(batch)
    raise BatchError(f"batch: a mapping of input names to tensors (or a tuple of tensors), not "
                     f"{type(batch).__name__}")


def _rows(names, tensors) -> int:
    rows = None
    for i, t in enumerate(tensors):
        label = names[i] if names is not None else f"#{i}"
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            raise BatchError(f"batch input {label!r}: expected a tensor with a batch dim, got "
                             f"{type(t).__name__}{'' if not isinstance(t, torch.Tensor) else ' scalar'}")
        if rows is None:
            rows = int(t.shape[0])
        elif int(t.shape[0]) != rows:
            first = names[0] if names is not None else "#0"
            raise BatchError(f"batch input {label!r} has {int(t.shape[0])} rows but {first!r} has "
                             f"{rows}; every input of a batch needs the same batch size")
    if rows is None:
        raise BatchError("batch: no input tensors")
    return rows


def ordered_inputs(batch, names: Sequence[str]) -> list[torch.Tensor]:
    """The batch's tensors in the step's input order (``names``), checked to be all there.

    Example:
        >>> [t.tolist() for t in ordered_inputs({"y": torch.ones(1), "x": torch.zeros(1)}, ["x", "y"])]
        [[0.0], [1.0]]
        >>> try:
        ...     ordered_inputs({"x": torch.zeros(1)}, ["x", "y"])
        ... except BatchError as e:
        ...     print(e)
        batch: missing input 'y' (the step takes 'x', 'y'); give every input by name
    """
    keys, tensors = _items(batch)
    if keys is None:
        if len(tensors) != len(names):
            raise BatchError(f"batch: {len(tensors)} tensors, but the step takes {len(names)} inputs "
                             f"({', '.join(map(repr, names))}); pass a mapping of those names to tensors")
        return tensors
    given = dict(zip(keys, tensors))
    for name in names:
        if name not in given:
            raise BatchError(f"batch: missing input {name!r} (the step takes {', '.join(map(repr, names))}); "
                             "give every input by name")
    extra = [k for k in given if k not in names]
    if extra:
        raise BatchError(f"batch: unknown input {extra[0]!r} (the step takes {', '.join(map(repr, names))})")
    return [given[name] for name in names]


def batch_rows(tensors: list[torch.Tensor], names: Sequence[str]) -> int:
    """The batch size of the tensors (checked to agree).

    Example:
        >>> batch_rows([torch.zeros(3, 2), torch.zeros(3)], ["x", "y"])
        3
    """
    return _rows(list(names), tensors)


def check_samples(tensors: list[torch.Tensor], names: Sequence[str], shapes: Sequence[tuple],
                  dtypes: Sequence[torch.dtype]) -> None:
    """Each input's per-sample shape (all but dim 0) and kind (integer or floating) as the plan's.

    Example:
        >>> try:
        ...     check_samples([torch.zeros(2, 5)], ["x"], [(8, 4)], [torch.float32])
        ... except BatchError as e:
        ...     print(str(e)[:60])
        batch input 'x': samples of shape [5], the plan's are [4]; t
    """
    for t, name, shape, dtype in zip(tensors, names, shapes, dtypes):
        if tuple(t.shape[1:]) != tuple(shape[1:]):
            raise BatchError(f"batch input {name!r}: samples of shape {list(t.shape[1:])}, the plan's "
                             f"are {list(shape[1:])}; the plan was made for those (re-plan for others)")
        if t.is_floating_point() != dtype.is_floating_point:
            given, wanted = (str(d).removeprefix("torch.") for d in (t.dtype, dtype))
            raise BatchError(f"batch input {name!r}: dtype {given}, the plan's is {wanted}")


def cut_regions(tensors: list[torch.Tensor], regions: Sequence, dtypes: Sequence[torch.dtype],
                device: torch.device, whole: bool) -> list[torch.Tensor]:
    """This rank's region of each input (``whole``: the tensors are the global batch; else they are
    already this rank's rows), on ``device``, floating inputs in the graph's dtype. A tensor of
    exactly its region's shape is that region already (a loader that read only it).

    Example:
        >>> cut_regions([torch.arange(4)], [((2, 2),)], [torch.int64], torch.device("cpu"), True)
        [tensor([2, 3])]
        >>> cut_regions([torch.arange(2)], [((2, 2),)], [torch.int64], torch.device("cpu"), False)
        [tensor([0, 1])]
    """
    out = []
    for t, region, dtype in zip(tensors, regions, dtypes):
        if tuple(t.shape) == tuple(length for _, length in region):
            local = t
        else:
            local = narrow(t, region) if whole else narrow(t, ((0, t.shape[0]), *region[1:]))
        local = local.to(device, dtype) if local.is_floating_point() else local.to(device)
        out.append(local.contiguous())
    return out
