"""The tensor peak of one pipelined step on this rank, and what its stage holds between steps.

A stage's memory is measured as the executor's is (:mod:`tensoropt.executor.state.tensor_peak`):
the most bytes of tensor storage alive at once during one step, whatever the allocator keeps. What
a step starts with (``resident``: parameters, gradients, the optimizer's moments, the receive
buffers torch's ``PipelineStage`` allocated once per micro-batch on the first step and keeps) is
read by walking every live tensor (:func:`live_tensor_bytes`), so nothing the runtime holds is
left out by an incomplete list; :func:`stage_resident_parts` names the parts of it.

Example:
    >>> import torch
    >>> keep = torch.ones(1024)
    >>> with StepPeak() as peak:
    ...     a = keep * 2                  # 4 KiB on top of what was alive
    >>> peak.peak_bytes - peak.resident_bytes
    4096
"""

from __future__ import annotations

import gc

import torch

from tensoropt.executor.state.memory import optimizer_state_tensors, storage_bytes
from tensoropt.executor.state.tensor_peak import TensorPeak


def live_tensor_bytes() -> int:
    """Bytes of every storage a live CPU or CUDA tensor holds now (each storage once; meta and
    fake tensors have none).

    Example:
        >>> import torch
        >>> before = live_tensor_bytes()
        >>> x = torch.zeros(256)
        >>> live_tensor_bytes() - before
        1024
    """
    tensors = []
    for obj in gc.get_objects():
        if type(obj) in (torch.Tensor, torch.nn.Parameter) and not obj.is_meta:
            tensors.append(obj)
    return storage_bytes(tensors)


class StepPeak(TensorPeak):
    """:class:`TensorPeak` started at :func:`live_tensor_bytes` (see the module docstring).

    Args:
        trace: keep the live set at the peak (:attr:`TensorPeak.peak_live`), each storage labelled
            with the phase it was made in and, in backward, its autograd node (slower: a copy of the
            live set at each new peak; ``benchmarks/pipeline_memory.py --trace``).

    Attributes:
        resident_bytes: what was alive when the step started.
        phase: a label the caller sets as the step goes (``"F3"``: the forward of micro-batch 3);
            ``peak_phase`` is its value when the peak was reached.

    Example:
        >>> keep = torch.ones(1024)
        >>> with StepPeak(trace=True) as peak:
        ...     peak.phase = "B0"
        ...     a = keep * 2
        >>> [(nbytes, label) for nbytes, _, _, label, _ in peak.peak_live]
        [(4096, 'B0')]
    """

    def __init__(self, trace: bool = False):
        self.resident_bytes = live_tensor_bytes()
        super().__init__(baseline_bytes=self.resident_bytes, trace=trace)
        self.phase = ""
        self.peak_phase = ""
        self.where = lambda: self.phase

    def _add(self, storage: torch.UntypedStorage, func=None, t: torch.Tensor | None = None) -> None:
        before = self.peak_bytes
        super()._add(storage, func, t)
        if self.peak_bytes > before:
            self.peak_phase = self.phase


PHASE_PREFIX = "phase "
"""What :class:`AllocationPeak` reads as a phase label: a ``torch.profiler.record_function`` range
named ``"phase F3"`` (the forward of micro-batch 3)."""


class AllocationPeak:
    """The most tensor bytes alive at once in a block, read from the CPU allocator's events
    (``torch.profiler`` with ``profile_memory``): every allocation counts, those a compiled
    program makes in its own code too (Inductor's buffers, which no dispatch mode such as
    :class:`StepPeak` sees), and so do an operator's internal scratch buffers.

    ``peak_bytes`` is :func:`live_tensor_bytes` at the start (``resident_bytes``) plus the largest
    running sum of the block's allocations minus their frees. A storage made before the block and
    freed in it is not subtracted (the allocator's profiler knows no size for it), so where the
    block frees earlier tensors this is an upper bound. ``peak_phase``: the innermost
    ``record_function("phase ...")`` range around the peak (:data:`PHASE_PREFIX`), "" if none.

    Example:
        >>> keep = torch.ones(1024)
        >>> with AllocationPeak() as peak:
        ...     a = keep * 2                  # 4 KiB
        ...     del a
        ...     with torch.profiler.record_function("phase B0"):
        ...         b = torch.ones(2048)      # 8 KiB: the peak
        >>> peak.peak_bytes - peak.resident_bytes, peak.peak_phase
        (8192, 'B0')
    """

    def __enter__(self) -> AllocationPeak:
        self.resident_bytes = live_tensor_bytes()
        self.peak_bytes = self.resident_bytes
        self.peak_phase = ""
        self._profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                               profile_memory=True)
        self._profile.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._profile.__exit__(*exc)
        events = self._profile.profiler.kineto_results.events()
        changes = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
        running = top = 0
        when = None
        for t, n in changes:
            running += n
            if running > top:
                top, when = running, t
        self.peak_bytes = self.resident_bytes + top
        if when is not None:
            ranges = [(e.end_ns() - e.start_ns(), e.name()[len(PHASE_PREFIX):]) for e in events
                      if e.name().startswith(PHASE_PREFIX) and e.start_ns() <= when <= e.end_ns()]
            self.peak_phase = min(ranges)[1] if ranges else ""


def stage_resident_parts(module: torch.nn.Module, optimizer: torch.optim.Optimizer, stage) -> dict[str, int]:
    """What a pipeline rank holds between steps, by part: ``param_bytes``, ``grad_bytes``,
    ``optimizer_bytes``, and ``recv_buffer_bytes`` (the activations and gradients ``stage``, a
    ``PipelineStage``, receives into: one buffer per micro-batch each, kept across steps).

    Example:
        >>> lin = torch.nn.Linear(4, 4)
        >>> opt = torch.optim.SGD(lin.parameters(), lr=0.1)
        >>> stage_resident_parts(lin, opt, None)["param_bytes"]
        80
    """
    params = list(module.parameters())
    buffers = []
    if stage is not None:
        for infos in [*stage.args_recv_info.values(), *stage.grad_recv_info.values()]:
            for info in infos:
                if getattr(info, "buffer", None) is not None and isinstance(info.buffer, torch.Tensor):
                    buffers.append(info.buffer)
    return {
        "param_bytes": storage_bytes(params),
        "grad_bytes": storage_bytes(p.grad for p in params if p.grad is not None),
        "optimizer_bytes": storage_bytes(optimizer_state_tensors(optimizer)),
        "recv_buffer_bytes": storage_bytes(buffers),
    }
