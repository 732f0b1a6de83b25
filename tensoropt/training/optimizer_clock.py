"""The optimizer's part of a training step as the user's loop runs it, on the thread's CPU clock.

A step of ``tensoropt run`` (:meth:`tensoropt.training.trainer.Trainer._update`) is
``pm.train_step(batch); optimizer.step(); optimizer.zero_grad(set_to_none=True)``. Besides the
replayed program (forward, backward, the gradients' collectives), it spends host time on every
parameter tensor, each step, which the cost model prices as the optimizer step
(:func:`estimators.compute.optimizer_time_s`, ``optimizer_bandwidth_gbps`` and
``optimizer_tensor_s``):

* ``gradients_s``: the replayed step outside its program
  (:meth:`tensoropt.parallel.runtime.Runtime._replay`): the parameters' local tensors handed to the
  program, its gradient outputs wrapped into DTensors and added to (or set as) the parameters' ``.grad``
  (not the batch's inputs made DTensors, nor the loss read after the step: once a step, not per tensor);
* ``step_s``: ``optimizer.step()`` with tensoropt's hooks (:mod:`tensoropt.parallel.optim`: the
  gradients hidden from and given back to torch's own step, which then loops over its parameters
  and finds nothing to do), of which ``kernels_s`` is
  :func:`~tensoropt.executor.state.local_optim.step_local` (the state lookups and torch's fused kernel);
* ``zero_grad_s``: ``optimizer.zero_grad(set_to_none=True)``.

``optimizer_s`` is their sum: what the priced optimizer term stands for. Each is the main thread's
CPU time (``time.thread_time``: the time the host gave other processes is left out, as the
profiled compute is timed, :mod:`estimators.profiled`). :class:`OptimizerClock` reads them by
wrapping those calls of one :class:`~tensoropt.training.trainer.Trainer` while it is open
(``tests/estimators/test_optimizer_time.py``, ``benchmarks/optimizer_step.py``,
``benchmarks/fidelity.py --node-clock``).

Example:
    >>> with OptimizerClock(trainer) as clock:  # a replaying Trainer  # doctest: +SKIP
    ...     for i in range(5):
    ...         trainer.step(10 + i, measure_memory=False)
    >>> clock.median("optimizer_s")  # needs the steps above  # doctest: +SKIP
    0.0031
"""

from __future__ import annotations

import statistics
import time

PARTS = ("gradients_s", "step_s", "kernels_s", "zero_grad_s", "program_s")
"""What :class:`OptimizerClock` records per step (``program_s``: the replayed program's calls)."""


class OptimizerClock:
    """Records, per step of ``trainer`` while open, the thread-CPU seconds of :data:`PARTS` (see the
    module docstring); steps that ran through the DTensor interpreter (a ``train()`` call's first,
    measured step) or traced a program are left out.

    Args:
        trainer: a :class:`~tensoropt.training.trainer.Trainer` in ``replay`` mode whose program is
            traced (one step run).

    Example:
        >>> with OptimizerClock(trainer) as clock:  # needs a replaying Trainer  # doctest: +SKIP
        ...     trainer.step(5, measure_memory=False)
        >>> sorted(clock.steps[0])  # needs the steps above  # doctest: +SKIP
        ['gradients_s', 'kernels_s', 'optimizer_s', 'program_s', 'step_s', 'zero_grad_s']
    """

    def __init__(self, trainer):
        self.trainer = trainer
        self.steps: list[dict[str, float]] = []
        """Per recorded step: each of :data:`PARTS` and ``optimizer_s`` (gradients + step + zero_grad)."""
        self._open: dict[str, float] = {}
        self._replayed = self._traced = False

    def __enter__(self) -> OptimizerClock:
        import tensoropt.parallel.optim as optim_hooks

        runtime, optimizer = self.trainer.runtime, self.trainer.optimizer
        replay, step, zero_grad = runtime._replay, optimizer.step, optimizer.zero_grad
        kernels = optim_hooks.step_local
        self._restore = (optim_hooks, kernels)

        def add(part: str, seconds: float) -> None:
            self._open[part] = self._open.get(part, 0.0) + seconds

        def timed(fn, part: str, then=None):
            def call(*args, **kwargs):
                t0 = time.thread_time()
                try:
                    return fn(*args, **kwargs)
                finally:
                    add(part, time.thread_time() - t0)
                    if then is not None:
                        then()
            return call

        def timed_replay(graph, values, scale, sync):
            program = graph.program
            build = program.program

            def timed_program(*args, **kwargs):
                lowered, call = build(*args, **kwargs)
                return lowered, timed(call, "program_s")

            program.program = timed_program
            t0, before, traces = time.thread_time(), self._open.get("program_s", 0.0), program.traces
            try:
                return replay(graph, values, scale, sync)
            finally:
                del program.program
                self._replayed = True
                self._traced |= program.traces != traces  # traced in this step: not a steady step
                inside = self._open.get("program_s", 0.0) - before
                add("gradients_s", time.thread_time() - t0 - inside)

        runtime._replay = timed_replay
        optimizer.step = timed(step, "step_s")
        optimizer.zero_grad = timed(zero_grad, "zero_grad_s", then=self._close)  # a step ends there
        optim_hooks.step_local = timed(kernels, "kernels_s")
        return self

    def _close(self) -> None:
        """One step ends at its ``zero_grad``: keep its parts if it replayed its program, traced before."""
        parts, steady = self._open, self._replayed and not self._traced
        self._open, self._replayed, self._traced = {}, False, False
        if not steady:
            return
        row = {p: parts.get(p, 0.0) for p in PARTS}
        row["optimizer_s"] = row["gradients_s"] + row["step_s"] + row["zero_grad_s"]
        self.steps.append(row)

    def __exit__(self, *exc) -> None:
        optim_hooks, kernels = self._restore
        optim_hooks.step_local = kernels
        for obj, names in ((self.trainer.runtime, ("_replay",)),
                           (self.trainer.optimizer, ("step", "zero_grad"))):
            for name in names:
                obj.__dict__.pop(name, None)

    def median(self, part: str) -> float:
        """The median over the recorded steps of ``part`` (one of :data:`PARTS` or ``optimizer_s``).

        Example:
            >>> clock = OptimizerClock(None)
            >>> clock.steps = [{"step_s": 0.002}, {"step_s": 0.004}, {"step_s": 0.003}]
            >>> clock.median("step_s")
            0.003
        """
        if not self.steps:
            raise ValueError("OptimizerClock: no replayed step was recorded (run steps of a replaying "
                             "Trainer with measure_memory=False while the clock is open)")
        return statistics.median(s[part] for s in self.steps)
