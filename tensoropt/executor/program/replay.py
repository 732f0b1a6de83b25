"""The replayed local program of a plan: traced once per input shapes, run every step on local tensors.

:class:`ReplayProgram` keeps one :class:`~tensoropt.executor.program.lowering.LoweredStep` per tuple of
input shapes (a batch of another shape is traced again: graphs are shape-specialised), simplified
(:func:`~tensoropt.executor.program.graph_simplify.simplify`: constants folded, re-labelling nodes dropped),
optionally compiled with Inductor (``executor.compile: inductor``). Each :meth:`ReplayProgram.run` feeds the
parameters' and the batch's local tensors to the program and hands the gradients back to the
parameters (wrapped as DTensors of their placements, no dispatch) and the ZeRO-2 gradient shards
to their shard parameters; the trainer then steps the optimizer on local tensors
(:func:`~tensoropt.executor.state.local_optim.step_local`).

Example:
    >>> program = ReplayProgram(trainer)  # needs a Trainer on a process group  # doctest: +SKIP
    >>> loss = program.run(trainer._placeholder_values(trainer.batch(1)))  # doctest: +SKIP
"""

from __future__ import annotations

import shutil
from collections.abc import Callable

import torch
from torch.distributed.tensor import DTensor

from tensoropt.config import COMPILE_BACKENDS
from tensoropt.config import EXECUTOR_MODES as MODES
from tensoropt.executor.ops.gloo_gathers import plain_gathers
from tensoropt.executor.program.direct_calls import direct_calls
from tensoropt.executor.program.graph_simplify import simplify
from tensoropt.executor.program.lowering import LoweredStep, lower_step, overlapped_nodes

DIRECT_CALLS = False
"""Whether the replayed program calls aten operators through their Python bindings
(:func:`~tensoropt.executor.program.direct_calls.direct_calls`). Off: it saved ~50 us a step on the
CNN (within a launch's noise, docs/results.md `cnnfast`) and raised the tiny HF Llama's resident peak
on one process from ~20.5 to ~30.2 MiB (tests/executor/test_peak_memory.py, 2026-11-28 23:30 UTC),
which the memory model does not price."""

__all__ = ["COMPILE_BACKENDS", "MODES", "CompileUnavailable", "ReplayProgram", "check_compile_backend"]


class CompileUnavailable(RuntimeError):
    """The compile backend a job asks for cannot run here."""


def check_compile_backend(backend: str, device: str = "cpu") -> None:
    """Raise :class:`CompileUnavailable` (or ValueError) when ``backend`` cannot compile here.

    Inductor on a CPU needs a C++ compiler on the PATH (``$CXX``, ``g++``, ``c++`` or ``clang++``).

    Example:
        >>> check_compile_backend("none")
        >>> check_compile_backend("tvm")
        Traceback (most recent call last):
        ...
        ValueError: executor.compile: 'tvm' is not one of ('none', 'inductor')
    """
    if backend not in COMPILE_BACKENDS:
        raise ValueError(f"executor.compile: {backend!r} is not one of {COMPILE_BACKENDS}")
    if backend == "none":
        return
    try:
        import torch._inductor.config  # noqa: F401
    except Exception as err:  # noqa: BLE001 - any import failure means no Inductor
        raise CompileUnavailable(f"executor.compile: inductor cannot be imported ({err}); "
                                 "use executor.compile: none") from err
    if device == "cpu":
        import os

        candidates = [os.environ.get("CXX", ""), "g++", "c++", "clang++"]
        if not any(c and shutil.which(c) for c in candidates):
            raise CompileUnavailable("executor.compile: inductor on a CPU needs a C++ compiler (g++, c++ or "
                                     "clang++ on the PATH, or $CXX); install one or use "
                                     "executor.compile: none")


class ReplayProgram:
    """A trainer's step as local programs, one per input shapes.

    Args:
        trainer: the rank's :class:`~tensoropt.training.trainer.Trainer`.
        compile: ``"none"`` or ``"inductor"`` (:data:`COMPILE_BACKENDS`).

    Example:
        >>> # not run here: needs a Trainer on a process group
        >>> program = ReplayProgram(trainer, compile="none")  # doctest: +SKIP
    """

    def __init__(self, trainer, compile: str = "none"):
        check_compile_backend(compile)
        self.trainer = trainer
        self.compile = compile
        self.programs: dict[tuple, tuple[LoweredStep, Callable]] = {}
        self.traces = 0

    def _key(self, values: list) -> tuple:
        return tuple(tuple(v.shape) if isinstance(v, torch.Tensor) else None for v in values)

    def program(self, values: list, sync_grads: bool = True) -> tuple[LoweredStep, Callable]:
        """The (traced step, callable) for these placeholder values' shapes, tracing it the first time.

        ``sync_grads=False``: the program that leaves gradients unsynchronised (partial sums), for
        micro-batches accumulated under ``no_sync`` (:func:`~tensoropt.executor.program.lowering.lower_step`).

        Example:
            >>> lowered, run = program.program(values)  # needs a Trainer on a process group  # doctest: +SKIP
        """
        key = self._key(values) + (() if sync_grads else ("no_sync",))
        entry = self.programs.get(key)
        if entry is None:
            lowered = lower_step(self.trainer, values, reinplace=self.compile == "none",
                                 sync_grads=sync_grads)
            simplify(lowered.gm)
            self.traces += 1
            call = plain_gathers(lowered.gm)  # on the CPU: gloo's coalesced all-gather corrupts the heap
            if self.compile == "inductor":
                call = torch.compile(lowered.gm, backend="inductor", fullgraph=True, dynamic=False)
            elif DIRECT_CALLS:  # aten operators through their Python bindings where that is the same call
                call = direct_calls(call)
            entry = self.programs[key] = (lowered, call)
        return entry

    def stats(self) -> dict:
        """``traces`` (programs traced so far), and of the newest program its ``nodes`` (ops, waits
        included), ``traced_nodes`` (as traced, before simplification), ``collectives`` and
        ``overlapped_nodes`` (ops run while a collective is in flight).

        Example:
            >>> program.stats()  # needs a Trainer on a process group  # doctest: +SKIP
            {'traces': 1, 'nodes': 212, 'collectives': 3}
        """
        out = {"traces": self.traces}
        if self.programs:
            lowered = list(self.programs.values())[-1][0]
            out["nodes"] = sum(1 for n in lowered.gm.graph.nodes if n.op == "call_function")
            out["traced_nodes"] = lowered.traced_nodes  # before the passes: the unit of its memory
            out["collectives"] = lowered.collectives()
            out["overlapped_nodes"] = overlapped_nodes(lowered.gm)
        return out

    @torch.no_grad()
    def run(self, values: list) -> torch.Tensor:
        """Run one step's forward, backward and gradient synchronisation; set the gradients.

        Returns the loss: this rank's local value (a DTensor of the loss's placements when there
        is a mesh; read it with ``full_tensor()`` after the step).

        Example:
            >>> loss = program.run(values)  # needs a Trainer on a process group  # doctest: +SKIP
        """
        trainer = self.trainer
        lowered, call = self.program(values)
        out = call(*lowered.flat_inputs(trainer.params, values, trainer.interpreter.global_inputs))
        params = trainer.params
        i = 1
        for key in lowered.grad_keys:
            p = params[key]
            p.grad = DTensor(out[i], p._spec, requires_grad=False) if isinstance(p, DTensor) else out[i]
            i += 1
        for key in lowered.shard_grad_keys:
            shard = trainer.zero.sharded[key].shard
            shard.grad = DTensor(out[i], shard._spec, requires_grad=False)
            i += 1
        if lowered.loss_spec is None:
            return out[0]
        return DTensor(out[0], lowered.loss_spec, requires_grad=False)
