"""Measured memory per device: parameters, gradients, optimizer state, saved activations.

Everything counts unique *local* storages (a DTensor counts its local shard), so a tensor
saved by two operators, or a view saved beside its base, is counted once.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor


def local(t: torch.Tensor) -> torch.Tensor:
    """The local tensor of a DTensor (the tensor itself otherwise)."""
    return t._local_tensor if isinstance(t, DTensor) else t


def _key(t: torch.Tensor) -> tuple:
    st = local(t).untyped_storage()
    return (st.device.type, st.data_ptr())


def storage_bytes(tensors: Iterable[torch.Tensor], exclude: set | None = None) -> int:
    """Bytes of the unique storages behind ``tensors`` (minus storages in ``exclude``).

    Example:
        >>> a = torch.zeros(4)
        >>> storage_bytes([a, a[:2], torch.zeros(2)])
        24
    """
    seen = dict()
    for t in tensors:
        k = _key(t)
        if exclude and k in exclude:
            continue
        seen[k] = local(t).untyped_storage().nbytes()
    return sum(seen.values())


def storage_keys(tensors: Iterable[torch.Tensor]) -> set:
    """Storage identities of ``tensors`` (for :func:`storage_bytes`'s ``exclude``)."""
    return {_key(t) for t in tensors}


class SavedTensors:
    """Context manager that records the storages autograd saves for backward (no references kept).

    Example:
        >>> w = torch.ones(3, requires_grad=True)
        >>> with SavedTensors() as saved:
        ...     y = (w * torch.full((3,), 2.0)).sum()
        >>> saved.bytes(exclude=storage_keys([w]))
        12
    """

    def __init__(self):
        self.storages: dict[tuple, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self.storages[_key(t)] = local(t).untyped_storage().nbytes()
        return t

    def bytes(self, exclude: set | None = None) -> int:
        """Bytes of the unique saved storages not in ``exclude``."""
        return sum(n for k, n in self.storages.items() if not exclude or k not in exclude)

    def __enter__(self) -> SavedTensors:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


def optimizer_state_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor in an optimizer's state (momentum buffers, Adam moments; not step counts).

    Example:
        >>> optimizer_state_tensors(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1))
        []
    """
    out = []
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                out.append(v)
    return out
