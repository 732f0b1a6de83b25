"""Train a model for some steps under a plan, on the current process group.

:func:`train` builds the model with the spec's seed, exports it, distributes parameters and
inputs per the plan, and runs forward (the :class:`PlanInterpreter`), backward, gradient
synchronisation and the optimizer step, measuring step time and memory.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DeviceMesh, DTensor, distribute_tensor

from tensoropt.configspace.configuration import Layout
from tensoropt.executor.data import input_regions
from tensoropt.executor.gradsync import GradSync
from tensoropt.executor.interpreter import PlanInterpreter
from tensoropt.executor.local_optim import step_local
from tensoropt.executor.local_state import build_local_state
from tensoropt.executor.memory import SavedTensors, optimizer_state_tensors, storage_bytes, storage_keys
from tensoropt.executor.mixed_precision import LossScaler
from tensoropt.executor.peak_memory import PeakMemory, load_model_code
from tensoropt.executor.placements import normalise, to_placements
from tensoropt.executor.plan import ExecPlan, check_plan_graph
from tensoropt.executor.program import lazy_views
from tensoropt.executor.replay import MODES, ReplayProgram
from tensoropt.executor.spec import TrainSpec
from tensoropt.executor.tensor_peak import TensorPeak
from tensoropt.executor.zero import ShardedState


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
    ranks (:mod:`tensoropt.executor.peak_memory`: CUDA allocator, or resident set on the CPU)."""
    peak_tensor_bytes: int = 0
    """The most bytes of tensor storage alive at once during the first step (the persistent state
    included), maximum over ranks (:mod:`tensoropt.executor.tensor_peak`): no allocator setting
    changes it."""

    @property
    def median_time_s(self) -> float:
        """Median step time (the first step, which warms up, is left out when there are several)."""
        times = [s["time_s"] for s in self.steps]
        return statistics.median(times[1:] if len(times) > 2 else times) if times else 0.0


def device_type() -> str:
    """``"cuda"`` when a GPU is visible, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def build_mesh(plan: ExecPlan) -> DeviceMesh | None:
    """The DeviceMesh of a plan (axes ``a0``, ``a1``, ...), or None for a 1-device plan.

    Example:
        >>> build_mesh(plan)  # needs a process group  # doctest: +SKIP
    """
    world = dist.get_world_size() if dist.is_initialized() else 1
    if not plan.mesh.shape and world == 1:
        return None
    if plan.devices != world:
        raise ValueError(
            f"plan {plan.plan_id} needs {plan.devices} processes but {world} are running; "
            f"launch with --nproc {plan.devices}"
        )
    names = tuple(f"a{i}" for i in range(len(plan.mesh.shape)))
    return init_device_mesh(device_type(), tuple(plan.mesh.shape), mesh_dim_names=names)


def _distribute(t: torch.Tensor, mesh: DeviceMesh, layout: Layout) -> DTensor:
    return distribute_tensor(t.detach(), mesh, to_placements(normalise(layout, t.dim())), src_data_rank=None)


def _input_layout(plan: ExecPlan, name: str, ndim: int) -> Layout:
    config = plan.placements.get(name)
    return tuple(config.output) if config is not None else ("R",) * ndim


class Trainer:
    """One plan's training state on this rank: exported program, parameters, optimizer.

    ``mode``: ``"replay"`` (default) traces the step once per input shapes into a local program
    (:mod:`tensoropt.executor.replay`) and replays it, the optimizer stepping local tensors;
    ``"interpret"`` runs every step through the DTensor interpreter (the reference). In replay mode
    the first step of each :meth:`train` call, which measures the saved activations, still runs
    through the interpreter. ``compile``: ``"none"`` or ``"inductor"`` (the replayed program
    compiled).

    Example:
        >>> result = Trainer(spec, plan).train(steps=3)  # needs a process group  # doctest: +SKIP
    """

    def __init__(self, spec: TrainSpec, plan: ExecPlan, mode: str = "replay", compile: str = "none"):
        if mode not in MODES:
            raise ValueError(f"executor.mode: {mode!r} is not one of {MODES}")
        self.spec, self.plan, self.mode = spec, plan, mode
        self.mesh = build_mesh(plan)
        self.device = torch.device(device_type(), torch.cuda.current_device()) if device_type() == "cuda" \
            else torch.device("cpu")
        load_model_code(spec, self.device)  # its library and export's code are loaded before the baseline
        self.memory_peak = PeakMemory(self.device)  # the process's level before the model is built
        # only this rank's shards: built on meta, exported on meta, materialised shard by shard
        local = build_local_state(spec, plan, self.mesh, self.device)
        self.ep, self.operands, self.sig = local.ep, local.operands, local.sig
        # a plan made for another graph is refused, never guessed (float64: a numerical check of its layouts)
        _check_graph(plan, self.ep, spec.job, dtypes=spec.dtype != "float64")
        self.param_of, self.layouts = local.param_of, local.layouts
        self.params, self.buffers, self.constants = local.params, local.buffers, local.constants
        if spec.mixed is not None:  # float32 master parameters, cast to the compute dtype where used
            self.params = {k: torch.nn.Parameter(p.detach().float()) for k, p in self.params.items()}
        self.grad_bytes = 0
        self.fail_at_step: int | None = None
        # zero1/zero2 parameters: the optimizer steps (and keeps state for) a shard of each
        self.zero = ShardedState.for_plan(plan, self.params, self.mesh)
        self.optimizer = spec.make_optimizer(self.zero.optimizer_params(self.params))
        blocks = ((spec.job or {}).get("training") or {}).get("checkpoint_modules")
        self.interpreter = PlanInterpreter(self.ep.graph_module, plan.placements, self.mesh, self.operands,
                                           lazy_views(self.ep, plan.placements), checkpoint_modules=blocks)
        # after zero's hooks (a zero2 gradient is reduce-scattered there, not all-reduced here)
        self.grad_sync = GradSync(self.params.values())
        self.interpreter.on_grad = self.grad_sync.add  # the whole-graph local mode's gradients
        self.interpreter.batch_norm_stats = spec.batch_norm
        self.scaler = LossScaler() if spec.mixed is not None and spec.mixed.loss_scaling else None
        if spec.mixed is not None:
            self.interpreter.compute_dtype = getattr(torch, spec.mixed.compute_dtype)
            self.interpreter.loss_scale = self.scaler.scale if self.scaler else None
        self.input_names = [n.name for n in self.ep.graph.nodes if n.op == "placeholder"
                            and n.name in self.sig.user_inputs]
        self.source = spec.batch_source()  # each step's inputs: only this rank's rows of them
        self.input_layouts = self._input_layouts()
        self.input_regions = input_regions([shape for shape, _ in self.input_layouts], self.mesh,
                                           [placements for _, placements in self.input_layouts])
        self.program = ReplayProgram(self, compile) if mode == "replay" else None

    def used_keys(self) -> set[str]:
        """State-dict keys of the parameter placeholders the graph reads."""
        return {self.sig.params[n.name] for n in self.ep.graph.nodes
                if n.op == "placeholder" and n.name in self.sig.params and n.users}

    def batch(self, step: int) -> tuple:
        """This rank's part of each graph input of ``step``'s global batch (local tensors, input order).

        Only the region each input's layout puts on this rank is produced (its batch shard's rows;
        every row where the plan replicates the batch): :class:`~tensoropt.executor.data.BatchSource`.
        Without a mesh that is the whole global batch.
        """
        batch = self.source.local(step, self.input_regions)
        dtype = getattr(torch, self.spec.dtype)
        return tuple(t.to(self.device, dtype) if t.is_floating_point() else t.to(self.device) for t in batch)

    def _input_layouts(self) -> list[tuple[tuple[int, ...], list | None]]:
        """(global shape, placements or None without a mesh) of each graph input, in input order."""
        nodes = {n.name: n for n in self.ep.graph.nodes if n.op == "placeholder"}
        ndim = len(self.plan.mesh.shape)
        out = []
        for name in self.input_names:
            shape = tuple(int(d) for d in nodes[name].meta["val"].shape)
            placements = None if self.mesh is None else \
                to_placements(normalise(_input_layout(self.plan, name, ndim), len(shape)))
            out.append((shape, placements))
        return out

    def _placeholder_values(self, batch: tuple) -> list:
        """The graph's placeholder values: parameters, buffers, constants, and this rank's ``batch``
        (from :meth:`batch`) as distributed tensors of the global shape."""
        inputs = {name: (x, layout) for name, x, layout in zip(self.input_names, batch, self.input_layouts)}
        values = []
        for node in self.ep.graph.nodes:
            if node.op != "placeholder":
                continue
            name = node.name
            if name in self.sig.params:
                values.append(self.params[self.param_of[self.sig.params[name]]])
            elif name in self.sig.buffers:
                values.append(self.buffers[self.sig.buffers[name]])
            elif name in self.sig.constants:
                values.append(self.constants[self.sig.constants[name]])
            else:
                x, (shape, placements) = inputs[name]
                if self.mesh is not None:
                    x = DTensor.from_local(x, self.mesh, placements, run_check=False, shape=torch.Size(shape),
                                           stride=_contiguous_stride(shape))
                values.append(x)
        return values

    def step(self, step: int, measure_memory: bool = True) -> tuple[float, float, int | None]:
        """One training step; returns (loss, time_s, saved activation bytes or None).

        ``measure_memory``: record the storages autograd saves and the gradients' bytes (a
        saved-tensor hook on every saved tensor, inside the timed step). The graph's shapes are
        fixed, so :meth:`train` measures the first step of each call and times the rest bare.
        """
        batch = self.batch(step)
        if self.fail_at_step == step:
            raise RuntimeError(f"injected failure at step {step} on this rank (test of error propagation)")
        values = self._placeholder_values(batch)  # the data loading: not part of the step time
        if self.program is not None and not measure_memory:
            return self._replay_step(values)
        _sync()
        start = time.perf_counter()
        with SavedTensors() if measure_memory else contextlib.nullcontext() as saved:
            out = self.interpreter.run(*values)
        loss = out[0] if isinstance(out, (tuple, list)) else out
        activation_bytes = saved.bytes(exclude=storage_keys(self.params.values())) if measure_memory else None
        loss.backward()
        self._sync_grads()
        self.zero.shard_gradients()
        if measure_memory:
            grads = [p.grad for p in self.params.values() if p.grad is not None] + self.zero.gradients()
            self.grad_bytes = storage_bytes(grads)
        result = (*self._update(loss, start, self.optimizer.step), activation_bytes)
        if self.program is not None:  # the replayed program has its own buckets: keep no second copy
            self.grad_sync.release_buffers()
        return result

    def runtime_info(self) -> dict:
        """How this trainer ran its steps: mode, compile backend, traces, program nodes and collectives.

        Example:
            >>> Trainer(spec, plan).runtime_info()["mode"]  # needs a process group  # doctest: +SKIP
            'replay'
        """
        info = {"mode": self.mode, "compile": self.program.compile if self.program else "none"}
        if self.program is not None:
            info.update(self.program.stats())
        return info

    def _replay_step(self, values: list) -> tuple[float, float, None]:
        """One step of the replayed local program (traced on first use of these shapes, not timed)."""
        self.program.program(values)
        _sync()
        start = time.perf_counter()
        loss = self.program.run(values)
        self.zero.shard_gradients()
        return (*self._update(loss, start, lambda: step_local(self.optimizer)), None)

    def _update(self, loss: torch.Tensor, start: float, optimizer_step) -> tuple[float, float]:
        """Step the optimizer (``optimizer_step()``), gather ZeRO shards, drop the gradients; returns
        (the loss's value, seconds since ``start``), the loss read after the clock stops."""
        if self.scaler is None or self._unscale():
            optimizer_step()
            self.zero.gather()
        self.optimizer.zero_grad(set_to_none=True)
        self.zero.zero_grad()
        _sync()
        time_s = time.perf_counter() - start
        value = loss.full_tensor() if isinstance(loss, DTensor) else loss
        return float(value.detach()), time_s

    def _unscale(self) -> bool:
        """fp16-mixed: divide the gradients by the loss scale; whether they are finite on every rank
        (else the step is skipped). The scale then moves (:class:`LossScaler`); a replayed program
        traced with the old one is traced again."""
        grads = [p.grad for p in self.params.values() if p.grad is not None]
        grads += [s.shard.grad for s in self.zero.sharded.values() if s.grads_too and s.shard.grad is not None
                  ]
        finite = self.scaler.unscale(grads)  # zero1's shard gradients are views of these
        if self.scaler.update(finite):
            self.interpreter.loss_scale = self.scaler.scale
            if self.program is not None:
                self.program.programs.clear()
        return finite

    def _sync_grads(self) -> None:
        """Bring each gradient to its parameter's placement (bucketed all-reduce of partial sums, started
        during backward by :class:`GradSync`'s hooks; this waits for them)."""
        self.grad_sync.finish()

    def state_bytes(self) -> int:
        """Local bytes of parameters + gradients + optimizer state on this rank."""
        opt_bytes = storage_bytes(optimizer_state_tensors(self.optimizer))
        return storage_bytes(self.params.values()) + self.grad_bytes + opt_bytes

    def resident_tensor_bytes(self) -> int:
        """Local bytes of the tensors a step starts with: parameters (and the optimizer's shards of
        them), gradients still held, buffers, constants and optimizer state (each storage once)."""
        tensors = [*self.params.values(), *self.buffers.values(),
                   *(v for v in self.constants.values() if isinstance(v, torch.Tensor)),
                   *(p for group in self.optimizer.param_groups for p in group["params"]),
                   *(p.grad for p in self.params.values() if p.grad is not None),
                   *optimizer_state_tensors(self.optimizer)]
        return storage_bytes(tensors)

    def train(self, steps: int, start_step: int = 0, after_step=None) -> RunResult:
        """Train ``steps`` steps from global step ``start_step``; measure time and memory.

        The memory figure is the maximum over ranks of parameters + gradients + optimizer
        state + the saved activations of a step (measured on the first step: the exported graph's
        shapes are the same every step). ``after_step(done)``, when given, is called after each
        step with the number of global steps done (checkpointing hooks in).
        """
        result = RunResult(self.plan.plan_id, self.plan.devices)
        peak_act = 0
        self.memory_peak.start()
        for step in range(start_step, start_step + steps):
            first = step == start_step
            with TensorPeak(self.resident_tensor_bytes()) if first else contextlib.nullcontext() as tensors:
                loss, time_s, act = self.step(step, measure_memory=first)
            if first:
                result.peak_tensor_bytes = tensors.peak_bytes
            peak_act = max(peak_act, act or 0)
            result.steps.append({"step": step, "loss": loss, "time_s": time_s})
            if after_step is not None:
                after_step(step + 1)
        peak_bytes = self.memory_peak.read()
        result.memory_bytes = _max_over_ranks(self.state_bytes() + peak_act)
        result.peak_bytes = _max_over_ranks(peak_bytes)
        result.peak_tensor_bytes = _max_over_ranks(result.peak_tensor_bytes)
        return result

    def checkpoint_params(self) -> dict[str, torch.Tensor]:
        """State-dict key -> the tensor checkpoints save and load (a zero1/zero2 shard or the parameter)."""
        return self.zero.checkpoint_params(self.params)

    def after_load(self) -> None:
        """Bring the parameters up to date after a checkpoint was loaded into :meth:`checkpoint_params`."""
        self.zero.gather()

    def full_params(self) -> dict[str, torch.Tensor]:
        """Every parameter as a full plain tensor (a collective: call on all ranks)."""
        return {k: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
                for k, p in self.params.items()}


def _check_graph(plan: ExecPlan, ep, job: dict | None, dtypes: bool = True) -> None:
    """Refuse ``plan`` when the graph this rank exported is not the one it was made for; rank 0 prints
    the warnings (:func:`~tensoropt.executor.plan.check_plan_graph`)."""
    if not plan.mesh.shape and not plan.placements:
        return
    from tensoropt.capture.graph import build_graph

    warnings = check_plan_graph(plan, build_graph(ep), job, dtypes=dtypes)
    if warnings and (not dist.is_initialized() or dist.get_rank() == 0):
        for warning in warnings:
            print(f"[tensoropt] warning: {warning}", flush=True)


def _contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, out = 1, []
    for n in reversed(shape):
        out.append(stride)
        stride *= max(n, 1)
    return tuple(reversed(out))


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _max_over_ranks(value: int) -> int:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device_type())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())
