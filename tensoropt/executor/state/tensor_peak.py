"""The high-water mark of live tensor bytes during a step: a peak no allocator setting changes.

``measured.peak_bytes`` on the CPU is the process's resident set
(:mod:`tensoropt.executor.state.peak_memory`):
what the process really costs, but it moves with glibc's settings (what ``malloc`` keeps of freed
memory) and counts code, Python objects and gloo's buffers. ``measured.peak_tensor_bytes`` is the
CPU counterpart of CUDA's ``max_memory_allocated``: the most bytes of tensor storage alive at once.

:class:`TensorPeak` is a ``TorchDispatchMode``: every operator's output whose storage is new (not
one of its inputs', so views and in-place results are not counted again; a plain tensor's, not a fake
one's) adds its storage's bytes,
and a ``weakref.finalize`` on that storage takes them away when it is freed. DTensor operators are
handed on to DTensor (``NotImplemented``), whose local operators (redistribution buffers included)
then come back through the mode. What existed before the mode started (parameters, buffers,
optimizer state) is the caller's ``baseline_bytes``. The trainer measures one step with it, the
first (which the median step time leaves out): a Python call per operator is not on the timed steps.

Example:
    >>> import torch
    >>> with TensorPeak(baseline_bytes=0) as peak:
    ...     a = torch.ones(1024)          # 4 KiB
    ...     b = a * 2                     # 4 KiB more: 8 KiB alive
    ...     del a
    ...     c = b.view(32, 32) + 1        # the view is b's storage; the sum 4 KiB: 8 KiB again
    >>> peak.peak_bytes, peak.live_bytes
    (8192, 8192)
"""

from __future__ import annotations

import weakref

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_PLAIN = (torch.Tensor, torch.nn.Parameter)
"""Tensors with storage of their own: a subclass (DTensor's fake arguments of sharding propagation,
which it keeps in a cache) has none, or counts through its local tensor."""


class TensorPeak(TorchDispatchMode):
    """Live tensor storage bytes while active and their high-water mark (see the module doc).

    Attributes:
        live_bytes: bytes of storage alive now: ``baseline_bytes`` plus what operators made since
            the mode started and is not freed yet.
        peak_bytes: the largest ``live_bytes`` seen.
    """

    def __init__(self, baseline_bytes: int = 0, trace: bool = False):
        super().__init__()
        self.live_bytes = int(baseline_bytes)
        self.peak_bytes = int(baseline_bytes)
        self._sizes: dict[int, int] = {}
        self.trace = trace
        """Keep what made each live storage and the live set at the peak (:attr:`peak_live`)."""
        self.where = None
        """With ``trace``: a callable returning a label for the storages made now (the interpreter's
        current node; the autograd node in backward is added by itself)."""
        self._made: dict[int, tuple] = {}
        self.peak_live: list[tuple] = []
        """With ``trace``: ``(bytes, op, shape, label, data_ptr)`` of every storage alive at the peak
        (those made while the mode was active), largest first."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # DTensor's own local operators come back through this mode
        out = func(*args, **kwargs)
        inputs = {_storage_key(a) for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
        for t in tree_leaves(out):
            if type(t) in _PLAIN and not t.is_meta and _storage_key(t) not in inputs:
                self._add(t.untyped_storage(), func, t)
        return out

    def _add(self, storage: torch.UntypedStorage, func=None, t: torch.Tensor | None = None) -> None:
        key = storage._cdata
        if key in self._sizes:
            return
        nbytes = storage.nbytes()
        self._sizes[key] = nbytes
        self.live_bytes += nbytes
        if self.trace:
            self._made[key] = (nbytes, str(func), tuple(t.shape) if t is not None else (), self._label(),
                               storage.data_ptr())
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes
            if self.trace:
                self.peak_live = sorted(self._made.values(), key=lambda r: -r[0])
        weakref.finalize(storage, self._free, key)

    def _label(self) -> str:
        node = torch._C._current_autograd_node()
        where = self.where() if self.where is not None else ""
        return f"{where} backward {node.name()}" if node is not None else where

    def _free(self, key: int) -> None:
        self.live_bytes -= self._sizes.pop(key, 0)
        self._made.pop(key, None)


def live_set_table(rows: list[tuple], top: int = 25) -> str:
    """A text table of a :attr:`TensorPeak.peak_live` list: total, then the largest storages.

    Example:
        >>> print(live_set_table([(2048, "aten.mm.default", (16, 32), "mm_1"), (1024, "aten.t", (8,), "t")]))
        live at the peak: 0.00 MiB in 2 storages
              2048 B  aten.mm.default  (16, 32)  mm_1
              1024 B  aten.t  (8,)  t
    """
    total = sum(r[0] for r in rows)
    lines = [f"live at the peak: {total / 2**20:.2f} MiB in {len(rows)} storages"]
    for nbytes, op, shape, label, *_ in rows[:top]:
        lines.append(f"{nbytes:>10} B  {op}  {shape}  {label}")
    return "\n".join(lines)


def _storage_key(t: torch.Tensor) -> int:
    """The identity of ``t``'s storage (the local tensor's for a DTensor)."""
    if isinstance(t, DTensor):
        t = t._local_tensor
    return t.untyped_storage()._cdata
