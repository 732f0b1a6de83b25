"""The measuring that sits beside ``tensoropt run``'s loop: step time, memory accounting and peaks.

:class:`StepMeter` wraps each step of a :class:`~tensoropt.parallel.ParallelModel` loop
(``with meter.step(step, batch): ...``) and reads what it needs through the parallel model's step
hooks (:attr:`tensoropt.parallel.runtime.Runtime.step_hooks`), never from inside the loop:

* ``time_s``: the step's wall time (forward, backward, gradient synchronisation, optimizer step),
  the replayed program traced before the clock starts (:meth:`ParallelModel.trace`);
* ``memory_bytes``: parameters + gradients + optimizer state + the activations autograd saves in
  one step (the measured step runs through the DTensor interpreter: its saved tensors are the
  activations; the graph's shapes are fixed, so one step measures them);
* ``peak_bytes``: the process's peak above its level before the model was built
  (:class:`~tensoropt.executor.state.peak_memory.PeakMemory`);
* ``peak_tensor_bytes``: the most tensor storage alive at once in the measured step
  (:class:`~tensoropt.executor.state.tensor_peak.TensorPeak`), as every later step holds it: an
  optimizer state the measured step creates (AdamW's moments, made by the first ``optimizer.step()``)
  is alive through every later step's forward and backward, so it is added to the forward/backward
  peak (without it the first step's peak read up to the whole state low: 16.3 of 66.0 MiB on a
  width-256 GPT-2's data-parallel plan).

Each is the maximum over ranks in the :class:`RunResult`.

Example:
    >>> r = RunResult("d1-p0", 1, [{"step": 0, "loss": 1.0, "time_s": 0.2}, {"step": 1, "loss": 0.9,
    ...     "time_s": 0.1}, {"step": 2, "loss": 0.8, "time_s": 0.3}])
    >>> r.median_time_s
    0.2
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field

import torch

from tensoropt.executor.state.memory import SavedTensors, optimizer_state_tensors, storage_bytes, storage_keys
from tensoropt.executor.state.mesh import max_over_ranks, sync_device
from tensoropt.executor.state.peak_memory import PeakMemory
from tensoropt.executor.state.tensor_peak import TensorPeak


@dataclass
class RunResult:
    """What one rank measured while training one plan."""

    plan_id: str
    devices: int
    steps: list[dict] = field(default_factory=list)
    memory_bytes: int = 0
    params: dict[str, torch.Tensor] = field(default_factory=dict)
    peak_bytes: int = 0
    """Peak memory of the training loop above the level before the model was built, maximum over
    ranks (:mod:`tensoropt.executor.state.peak_memory`: CUDA allocator, or resident set on the CPU)."""
    peak_tensor_bytes: int = 0
    """The most bytes of tensor storage alive at once during the step measured for memory (the
    persistent state included), maximum over ranks (:mod:`tensoropt.executor.state.tensor_peak`): no
    allocator setting changes it."""

    @property
    def median_time_s(self) -> float:
        """Median step time, without the first step (it warms up) and the step measured for memory
        (it runs through the DTensor interpreter) where others are left.

        Example:
            >>> RunResult("p", 1, [{"step": 0, "time_s": 5.0}, {"step": 1, "time_s": 9.0,
            ...     "memory_step": True}, {"step": 2, "time_s": 1.0}]).median_time_s
            1.0
        """
        times = [s["time_s"] for s in self.steps]
        steady = [s["time_s"] for s in self.steps[1:] if not s.get("memory_step")]
        if steady:
            return statistics.median(steady)
        return statistics.median(times[1:] if len(times) > 2 else times) if times else 0.0


class StepMeter:
    """Times and measures the steps of a parallel model's loop (see the module docstring).

    Args:
        pm: the :class:`~tensoropt.parallel.ParallelModel` the loop trains.
        optimizer: the loop's optimizer (its state counts in the memory).
        memory_peak: a :class:`PeakMemory` made before the model was built (its baseline).

    Example:
        >>> meter = StepMeter(pm, optimizer, PeakMemory(device))  # doctest: +SKIP
        >>> with meter.step(0, batch, measure=True):  # doctest: +SKIP
        ...     loss = pm.train_step(batch); optimizer.step(); optimizer.zero_grad()
        >>> meter.log(0, loss)  # doctest: +SKIP
    """

    def __init__(self, pm, optimizer: torch.optim.Optimizer, memory_peak: PeakMemory):
        self.pm, self.optimizer, self.memory_peak = pm, optimizer, memory_peak
        self.runtime = pm.tensoropt_runtime
        self.grad_bytes = 0
        self.activation_bytes = 0
        self.peak_tensor_bytes = 0
        self.records: list[dict] = []
        self._time_s = 0.0
        self._measured = False
        self._backward_peak_bytes = 0

    def start(self) -> None:
        """The loop starts: reset the peak statistic and the records."""
        self.records, self.activation_bytes, self.peak_tensor_bytes = [], 0, 0
        self.memory_peak.start()

    @contextlib.contextmanager
    def step(self, step: int, batch, measure: bool = False):
        """Time the step run inside; ``measure``: also record its saved activations, gradients and
        tensor peak (through the DTensor interpreter, hooks on every saved tensor: once per run).
        ``batch``: the step's inputs, or a list of its micro-batches' (all but the last run under
        ``no_sync``, whose program is traced here too)."""
        rt = self.runtime
        self._measured = measure
        batches = batch if isinstance(batch, list) else [batch]
        if not measure:  # a new shape's programs are traced here, not on the clock
            for i, part in enumerate(batches):
                with self.pm.no_sync() if i < len(batches) - 1 else contextlib.nullcontext():
                    self.pm.trace(part)
        with contextlib.ExitStack() as stack:
            if measure:
                resident = self.resident_tensor_bytes() + storage_bytes(
                    t for part in batches for t in part.values() if isinstance(t, torch.Tensor))
                state_before = self.optimizer_state_bytes()
                peak = stack.enter_context(TensorPeak(resident))
                self._backward_peak_bytes = resident
                stack.enter_context(rt.interpreting())
                saved = stack.enter_context(SavedTensors())
                hook = self._hook(saved, peak)
                rt.step_hooks.append(hook)
                stack.callback(rt.step_hooks.remove, hook)
            sync_device()
            start = time.perf_counter()
            yield
            sync_device()
            self._time_s = time.perf_counter() - start
        if measure:
            created = max(self.optimizer_state_bytes() - state_before, 0)  # lazily made: alive from now on
            self.peak_tensor_bytes = max(peak.peak_bytes, self._backward_peak_bytes + created)

    def optimizer_state_bytes(self) -> int:
        """Local bytes of the optimizer's state tensors now (0 before its first step, for AdamW)."""
        return storage_bytes(optimizer_state_tensors(self.optimizer))

    def _hook(self, saved: SavedTensors, peak: TensorPeak):
        rt = self.runtime

        def hook(event: str, loss) -> None:
            if event == "forward":  # before backward frees them (and recompute saves more)
                exclude = storage_keys(rt.params.values())
                self.activation_bytes = max(self.activation_bytes, saved.bytes(exclude=exclude))
            elif event == "step":  # forward and backward done, the optimizer step next
                saved.storages.clear()  # the next micro-batch saves its own
                self._backward_peak_bytes = peak.peak_bytes
                grads = [p.grad for p in rt.params.values() if p.grad is not None] + rt.zero.gradients()
                self.grad_bytes = storage_bytes(grads)

        return hook

    def log(self, step: int, loss: torch.Tensor) -> dict:
        """Record the step just timed with its ``loss`` (read after the clock stopped); the step
        measured for memory is marked ``"memory_step": True``."""
        record = {"step": step, "loss": float(loss), "time_s": self._time_s}
        if self._measured:
            record["memory_step"] = True
        self.records.append(record)
        return record

    def state_bytes(self) -> int:
        """Local bytes of parameters + gradients + optimizer state on this rank."""
        return storage_bytes(self.runtime.params.values()) + self.grad_bytes + self.optimizer_state_bytes()

    def resident_tensor_bytes(self) -> int:
        """Local bytes of the tensors a step starts with: parameters (and the optimizer's shards of
        them), gradients still held, buffers, constants and optimizer state (each storage once)."""
        rt = self.runtime
        tensors = [*rt.params.values(), *rt.buffers.values(),
                   *(v for v in rt.constants.values() if isinstance(v, torch.Tensor)),
                   *(p for group in self.optimizer.param_groups for p in group["params"]),
                   *(p.grad for p in rt.params.values() if p.grad is not None),
                   *optimizer_state_tensors(self.optimizer)]
        return storage_bytes(tensors)

    def result(self) -> RunResult:
        """The run's :class:`RunResult` (collectives: call on every rank)."""
        peak_bytes = self.memory_peak.read()
        plan = self.runtime.plan
        return RunResult(plan.plan_id, plan.devices, list(self.records),
                         memory_bytes=max_over_ranks(self.state_bytes() + self.activation_bytes),
                         peak_bytes=max_over_ranks(peak_bytes),
                         peak_tensor_bytes=max_over_ranks(self.peak_tensor_bytes))
