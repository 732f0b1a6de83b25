"""``tensoropt.parallelize``: a plan applied to your own ``nn.Module``, for your own training loop.

``pm = tensoropt.parallelize(model, "out/job/plan.json")`` returns the model itself, its class
swapped for a subclass that adds :class:`ParallelModel`'s methods (as FSDP2's ``fully_shard`` and
Meta's autoparallel do), with every parameter and buffer replaced by a DTensor laid out as the plan
says, under the model's own state-dict names. Your methods stay; ``pm.named_parameters()``,
``pm.parameters()``, ``pm.state_dict()`` and ``pm.load_state_dict()`` speak DTensors, so
``torch.optim``, LR schedulers, ``torch.distributed.checkpoint`` and ``get_state_dict`` /
``set_state_dict`` work unchanged. A ZeRO-1/2 parameter is presented as its shard parameter (a
DTensor of the same global shape, sharded further: the optimizer keeps state for the shard only).

The step itself runs as ``tensoropt run`` runs it: the job's training step (the model and its
loss, ``model.loss`` of the plan's job) exported on meta, checked against the plan's graph
fingerprint, interpreted on DTensors, traced once per batch size and replayed as a local program
(:mod:`tensoropt.parallel.runtime`).

Example:
    >>> # not run here: under torchrun, with a plan.json from `tensoropt select`
    >>> pm = parallelize(model, "out/job/plan.json")  # doctest: +SKIP
    >>> loss = pm.train_step({"input_ids": ids, "labels": ids})  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from tensoropt.executor.job.materialize import build_skeleton, materialize
from tensoropt.executor.job.plan import ExecPlan, check_plan_graph
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.executor.program.replay import MODES, check_compile_backend
from tensoropt.executor.state.local_state import LocalState, build_local_state, local_shard, shard_state
from tensoropt.executor.state.mesh import build_mesh, rank_device
from tensoropt.parallel import batches, optim
from tensoropt.parallel.clip import clip_grad_norm
from tensoropt.parallel.runtime import Runtime, compute_dtype, export_module


class ParallelModel:
    """What :func:`parallelize` adds to a model (the returned object is still your model).

    Example:
        >>> # not run here: needs a process group and a plan
        >>> pm = parallelize(model, plan); isinstance(pm, ParallelModel)  # doctest: +SKIP
        True
    """

    @property
    def tensoropt_runtime(self) -> Runtime:
        """This rank's :class:`~tensoropt.parallel.runtime.Runtime` (plan, mesh, shards, programs)."""
        return self.__dict__["_tensoropt_runtime"]

    @property
    def plan(self) -> ExecPlan:
        """The plan the model runs."""
        return self.tensoropt_runtime.plan

    @property
    def input_names(self) -> tuple[str, ...]:
        """The batch's keys: the job's input names, in the step's order."""
        return self.__dict__["_tensoropt_input_names"]

    def rows(self, global_batch_size: int) -> range:
        """The rows of a ``global_batch_size``-row batch this rank needs (all of them where the plan
        does not split the batch). A loader may read only these: ``train_step`` then takes them as
        this rank's part of a global batch of that size.

        Example:
            >>> pm.rows(8)  # rank 1 of a 2-way batch split  # doctest: +SKIP
            range(4, 8)
        """
        rt = self.tensoropt_runtime
        graph = rt.graph(int(global_batch_size))
        spans = {region[0] for region in graph.regions}
        if len(spans) != 1:
            raise batches.BatchError("rows: the plan lays the inputs' batch rows out differently per input; "
                                     "pass the global batch to train_step")
        start, length = spans.pop()
        if length != global_batch_size:
            rt.local_rows[length] = int(global_batch_size)
        return range(start, start + length)

    def regions(self, global_batch_size: int) -> dict[str, tuple[tuple[int, int], ...]]:
        """Input name -> the (start, length) of each dim of it this rank needs, of a
        ``global_batch_size``-row batch: a loader may read only these; ``train_step`` takes tensors
        of exactly these shapes as this rank's part (the plan may split other dims than the batch).

        Example:
            >>> pm.regions(8)  # rank 1 of a 2-way batch split  # doctest: +SKIP
            {'input_ids': ((4, 4), (0, 16)), 'labels': ((4, 4), (0, 16))}
        """
        rt = self.tensoropt_runtime
        graph = rt.graph(int(global_batch_size))
        for (_, length), *_ in graph.regions:
            if length != global_batch_size:
                rt.local_rows[length] = int(global_batch_size)
        return dict(zip(self.input_names, graph.regions))

    def _local_inputs(self, batch):
        rt = self.tensoropt_runtime
        tensors = batches.ordered_inputs(batch, self.input_names)
        graph = self._graph_of_mixed(tensors)
        if graph is not None:  # each input either whole or this rank's region of it
            whole = True
        else:
            rows = batches.batch_rows(tensors, self.input_names)
            whole = rows not in rt.local_rows
            graph = rt.graph(rows if whole else rt.local_rows[rows])
        regional = [tuple(t.shape) == tuple(n for _, n in region)  # a loader read only this rank's region
                    for t, region in zip(tensors, graph.regions)]
        batches.check_samples([t for t, r in zip(tensors, regional) if not r],
                              [n for n, r in zip(self.input_names, regional) if not r],
                              [s for s, r in zip(graph.input_shapes, regional) if not r],
                              [d for d, r in zip(graph.input_dtypes, regional) if not r])
        return graph, batches.cut_regions(tensors, graph.regions, graph.input_dtypes, rt.device, whole)

    def _graph_of_mixed(self, tensors):
        """The step graph of a batch whose inputs hold different row counts because some are this
        rank's region (:meth:`regions`) and the others whole, as a loader reading each input's own
        region gives them (`tensoropt run`'s does); None for any other batch.

        The global batch size is the largest row count, and its graph must be traced already: each
        input's shape is then its region's or its whole shape there.
        """
        rt = self.tensoropt_runtime
        counts = {int(t.shape[0]) for t in tensors if isinstance(t, torch.Tensor) and t.dim()}
        if len(counts) < 2 or max(counts) not in rt.graphs:
            return None
        graph = rt.graphs[max(counts)]
        for t, region, shape in zip(tensors, graph.regions, graph.input_shapes):
            if tuple(t.shape) not in (tuple(n for _, n in region), tuple(shape)):
                return None
        return graph

    def train_step(self, batch, loss_scale: float = 1.0) -> torch.Tensor:
        """Forward, loss and backward of one batch; gradients (times ``loss_scale``) added to ``.grad``.

        Args:
            batch: a mapping of the job's input names to tensors: the global batch (each rank keeps
                its rows) or this rank's rows of one (see :meth:`rows`). A batch of another size
                than the plan's is exported and traced once more.
            loss_scale: multiplies the gradients (``1 / micro_batches`` for accumulation).

        Returns:
            The loss: the global mean over the batch, a plain tensor (unscaled).

        Example:
            >>> loss = pm.train_step({"input_ids": ids, "labels": ids})  # doctest: +SKIP
        """
        graph, local = self._local_inputs(batch)
        return self.tensoropt_runtime.train_step(graph, local, float(loss_scale))

    def eval_step(self, batch) -> torch.Tensor:
        """The loss of a batch, forward only, as ``model.eval()`` computes it: dropout off, batch norm
        on its running statistics; no gradient, no state change (buffers, random state).

        The step's graph with its training flags turned off
        (:func:`~tensoropt.executor.program.eval_graph.eval_graph_module`), laid out by the same plan.

        Example:
            >>> pm.eval_step({"input_ids": ids, "labels": ids})  # doctest: +SKIP
            tensor(5.5012)
        """
        graph, local = self._local_inputs(batch)
        return self.tensoropt_runtime.eval_step(graph, local)

    def trace(self, batch) -> None:
        """Trace the replayed program of this batch's shapes now (else the first ``train_step`` of
        them does): a loop that times its steps calls it before the clock starts. Nothing changes
        (parameters, gradients, buffers, random state); in interpret mode it does nothing.

        Example:
            >>> pm.trace(batch)  # doctest: +SKIP
        """
        graph, local = self._local_inputs(batch)
        self.tensoropt_runtime.trace(graph, local)

    @contextlib.contextmanager
    def no_sync(self):
        """Inside, ``train_step`` accumulates gradients without synchronising them; the first
        ``train_step`` outside synchronises the sum once (DDP's ``no_sync``). ZeRO-3 parameters still
        reduce-scatter in backward (their gradient is sharded as it is made).

        Example:
            >>> with pm.no_sync():  # doctest: +SKIP
            ...     pm.train_step(mb0, loss_scale=0.5)
            >>> pm.train_step(mb1, loss_scale=0.5)  # doctest: +SKIP
        """
        rt = self.tensoropt_runtime
        before, rt.syncing = rt.syncing, False
        try:
            yield
        finally:
            rt.syncing = before

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0,
                        error_if_nonfinite: bool = False) -> torch.Tensor:
        """Clip every gradient to a global norm of ``max_norm``; returns the norm before clipping.

        The same value as ``torch.nn.utils.clip_grad_norm_`` on the plain model: replicated gradients
        counted once, sharded ones summed over their shards (:mod:`tensoropt.parallel.clip`).

        Example:
            >>> norm = pm.clip_grad_norm_(1.0)  # doctest: +SKIP
        """
        self.tensoropt_runtime.check_synchronised()
        self.tensoropt_runtime.unscale()  # fp16-mixed: the norm of the true gradients (GradScaler's unscale_)
        return clip_grad_norm(self.parameters(), max_norm, norm_type, error_if_nonfinite)

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], strict: bool = True,
                        assign: bool = False):
        """Copy values into the parallel parameters and buffers: DTensors (any placements: they are
        redistributed) or full plain tensors (this rank keeps its shard).

        Example:
            >>> pm.load_state_dict(torch.load("model.pt"))  # doctest: +SKIP
        """
        own = self.state_dict(keep_vars=True)
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            raise RuntimeError(f"load_state_dict: missing keys {missing[:5]}, unexpected keys "
                               f"{unexpected[:5]} ({type(self).__name__})")
        with torch.no_grad():
            for key, target in own.items():
                if key not in state_dict:
                    continue
                _copy_into(key, target, state_dict[key])
        self.tensoropt_runtime.after_optimizer_step()  # ZeRO shards -> the parameters the step reads
        return nn.modules.module._IncompatibleKeys(missing, unexpected)


def _copy_into(key: str, target: torch.Tensor, value: torch.Tensor) -> None:
    if tuple(value.shape) != tuple(target.shape):
        raise RuntimeError(f"load_state_dict: {key!r} has shape {list(value.shape)}, the model's "
                           f"{list(target.shape)}")
    if isinstance(target, DTensor):
        if isinstance(value, DTensor):
            value = value.redistribute(target.device_mesh, target.placements)._local_tensor
        else:
            value = local_shard(value.detach(), target.device_mesh,
                                _layout_of(target), target._local_tensor.device)._local_tensor
        target._local_tensor.copy_(value)
    else:
        target.copy_(value.full_tensor() if isinstance(value, DTensor) else value)


def _layout_of(t: DTensor) -> tuple[str, ...]:
    from torch.distributed.tensor import Shard

    return tuple(f"S({p.dim})" if isinstance(p, Shard) else "R" for p in t.placements)


def plan_document(plan) -> dict:
    """The plan.json document of ``plan``: a path, its dict, or an :class:`ExecPlan` (no job then).

    Example:
        >>> plan_document({"mesh": {"shape": [], "levels": []}, "placements": {}})["placements"]
        {}
    """
    if isinstance(plan, ExecPlan):
        return plan.to_json()
    if isinstance(plan, Mapping):
        return dict(plan)
    path = Path(plan)
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"parallelize: cannot read plan file {path}: {err}") from None


def _step_module(model: nn.Module, job: dict) -> tuple[nn.Module, str]:
    """(the job's training step around ``model``, the prefix of the model's keys in it)."""
    from tensoropt.config import Job

    m = Job.from_dict(job).model
    if not m.contract:
        return model, ""
    from tensoropt.models.contract import training_step

    return training_step(model, m.inputs, m.targets, m.loss), "model."


def _has_meta(module: nn.Module) -> bool:
    return any(t.is_meta for t in module.parameters())


def _check_same_keys(module: nn.Module, reference: nn.Module, plan_id: str) -> None:
    mine = {k: tuple(p.shape) for k, p in module.named_parameters(remove_duplicate=False)}
    ref = {k: tuple(p.shape) for k, p in reference.named_parameters(remove_duplicate=False)}
    for key in sorted(set(mine) | set(ref)):
        if mine.get(key) != ref.get(key):
            raise ValueError(f"parallelize: parameter {key!r} is {mine.get(key)} in the model but "
                             f"{ref.get(key)} in plan {plan_id}'s job model; pass the model the job's "
                             "factory builds, or re-plan for this one")


def parallelize(model: nn.Module, plan, *, mode: str = "replay", compile: str = "none") -> ParallelModel:
    """Apply a plan to ``model`` on this rank; returns the model as a :class:`ParallelModel`.

    Args:
        model: the ``nn.Module`` the plan's job builds (its factory's model; for a job with
            ``model.loss`` the job's loss is added around it, as the planner captured it). On
            ``meta``: its weights are made as ``tensoropt run`` makes them (seeded init, this rank's
            shards only). With real weights (``from_pretrained``): this rank keeps its shards, and
            the model no longer holds the full tensors (drop your references to free them).
        plan: a plan.json path, its dict, or an :class:`ExecPlan`; it must carry its ``job``
            (plan.json files from ``tensoropt select`` do).
        mode: ``"replay"`` (default: traced once per batch size, replayed) or ``"interpret"``.
        compile: ``"none"`` or ``"inductor"``.

    Raises:
        ValueError: the plan has no job, needs another world size, or was made for another graph
            (:class:`~tensoropt.executor.job.plan.PlanGraphMismatch` names the first differing node).

    Example:
        >>> pm = parallelize(model, "out/job/plan.json")  # under torchrun  # doctest: +SKIP
    """
    if mode not in MODES:
        raise ValueError(f"parallelize: mode {mode!r} is not one of {MODES}")
    check_compile_backend(compile)
    if isinstance(model, ParallelModel):
        raise ValueError("parallelize: the model is already parallelized")
    doc = plan_document(plan)
    exec_plan = ExecPlan.from_json(doc)
    if not doc.get("job"):
        raise ValueError(f"parallelize: plan {exec_plan.plan_id} carries no job (its model, inputs, loss); "
                         "use a plan.json written by `tensoropt select`")
    spec = TrainSpec.from_job(doc["job"])
    mesh = build_mesh(exec_plan)  # refuses another world size
    device = rank_device()
    step, prefix = _step_module(model, spec.job)
    ep = export_module(step, spec, spec.global_batch_size, device)
    from tensoropt.capture.graph import build_graph

    graph = build_graph(ep)
    source = "the plan" if not isinstance(plan, (str, Path)) else str(plan)
    warnings = check_plan_graph(exec_plan, graph, spec.job, source=source, dtypes=spec.dtype != "float64")
    for warning in warnings:
        if not dist.is_initialized() or dist.get_rank() == 0:
            print(f"[tensoropt] warning: {warning}", flush=True)
    operands = {n: d["operands"] for n, d in graph.nx.nodes(data=True)}
    originals = dict(step.named_parameters(remove_duplicate=False))
    if _has_meta(step):  # made as `tensoropt run` makes them: seeded, module by module
        skeleton = build_skeleton(spec)
        _check_same_keys(step, skeleton.module, exec_plan.plan_id)
        fill = lambda keep: materialize(skeleton, keep)  # noqa: E731
        host_buffers = skeleton.buffers()
        host_buffers.update({k: b for k, b in step.named_buffers(remove_duplicate=False) if not b.is_meta})
    else:
        groups: dict[int, tuple[list[str], torch.Tensor]] = {}
        for key, p in originals.items():
            groups.setdefault(id(p), ([], p))[0].append(key)

        def fill(keep):
            for keys, p in groups.values():
                keep(keys, p.detach())

        host_buffers = dict(step.named_buffers(remove_duplicate=False))
        if any(b.is_meta for b in host_buffers.values()):
            host_buffers.update({k: b for k, b in build_skeleton(spec).buffers().items()
                                 if host_buffers[k].is_meta})
    local = shard_state(ep, operands, step, exec_plan, mesh, device, fill, host_buffers, compute_dtype(spec),
                        name=spec.model)
    return _parallel_model(model, step, local, exec_plan, spec, mesh, device, mode, compile,
                           {k.removeprefix(prefix): p for k, p in originals.items()})


def parallelize_spec(spec: TrainSpec, plan: ExecPlan, *, mode: str = "replay",
                     compile: str = "none") -> ParallelModel:
    """The :class:`ParallelModel` of a :class:`~tensoropt.executor.job.spec.TrainSpec`'s model under
    ``plan``: what ``tensoropt run`` trains (its specs may carry no job: tests and benchmarks build
    them). The model is built on meta and this rank's shards made as :func:`parallelize` makes them
    from a meta model (seeded init, or the job's ``model.checkpoint``:
    :func:`~tensoropt.executor.state.local_state.build_local_state`); the plan is checked against the graph.

    Example:
        >>> pm = parallelize_spec(spec, plan)  # under torchrun  # doctest: +SKIP
    """
    if mode not in MODES:
        raise ValueError(f"executor.mode: {mode!r} is not one of {MODES}")
    check_compile_backend(compile)
    mesh = build_mesh(plan)
    device = rank_device()
    local = build_local_state(spec, plan, mesh, device)
    # a plan made for another graph is refused, never guessed (float64: a numerical check of its layouts)
    if plan.mesh.shape or plan.placements:
        from tensoropt.capture.graph import build_graph

        warnings = check_plan_graph(plan, build_graph(local.ep), spec.job, dtypes=spec.dtype != "float64")
        if warnings and (not dist.is_initialized() or dist.get_rank() == 0):
            for warning in warnings:
                print(f"[tensoropt] warning: {warning}", flush=True)
    module = local.module  # the exported module, on meta: its slots receive the shards
    return _parallel_model(module, module, local, plan, spec, mesh, device, mode, compile, {})


def _parallel_model(model: nn.Module, step: nn.Module, local: LocalState, plan: ExecPlan, spec: TrainSpec,
                    mesh, device: torch.device, mode: str, compile: str,
                    originals: dict[str, torch.Tensor]) -> ParallelModel:
    """``model`` made a :class:`ParallelModel`: the runtime over ``local``, its parameters installed
    in ``step`` (the module exported: ``model`` or the job's loss around it)."""
    runtime = Runtime(step, local, plan, spec, mesh, device, mode=mode, compile=compile)
    installed = _install(step, runtime, local)
    runtime.installed = list({id(p): p for p in installed.values()}.values())
    model.__class__ = _parallel_class(type(model))
    model.__dict__["_tensoropt_runtime"] = runtime
    model.__dict__["_tensoropt_input_names"] = tuple(spec.input_names) or tuple(runtime.graphs[
        spec.global_batch_size].input_names)
    optim.register(runtime, installed, originals)
    return model


def _install(step: nn.Module, runtime: Runtime, local) -> dict[str, torch.Tensor]:
    """Put the parallel parameters (ZeRO shard parameters where they exist) and buffers into the
    module's slots; returns key -> installed parameter."""
    shown = runtime.optimizer_params()
    installed = {}
    for key, canon in local.param_of.items():
        module, name = _owner(step, key)
        module._parameters[name] = shown[canon]
        installed[key] = shown[canon]
    for key, value in local.buffers.items():
        module, name = _owner(step, key)
        if name in module._buffers:
            module._buffers[name] = value
    return installed


def _owner(root: nn.Module, key: str) -> tuple[nn.Module, str]:
    *path, name = key.split(".")
    module = root
    for part in path:
        module = getattr(module, part)
    return module, name


_CLASSES: dict[type, type] = {}


def _parallel_class(cls: type) -> type:
    """``Parallel<cls>``: a subclass of ``cls`` with :class:`ParallelModel`'s methods first."""
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Parallel{cls.__name__}", (ParallelModel, cls), {"__module__": cls.__module__})
    return _CLASSES[cls]
