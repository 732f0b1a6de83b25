"""A plan in your own training loop: :func:`parallelize`, :func:`micro_batches`, :func:`save_model`.

Example:
    >>> from tensoropt.parallel import micro_batches
    >>> len(micro_batches({"x": torch.zeros(4, 2)}, 2))
    2
"""

from __future__ import annotations

import os

import torch  # noqa: F401  (the doctest above)
import torch.distributed as dist

from tensoropt.parallel.batches import BatchError, micro_batches
from tensoropt.parallel.model import ParallelModel, parallelize
from tensoropt.parallel.optim import ForeignParameters
from tensoropt.parallel.save import SaveError, export_checkpoint, save_model


def init_distributed() -> tuple[int, int]:
    """Join the process group torchrun describes (gloo on CPUs, nccl on GPUs, with the collective
    timeout ``TENSOROPT_COLLECTIVE_TIMEOUT_S``, 120 s by default); returns ``(rank, world_size)``.
    Without torchrun (no ``WORLD_SIZE``) or when a group exists already, nothing is started.

    Example:
        >>> init_distributed()  # one plain process
        (0, 1)
    """
    if not dist.is_initialized() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from tensoropt.executor.state.worker import init_process_group

        init_process_group()
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


__all__ = ["BatchError", "ForeignParameters", "ParallelModel", "SaveError", "export_checkpoint",
           "init_distributed", "micro_batches", "parallelize", "save_model"]
