"""One rank's side of a parallel model: the step's graphs, the shards, the gradients.

:class:`Runtime` holds what :func:`tensoropt.parallelize` builds on this rank: the plan, its mesh,
the parameters' local shards (:func:`tensoropt.executor.state.local_state.shard_state`), the ZeRO
shard parameters (:class:`~tensoropt.executor.state.zero.ShardedState`), and one :class:`StepGraph` per
global batch size (the model exported on meta for that batch, interpreted by
:class:`~tensoropt.executor.program.interpreter.PlanInterpreter` and replayed as a local program by
:class:`~tensoropt.executor.program.replay.ReplayProgram`, as ``tensoropt run`` does).

A training step here is forward + loss + backward + gradient synchronisation; the gradients are
*accumulated* into ``.grad`` (scaled by ``loss_scale``), so several micro-batches add up, and
the optimizer step is the user's. Under ``no_sync`` the replayed program is the one traced
without gradient synchronisation: each gradient is added up locally as the partial sum backward
leaves, and the first step outside ``no_sync`` synchronises the sum once
(:meth:`Runtime.sync_pending`: DDP's buckets, ZeRO-2's reduce-scatter).

Example:
    >>> # not run here: needs a process group; tensoropt.parallelize builds it
    >>> runtime = Runtime(module, plan, spec, mesh, torch.device("cpu"))  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
from torch import nn
from torch.distributed.tensor import DeviceMesh, DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

from tensoropt.executor.job.data import input_regions
from tensoropt.executor.job.meta_export import meta_inputs, retarget_device
from tensoropt.executor.job.plan import ExecPlan
from tensoropt.executor.job.program import export_program, lazy_views, signature
from tensoropt.executor.ops.placements import normalise, to_placements
from tensoropt.executor.program.eval_graph import eval_graph_module
from tensoropt.executor.program.interpreter import PlanInterpreter
from tensoropt.executor.program.replay import ReplayProgram
from tensoropt.executor.state.gradsync import GradSync
from tensoropt.executor.state.local_state import LocalState
from tensoropt.executor.state.mesh import contiguous_stride
from tensoropt.executor.state.mixed_precision import LossScaler, compute_module
from tensoropt.executor.state.zero import ShardedState


@contextlib.contextmanager
def meta_state(module: nn.Module):
    """Inside, every parameter and buffer of ``module`` is a meta tensor of its shape and dtype
    (tied ones stay one tensor); outside, the module holds its own tensors again.

    Example:
        >>> lin = nn.Linear(2, 3)
        >>> with meta_state(lin):
        ...     lin.weight.is_meta, lin.weight.shape
        (True, torch.Size([3, 2]))
        >>> lin.weight.is_meta
        False
    """
    saved, made = [], {}
    for m in module.modules():
        for slots, wrap in ((m._parameters, True), (m._buffers, False)):
            for name, t in slots.items():
                if t is None:
                    continue
                saved.append((slots, name, t))
                if id(t) not in made:
                    meta = torch.empty(t.shape, dtype=t.dtype, device="meta")
                    made[id(t)] = nn.Parameter(meta, requires_grad=t.requires_grad) if wrap else meta
                slots[name] = made[id(t)]
    try:
        yield
    finally:
        for slots, name, t in saved:
            slots[name] = t


def compute_dtype(spec) -> torch.dtype | None:
    """A mixed precision's compute dtype (its graph's), or None (everything in ``spec.dtype``).

    Example:
        >>> from tensoropt.executor.job.spec import TrainSpec
        >>> from tensoropt.executor.job.data import InputSpec
        >>> compute_dtype(TrainSpec("mlp", (InputSpec((2,)),), 4, dtype="bfloat16", precision="bf16-mixed"))
        torch.bfloat16
    """
    return getattr(torch, spec.mixed.compute_dtype) if spec.mixed is not None else None


def export_module(module: nn.Module, spec, batch_size: int,
                  device: torch.device) -> torch.export.ExportedProgram:
    """Export ``module`` (the job's training step around the user's model) on meta inputs of a
    ``batch_size``-row batch; its weights are never read. Tensors the graph creates go to ``device``.
    In a mixed precision the graph computes in its compute dtype (a meta copy of the module cast to
    it: :func:`~tensoropt.executor.state.mixed_precision.compute_module`).

    Example:
        >>> # not run here: needs a job's TrainSpec
        >>> ep = export_module(step_module, spec, 8, torch.device("cpu"))  # doctest: +SKIP
    """
    example = meta_inputs(dataclasses.replace(spec, global_batch_size=batch_size))
    with meta_state(module):
        ep = export_program(compute_module(module, compute_dtype(spec)), example)
    retarget_device(ep.graph_module, device)
    return ep


def _layout_placements(plan: ExecPlan, name: str, ndim: int):
    config = plan.placements.get(name)
    layout = tuple(config.output) if config is not None else ("R",) * len(plan.mesh.shape)
    return to_placements(normalise(layout, ndim))


class StepGraph:
    """The step exported for one global batch size: interpreter, input layouts, replayed programs.

    Duck-types the trainer :func:`~tensoropt.executor.program.lowering.lower_step` and
    :class:`~tensoropt.executor.program.replay.ReplayProgram` trace (``interpreter``, ``sig``, ``params``,
    ``param_of``, ``zero``).

    Example:
        >>> # not run here: needs a Runtime on a process group
        >>> graph = runtime.graph(8)  # doctest: +SKIP
    """

    def __init__(self, runtime: Runtime, ep: torch.export.ExportedProgram, operands: dict, batch_size: int):
        from tensoropt.capture.graph import build_graph

        self.runtime, self.ep, self.batch_size = runtime, ep, batch_size
        self.sig = signature(ep)
        if operands is None:
            operands = {n: d["operands"] for n, d in build_graph(ep).nx.nodes(data=True)}
        plan, mesh = runtime.plan, runtime.mesh
        self.operands = operands
        blocks = ((runtime.spec.job or {}).get("training") or {}).get("checkpoint_modules")
        self.interpreter = self._interpreter(ep.graph_module, blocks)
        self.interpreter.on_grad = runtime.grad_sync.add  # the whole-graph local mode's gradients
        self.interpreter.loss_scale = runtime.scaler.scale if runtime.scaler is not None else None
        self._eval_interpreter: PlanInterpreter | None = None
        nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
        self.input_names = [n for n in nodes if n in self.sig.user_inputs]
        self.input_shapes = [tuple(int(d) for d in nodes[n].meta["val"].shape) for n in self.input_names]
        self.input_dtypes = [nodes[n].meta["val"].dtype for n in self.input_names]
        self.input_placements = [None if mesh is None else _layout_placements(plan, n, len(s))
                                 for n, s in zip(self.input_names, self.input_shapes)]
        self.regions = input_regions(self.input_shapes, mesh, self.input_placements)
        self.slots = []
        """Each placeholder's source, in order: (table, key) of a parameter, buffer or constant, or
        (None, input index) for the batch."""
        rt = runtime
        for name in (n.name for n in ep.graph.nodes if n.op == "placeholder"):
            if name in self.sig.params:
                self.slots.append((rt.params, rt.param_of[self.sig.params[name]]))
            elif name in self.sig.buffers:
                self.slots.append((rt.buffers, self.sig.buffers[name]))
            elif name in self.sig.constants:
                self.slots.append((rt.constants, self.sig.constants[name]))
            else:
                self.slots.append((None, self.input_names.index(name)))
        self.strides = [contiguous_stride(shape) for shape in self.input_shapes]
        self._input_specs: dict[tuple[int, torch.dtype], DTensorSpec] = {}
        self.program = ReplayProgram(self, runtime.compile) if runtime.mode == "replay" else None

    def _interpreter(self, gm, checkpoint_modules=None) -> PlanInterpreter:
        rt = self.runtime
        interp = PlanInterpreter(gm, rt.plan.placements, rt.mesh, self.operands,
                                 lazy_views(self.ep, rt.plan.placements),
                                 checkpoint_modules=checkpoint_modules)
        interp.batch_norm_stats = rt.spec.batch_norm
        interp.compute_dtype = compute_dtype(rt.spec)
        chunk = ((rt.spec.job or {}).get("training") or {}).get("loss_chunk_tokens")
        if chunk:
            interp.loss_chunk_tokens = int(chunk)
        return interp

    @property
    def eval_interpreter(self) -> PlanInterpreter:
        """The interpreter of the step's evaluation form (dropout off, batch norm on its running
        statistics: :func:`~tensoropt.executor.program.eval_graph.eval_graph_module`), made on first use."""
        if self._eval_interpreter is None:
            self._eval_interpreter = self._interpreter(eval_graph_module(self.ep.graph_module))
        return self._eval_interpreter

    # what lower_step and ReplayProgram read of a "trainer"
    @property
    def params(self):
        return self.runtime.params

    @property
    def param_of(self):
        return self.runtime.param_of

    @property
    def zero(self):
        return self.runtime.zero

    def values(self, local_inputs: list[torch.Tensor]) -> list:
        """The graph's placeholder values: parameters, buffers, constants, then this rank's inputs
        (``local_inputs``, in input order) as distributed tensors of the global shape."""
        mesh = self.runtime.mesh
        out = []
        for table, key in self.slots:
            if table is not None:
                out.append(table[key])
                continue
            x = local_inputs[key]
            out.append(x if mesh is None else self._distributed_input(key, x))
        return out

    def _distributed_input(self, key: int, x: torch.Tensor) -> DTensor:
        """Input ``key``'s local region ``x`` as a DTensor of the global shape: what ``DTensor.from_local``
        makes (without a check), its spec made once per dtype instead of an autograd function and a spec
        every step (an input that requires a gradient still goes through ``from_local``)."""
        mesh = self.runtime.mesh
        if x.requires_grad:
            return DTensor.from_local(x, mesh, self.input_placements[key], run_check=False,
                                      shape=torch.Size(self.input_shapes[key]), stride=self.strides[key])
        spec = self._input_specs.get((key, x.dtype))
        if spec is None:
            meta = TensorMeta(torch.Size(self.input_shapes[key]), tuple(self.strides[key]), x.dtype)
            spec = self._input_specs[(key, x.dtype)] = DTensorSpec(mesh, tuple(self.input_placements[key]),
                                                                    tensor_meta=meta)
        return DTensor(x, spec, requires_grad=False)


class Runtime:
    """A rank's parallel model state and its training step (see the module docstring).

    Args:
        module: the exported module (the job's training step around the user's model).
        local: this rank's shards (:func:`~tensoropt.executor.state.local_state.shard_state`).
        plan, spec, mesh, device: the plan, the job's :class:`~tensoropt.executor.job.spec.TrainSpec`,
            the plan's mesh (None for one process) and the shards' device.
        mode: ``"replay"`` (traced once per batch size, replayed) or ``"interpret"`` (the DTensor
            interpreter every step: the reference; it synchronises every micro-batch).
        compile: ``"none"`` or ``"inductor"`` (the replayed program compiled).

    Example:
        >>> # not run here: needs a process group; tensoropt.parallelize builds it
        >>> Runtime(module, local, plan, spec, mesh, torch.device("cpu"))  # doctest: +SKIP
    """

    def __init__(self, module: nn.Module, local: LocalState, plan: ExecPlan, spec, mesh: DeviceMesh | None,
                 device: torch.device, mode: str = "replay", compile: str = "none"):
        self.module, self.plan, self.spec, self.mesh, self.device = module, plan, spec, mesh, device
        self.mode, self.compile = mode, compile
        self.param_of, self.layouts = local.param_of, local.layouts
        self.params, self.buffers, self.constants = local.params, local.buffers, local.constants
        if spec.mixed is not None:  # float32 master parameters, cast to the compute dtype where used
            self.params = {k: nn.Parameter(p.detach().float(), requires_grad=p.requires_grad)
                           for k, p in self.params.items()}
        self.scaler = LossScaler() if spec.mixed is not None and spec.mixed.loss_scaling else None
        """fp16-mixed's dynamic loss scale (None otherwise): the graph scales the loss's gradient,
        the optimizer step unscales (:meth:`unscale`)."""
        self.zero = ShardedState.for_plan(plan, self.params, mesh)
        # an interpreted step's data-parallel buckets, started by hooks during backward (interpret
        # mode, and a replay-mode step run through the interpreter: :meth:`interpreting`)
        self.grad_sync = GradSync(self.params.values())
        self.interpret_steps = mode == "interpret"
        """Whether :meth:`train_step` runs the DTensor interpreter (else the replayed program)."""
        self.step_hooks: list = []
        """``hook(event, loss)`` callables run by :meth:`train_step`: ``"forward"`` after an
        interpreted forward, ``"step"`` at its end (the measuring of ``tensoropt run`` hooks in here:
        :mod:`tensoropt.training.measure`)."""
        self.unscaled: bool | None = None
        """fp16-mixed: None while this step's gradients hold the loss scale, else whether they were
        finite when :meth:`unscale` divided it out."""
        self.graphs: dict[int, StepGraph] = {}
        batch = spec.global_batch_size
        self.graphs[batch] = StepGraph(self, local.ep, local.operands, batch)
        self.syncing = True
        """False inside ``no_sync``: gradients are accumulated unsynchronised."""
        self.pending = False
        """Whether some gradient holds unsynchronised micro-batches (a partial sum)."""
        self.local_rows: dict[int, int] = {}
        """Rows of this rank's part of a batch -> the global batch size (from :meth:`rows`)."""
        self.installed: list[torch.Tensor] = []
        """The parameters the model shows (ZeRO shard parameters where they exist): what an optimizer
        steps and ``zero_grad`` clears."""
        self.grad_syncs = 0
        """Gradient synchronisations so far (one per step outside ``no_sync``; counted by tests)."""

    def graph(self, batch_size: int) -> StepGraph:
        """The step graph of a ``batch_size``-row global batch (exported on first use)."""
        graph = self.graphs.get(batch_size)
        if graph is None:
            ep = export_module(self.module, self.spec, batch_size, self.device)
            graph = self.graphs[batch_size] = StepGraph(self, ep, None, batch_size)
        return graph

    @contextlib.contextmanager
    def interpreting(self):
        """Inside, replay-mode steps run through the DTensor interpreter (autograd's saved tensors are
        then the step's activations: the measured first step of ``tensoropt run``).

        Example:
            >>> with runtime.interpreting():  # doctest: +SKIP
            ...     pm.train_step(batch)
        """
        before, self.interpret_steps = self.interpret_steps, True
        try:
            yield
        finally:
            self.interpret_steps = before

    def _hook(self, event: str, loss) -> None:
        for hook in self.step_hooks:
            hook(event, loss)

    def optimizer_params(self) -> dict[str, torch.Tensor]:
        """Canonical key -> what an optimizer steps: the parameter, or its ZeRO shard parameter."""
        return self.zero.checkpoint_params(self.params)

    # -- the step -------------------------------------------------------------------------------------

    def train_step(self, graph: StepGraph, local_inputs: list[torch.Tensor],
                   loss_scale: float) -> torch.Tensor:
        """Forward, loss, backward on this rank's inputs; gradients (x ``loss_scale``) added to ``.grad``.

        Returns the loss (the global mean of this batch) as a plain tensor.
        """
        if all(p.grad is None for p in self.installed):  # the user zeroed the gradients: a fresh step
            for p in self.params.values():
                p.grad = None
            self.pending = False
            self.unscaled = None
        values = graph.values(local_inputs)
        defer = not self.syncing and self.mode == "replay" and self.mesh is not None
        if graph.program is not None and not self.interpret_steps:
            loss = self._replay(graph, values, loss_scale, sync=not defer and not self.pending)
        else:
            loss = self._interpret(graph, values, loss_scale)
            if graph.program is not None:  # the replayed program has its own buckets: keep no second copy
                self.grad_sync.release_buffers()
        self.pending = self.pending or defer
        if not defer and self.pending:
            self.sync_pending()
        self.grad_syncs += 0 if defer else 1
        if not defer:  # ZeRO-1 shards view the synchronised gradient
            self.zero.shard_gradients()
        if self.step_hooks:
            self._hook("step", loss)
        return read_loss(loss)

    def trace(self, graph: StepGraph, local_inputs: list[torch.Tensor]) -> None:
        """Trace ``graph``'s replayed program if it is not yet: the synchronising one, or inside
        ``no_sync`` the one that defers the synchronisation."""
        if graph.program is not None and not self.interpret_steps:
            defer = not self.syncing and self.mesh is not None
            graph.program.program(graph.values(local_inputs), sync_grads=not defer)

    @torch.no_grad()
    def _replay(self, graph: StepGraph, values: list, scale: float, sync: bool) -> torch.Tensor:
        lowered, call = graph.program.program(values, sync_grads=sync)
        out = call(*lowered.flat_inputs(self.params, values, graph.interpreter.global_inputs))
        i = 1
        for key, spec in zip(lowered.grad_keys, lowered.grad_specs):
            grad = DTensor(out[i], spec, requires_grad=False) if spec is not None else out[i]
            _accumulate(self.params[key], grad, scale)
            i += 1
        for key in lowered.shard_grad_keys:
            shard = self.zero.sharded[key].shard
            _accumulate(shard, DTensor(out[i], shard._spec, requires_grad=False), scale)
            i += 1
        if lowered.loss_spec is None:
            return out[0]
        return DTensor(out[0], lowered.loss_spec, requires_grad=False)

    def _interpret(self, graph: StepGraph, values: list, scale: float) -> torch.Tensor:
        """The DTensor interpreter's step; gradients synchronised (each micro-batch) then accumulated."""
        targets = [*self.params.values(), *(s.shard for s in self.zero.sharded.values())]
        before = {id(p): p.grad for p in targets}
        for p in targets:
            p.grad = None
        out = graph.interpreter.run(*values)
        loss = out[0] if isinstance(out, (tuple, list)) else out
        if self.step_hooks:
            self._hook("forward", loss)
        loss.backward()
        self.grad_sync.finish()
        for p in targets:
            new, p.grad = p.grad, before[id(p)]
            if new is not None:
                _accumulate(p, new, scale)
        return loss.detach()

    def sync_pending(self) -> None:
        """Synchronise the gradients accumulated under ``no_sync`` (one round for all micro-batches)."""
        for s in self.zero.sharded.values():
            if s.grads_too and s.param.grad is not None:  # ZeRO-2: reduce-scatter the sum to the shard
                grad, s.param.grad = s.param.grad, None
                _accumulate(s.shard, grad.redistribute(s.shard.device_mesh, s.shard.placements), 1.0)
        sync = GradSync(self.params.values(), hooks=False)
        for p in sync.params:
            if isinstance(p, DTensor) and isinstance(p.grad, DTensor) and p.grad.placements != p.placements:
                sync.add(p)
        sync.finish()
        self.pending = False

    @torch.no_grad()
    def eval_step(self, graph: StepGraph, local_inputs: list[torch.Tensor]) -> torch.Tensor:
        """The loss of a batch, forward only: no gradient, buffers and random state left as they were."""
        values = graph.values(local_inputs)
        values = [v.clone() if any(v is b for b in self.buffers.values()) else v for v in values]
        interpreter = graph.eval_interpreter
        with torch.random.fork_rng(devices=[]):
            out = interpreter.run(*values)
        interpreter.env = {}
        return read_loss(out[0] if isinstance(out, (tuple, list)) else out)

    def check_synchronised(self) -> None:
        """Raise when gradients accumulated under ``no_sync`` were never synchronised."""
        if self.pending:
            raise RuntimeError("the gradients hold micro-batches accumulated under pm.no_sync() and not yet "
                               "synchronised; run the last micro-batch of the step outside no_sync()")

    def after_optimizer_step(self) -> None:
        """Bring ZeRO-1/2 parameters up to date with their stepped shards (an all-gather); their full
        gradients (the shards' are what the optimizer stepped) are dropped."""
        self.zero.gather()
        for s in self.zero.sharded.values():
            s.param.grad = None

    def unscale(self) -> bool:
        """fp16-mixed, before the optimizer step: divide the gradients by the loss scale; whether they
        are finite on every rank (else the step is to be skipped). The scale then moves
        (:class:`~tensoropt.executor.state.mixed_precision.LossScaler`); programs traced with the old one are
        traced again. Without a loss scale: True. A collective: call on every rank.

        Example:
            >>> runtime.unscale()  # doctest: +SKIP
            True
        """
        if self.scaler is None:
            return True
        if self.unscaled is not None:  # this step's gradients are unscaled already (clip_grad_norm_)
            return self.unscaled
        finite = self.unscaled = self.scaler.unscale([p.grad for p in self.installed if p.grad is not None])
        if self.scaler.update(finite):
            self._rescaled()
        return finite

    def load_loss_scale(self, state: dict | None) -> None:
        """fp16-mixed: continue with a checkpoint's loss scale (:meth:`LossScaler.state_dict`); programs
        traced with another scale are traced again. Without a loss scale here, or in ``state``: nothing.

        Example:
            >>> runtime.load_loss_scale({"scale": 1024.0, "good_steps": 3, "skipped": 1})  # doctest: +SKIP
        """
        if self.scaler is None or not state:
            return
        self.scaler.load_state_dict(state)
        self._rescaled()

    def _rescaled(self) -> None:
        for graph in self.graphs.values():
            graph.interpreter.loss_scale = self.scaler.scale
            if graph.program is not None:
                graph.program.programs.clear()



def read_loss(loss: torch.Tensor) -> torch.Tensor:
    """The loss as a plain tensor: its local value where it is replicated, else summed over the
    mesh axes where it is a partial sum (an all-reduce of one number per axis).

    Example:
        >>> read_loss(torch.tensor(2.5))
        tensor(2.5000)
    """
    if not isinstance(loss, DTensor):
        return loss.detach()
    local = loss._local_tensor.detach()
    partial = [axis for axis, p in enumerate(loss.placements) if p.is_partial()]
    if any(not (p.is_partial() and p.reduce_op == "sum" or p.is_replicate()) for p in loss.placements):
        return loss.full_tensor().detach()
    if partial:
        import torch.distributed as dist

        local = local.clone()
        for axis in partial:
            dist.all_reduce(local, group=loss.device_mesh.get_group(axis))
    return local


def _accumulate(p: torch.Tensor, grad: torch.Tensor, scale: float) -> None:
    """``p.grad += scale * grad`` on local tensors (``p.grad = scale * grad`` when it has none)."""
    if p.grad is None:
        if scale != 1.0:
            local = grad._local_tensor if isinstance(grad, DTensor) else grad
            local.mul_(scale)
        p.grad = grad
        return
    held = p.grad
    if isinstance(held, DTensor) and isinstance(grad, DTensor) and held.placements != grad.placements:
        grad = grad.redistribute(held.device_mesh, held.placements)
    mine = held._local_tensor if isinstance(held, DTensor) else held
    mine.add_(grad._local_tensor if isinstance(grad, DTensor) else grad, alpha=scale)
