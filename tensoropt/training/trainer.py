"""``tensoropt run``'s measuring loop: one plan trained through :mod:`tensoropt.parallel`, measured.

The loop is a user of the public API, as a torchtitan ``train.py`` is of FSDP2::

    pm = parallelize_spec(spec, plan)                      # tensoropt.parallelize for a TrainSpec
    optimizer = spec.make_optimizer(pm.parameters())
    for step in range(start, start + steps):
        batch = self.batch(step)                           # this rank's region of the global batch
        with meter.step(step, batch, measure=step == start):
            loss = pm.train_step(batch)                    # forward, loss, backward, gradient sync
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        meter.log(step, loss)

and the measuring (:class:`~tensoropt.training.measure.StepMeter`: step time, memory accounting,
peaks) sits beside it. :class:`Trainer` holds what the loop trains, and shows the parallel model's
parts (its interpreter, replayed program, parameters) to the tools that look inside.

Example:
    >>> # not run here: needs a process group (or one process) and a plan
    >>> result = Trainer(spec, plan).train(steps=3)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib

import torch
from torch.distributed.tensor import DTensor

from tensoropt.executor.job.plan import ExecPlan
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.executor.program.replay import MODES
from tensoropt.executor.state.mesh import rank_device
from tensoropt.executor.state.peak_memory import PeakMemory, load_model_code
from tensoropt.parallel.model import parallelize_spec
from tensoropt.training.measure import RunResult, StepMeter

__all__ = ["RunResult", "Trainer", "memory_step"]


def memory_step(steps: int) -> int:
    """Which of a run's ``steps`` steps (0-based) is measured for memory: the first. Its peak holds
    the optimizer state the step creates as every later step holds it (:class:`StepMeter`); the
    replayed steps after it are the same program in every mode.

    Example:
        >>> memory_step(1), memory_step(5)
        (0, 0)
    """
    return 0


class Trainer:
    """One plan's training on this rank: the parallel model, its optimizer, the data, the meter.

    ``mode``: ``"replay"`` (default) traces the step once per input shapes into a local program
    (:mod:`tensoropt.executor.program.replay`) and replays it; ``"interpret"`` runs every step through the
    DTensor interpreter (the reference). In replay mode the first step of each :meth:`train` call,
    which measures the saved activations, runs through the interpreter. ``compile``: ``"none"`` or
    ``"inductor"`` (the replayed program compiled).

    Example:
        >>> result = Trainer(spec, plan).train(steps=3)  # needs a process group  # doctest: +SKIP
    """

    def __init__(self, spec: TrainSpec, plan: ExecPlan, mode: str = "replay", compile: str = "none",
                 micro_batches: int = 1):
        if mode not in MODES:
            raise ValueError(f"executor.mode: {mode!r} is not one of {MODES}")
        if micro_batches < 1 or spec.global_batch_size % micro_batches:
            raise ValueError(f"training.micro_batches: {micro_batches} does not divide the global batch of "
                             f"{spec.global_batch_size} samples (plan {plan.plan_id})")
        self.spec, self.plan, self.mode = spec, plan, mode
        self.micro_batches = int(micro_batches)
        """Micro-batches per step (the plan's ``micro_batches``): each step runs the micro-batch graph
        that many times, all but the last under ``no_sync``, and steps the optimizer once."""
        self.device = rank_device()
        load_model_code(spec, self.device)  # its library and export's code are loaded before the baseline
        memory_peak = PeakMemory(self.device)  # the process's level before the model is built
        self.pm = parallelize_spec(spec, plan, mode=mode, compile=compile)
        self.runtime = self.pm.tensoropt_runtime
        rows_per_micro_batch = spec.global_batch_size // self.micro_batches
        self.graph = self.runtime.graph(rows_per_micro_batch)  # the step's graph: one micro-batch's
        self.optimizer = spec.make_optimizer(list(self.runtime.optimizer_params().values()))
        self.meter = StepMeter(self.pm, self.optimizer, memory_peak)
        self.source = spec.batch_source()  # each step's inputs: only this rank's region of them
        regions = self.pm.regions(rows_per_micro_batch)
        rows = {region[0][1] for region in regions.values()}
        if len(rows) > 1 and rows_per_micro_batch not in rows:
            # rows split differently and none whole: the API cannot tell the global batch size; read whole
            regions = {k: tuple((0, n) for n in shape) for k, shape in zip(regions, self.graph.input_shapes)}
        self.regions = list(regions.values())
        self.fail_at_step: int | None = None

    # -- the loop -------------------------------------------------------------------------------------

    def train(self, steps: int, start_step: int = 0, after_step=None) -> RunResult:
        """Train ``steps`` steps from global step ``start_step``; measure time and memory.

        The memory figure is the maximum over ranks of parameters + gradients + optimizer
        state + the saved activations of a step, measured on one step (:func:`memory_step`; the
        exported graph's shapes are the same every step). ``after_step(done)``, when given, is called after
        each step with the number of global steps done (checkpointing hooks in).
        """
        meter = self.meter
        meter.start()
        measured = start_step + memory_step(steps)
        for step in range(start_step, start_step + steps):
            batches = self.micro_batches_of(step)
            with meter.step(step, batches, measure=step == measured):
                loss = self._update(batches)
            meter.log(step, loss)
            if after_step is not None:
                after_step(step + 1)
        return meter.result()

    def _update(self, batches: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        """One optimizer step over the micro-batches ``batches``: gradients accumulated (each micro-batch's
        scaled by ``1 / m``), synchronised once (the last outside ``no_sync``); returns the mean loss."""
        m = len(batches)
        loss = None
        for i, batch in enumerate(batches):
            with self.pm.no_sync() if i < m - 1 else contextlib.nullcontext():
                part = self.pm.train_step(batch, loss_scale=1.0 / m)
            loss = part / m if loss is None else loss + part / m
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    def batch_of(self, step: int) -> dict[str, torch.Tensor]:
        """This rank's region of each input of ``step``'s global batch, by input name
        (:class:`~tensoropt.executor.job.data.BatchSource`: only that region is produced); with several
        micro-batches, the first micro-batch's (:meth:`micro_batches_of`)."""
        return self.micro_batches_of(step)[0]

    def micro_batches_of(self, step: int) -> list[dict[str, torch.Tensor]]:
        """This rank's region of each input of each micro-batch of ``step``'s global batch: micro-batch
        ``k`` is the global batch's rows ``[k B / m, (k + 1) B / m)``, as
        :func:`tensoropt.parallel.micro_batches` cuts them."""
        if self.fail_at_step == step:
            raise RuntimeError(f"injected failure at step {step} on this rank (test of error propagation)")
        return [dict(zip(self.pm.input_names, self.batch(step, k))) for k in range(self.micro_batches)]

    def step(self, step: int, measure_memory: bool = True) -> tuple[float, float, int | None]:
        """One step of the loop alone; returns (loss, time_s, saved activation bytes or None)."""
        batches = self.micro_batches_of(step)
        with self.meter.step(step, batches, measure=measure_memory):
            loss = self._update(batches)
        record = self.meter.log(step, loss)
        return record["loss"], record["time_s"], self.meter.activation_bytes if measure_memory else None

    # -- the parts, for the tools that look inside ------------------------------------------------------

    def batch(self, step: int, micro_batch: int = 0) -> tuple:
        """This rank's part of each graph input of ``step``'s global batch (local tensors, input order);
        with several micro-batches, of micro-batch ``micro_batch``'s rows of it."""
        offset = micro_batch * (self.spec.global_batch_size // self.micro_batches)
        regions = [((r[0][0] + offset, r[0][1]), *r[1:]) for r in self.regions]
        batch = self.source.local(step, regions)
        dtype = getattr(torch, self.spec.dtype)
        return tuple(t.to(self.device, dtype) if t.is_floating_point() else t.to(self.device) for t in batch)

    def _placeholder_values(self, batch: tuple) -> list:
        """The graph's placeholder values of this rank's ``batch`` (from :meth:`batch`)."""
        return self.graph.values(list(batch))

    def __getattr__(self, name: str):
        if name in _RUNTIME_VIEWS:  # the parallel model's state, under the names tools know
            return getattr(self.runtime, name)
        if name in _GRAPH_VIEWS:
            return getattr(self.graph, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def memory_peak(self) -> PeakMemory:
        return self.meter.memory_peak

    def used_keys(self) -> set[str]:
        """State-dict keys of the parameter placeholders the graph reads."""
        return {self.sig.params[n.name] for n in self.ep.graph.nodes
                if n.op == "placeholder" and n.name in self.sig.params and n.users}

    def runtime_info(self) -> dict:
        """How this trainer ran its steps: mode, compile backend, traces, program nodes and collectives.

        Example:
            >>> Trainer(spec, plan).runtime_info()["mode"]  # needs a process group  # doctest: +SKIP
            'replay'
        """
        program = self.graph.program
        info = {"mode": self.mode, "compile": program.compile if program else "none"}
        if program is not None:
            info.update(program.stats())
        return info

    def state_bytes(self) -> int:
        """Local bytes of parameters + gradients + optimizer state on this rank."""
        return self.meter.state_bytes()

    def resident_tensor_bytes(self) -> int:
        """Local bytes of the tensors a step starts with (:meth:`StepMeter.resident_tensor_bytes`)."""
        return self.meter.resident_tensor_bytes()

    def _sync_grads(self) -> None:
        """Wait for the interpreted step's gradient buckets (:class:`GradSync`)."""
        self.runtime.grad_sync.finish()

    def checkpoint_params(self) -> dict[str, torch.Tensor]:
        """State-dict key -> the tensor checkpoints save and load (a zero1/zero2 shard or the parameter)."""
        return self.runtime.optimizer_params()

    def after_load(self) -> None:
        """Bring the parameters up to date after a checkpoint was loaded into :meth:`checkpoint_params`."""
        self.runtime.zero.gather()

    def full_params(self) -> dict[str, torch.Tensor]:
        """Every parameter as a full plain tensor (a collective: call on all ranks)."""
        return {k: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
                for k, p in self.runtime.params.items()}


_RUNTIME_VIEWS = {"mesh", "params", "buffers", "constants", "param_of", "layouts", "zero", "grad_sync",
                  "scaler"}
_GRAPH_VIEWS = {"ep", "sig", "interpreter", "program", "operands", "input_names"}
