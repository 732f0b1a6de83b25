"""A rank's training state for one plan: the exported program and only its shards of the weights.

:func:`build_local_state` builds the model on meta (:mod:`tensoropt.executor.job.materialize`),
exports it on meta inputs (:mod:`tensoropt.executor.job.meta_export`), picks each parameter's layout
from the plan, then materialises the parameters one module at a time, keeping this rank's local
shard of each (:func:`local_shard`): neither the whole model nor the global batch is ever
allocated. With ``model.checkpoint`` in the job the values come from that file instead
(:mod:`tensoropt.executor.state.model_checkpoint`).

Example:
    >>> # not run here: needs a device mesh (a process group)
    >>> state = build_local_state(spec, plan, mesh, torch.device("cpu"))  # doctest: +SKIP
    >>> state.params["fc1.weight"].to_local().shape  # doctest: +SKIP
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DeviceMesh, DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from tensoropt.capture.graph import build_graph
from tensoropt.configspace.configuration import Layout
from tensoropt.executor.job.materialize import Skeleton, build_skeleton, materialize
from tensoropt.executor.job.meta_export import export_on_meta, meta_inputs
from tensoropt.executor.job.plan import ExecPlan
from tensoropt.executor.job.program import Signature, signature
from tensoropt.executor.ops.placements import normalise, to_placements
from tensoropt.executor.state import model_checkpoint
from tensoropt.executor.state.mixed_precision import compute_module, to_compute


@dataclass
class LocalState:
    """What :class:`~tensoropt.training.trainer.Trainer` trains on this rank.

    Attributes:
        ep: the exported program (meta state; tensors it creates go to the rank's device).
        operands: OpGraph node name -> its operands (capture's view of the graph).
        sig: placeholder roles of ``ep``.
        param_of: parameter state-dict key -> canonical key (tied keys share one parameter).
        layouts: canonical key -> the layout the parameter is stored in.
        params: canonical key -> parameter (a DTensor on a mesh, else a plain tensor).
        buffers: buffer key -> value (DTensor on a mesh).
        constants: lifted constant key -> value.
    """

    ep: torch.export.ExportedProgram
    operands: dict[str, list[dict]]
    sig: Signature
    param_of: dict[str, str]
    layouts: dict[str, Layout]
    params: dict[str, torch.nn.Parameter]
    buffers: dict[str, torch.Tensor]
    constants: dict[str, object]
    module: torch.nn.Module | None = None
    """The module exported, on meta (float32 in a mixed precision), when :func:`build_local_state`
    built it."""


def build_local_state(spec, plan: ExecPlan, mesh: DeviceMesh | None, device: torch.device) -> LocalState:
    """Export ``spec``'s model on meta and materialise this rank's shards of its parameters.

    Args:
        spec: the :class:`~tensoropt.executor.job.spec.TrainSpec`.
        plan: the plan (its placements give each parameter's layout).
        mesh: the plan's device mesh, or None for one process.
        device: where the local shards live.

    Example:
        >>> # not run here: needs a device mesh (a process group)
        >>> build_local_state(spec, plan, None, torch.device("cpu")).params  # doctest: +SKIP
    """
    skeleton = build_skeleton(spec)
    ep, operands = _exported(spec, skeleton, device)
    checkpoint = _checkpoint_path(spec)

    def fill(keep) -> None:
        if checkpoint is not None:
            model_checkpoint.load_values(checkpoint, skeleton.module, keep)
        else:
            materialize(skeleton, keep)

    host_buffers = skeleton.buffers()
    if checkpoint is not None:
        host_buffers.update(model_checkpoint.buffer_values(checkpoint, host_buffers))
    compute = getattr(torch, spec.mixed.compute_dtype) if spec.mixed is not None else None
    state = shard_state(ep, operands, skeleton.module, plan, mesh, device, fill, host_buffers, compute,
                        name=spec.model)
    state.module = skeleton.module
    return state


def shard_state(ep, operands: dict[str, list[dict]], module: torch.nn.Module, plan: ExecPlan,
                mesh: DeviceMesh | None, device: torch.device, fill, host_buffers: dict[str, torch.Tensor],
                compute: torch.dtype | None = None, name: str = "model") -> LocalState:
    """This rank's :class:`LocalState` of an exported model whose parameter values ``fill`` gives.

    Args:
        ep, operands: the model exported on meta, and its OpGraph operands.
        module: the exported module (its ``named_parameters`` name the keys; tied ones share a tensor).
        plan, mesh, device: the plan, its mesh (None for one process), where the shards live.
        fill: ``fill(keep)`` calls ``keep(keys, full_host_value)`` once (or more: the last wins) for
            every parameter (:func:`~tensoropt.executor.job.materialize.materialize`, a checkpoint, or a
            module's own weights); only this rank's shard of each value is kept.
        host_buffers: buffer key -> host value (non-persistent buffers included).
        compute: a mixed precision's compute dtype for buffers and constants, or None.
        name: the model's name in messages.

    Example:
        >>> # not run here: needs a device mesh (a process group)
        >>> shard_state(ep, operands, module, plan, mesh, device, fill, buffers)  # doctest: +SKIP
    """
    sig = signature(ep)
    state = dict(module.named_parameters(remove_duplicate=False))
    first_key_of: dict[int, str] = {}  # tied parameters (one tensor under several keys) stay one
    param_of = {key: first_key_of.setdefault(id(state[key]), key) for key in sig.params.values()}
    ndim = len(plan.mesh.shape)
    layouts_all = canonical_layouts(ep, plan, operands, ndim)
    used = {sig.params[n.name] for n in ep.graph.nodes
            if n.op == "placeholder" and n.name in sig.params and n.users}
    layouts: dict[str, Layout] = {}
    for key, canon in sorted(param_of.items(), key=lambda kv: kv[0] not in used):
        layouts.setdefault(canon, layouts_all[key])
    params: dict[str, torch.nn.Parameter] = {}
    wanted = set(param_of.values())

    def keep(keys: list[str], value: torch.Tensor) -> None:
        canon = next((param_of[k] for k in keys if k in param_of), None)
        if canon is not None and canon in wanted:
            params[canon] = torch.nn.Parameter(local_shard(value, mesh, layouts[canon], device),
                                               requires_grad=state[canon].requires_grad)

    fill(keep)
    params = {canon: params[canon] for canon in dict.fromkeys(param_of.values())}
    buffers = {key: local_shard(to_compute(host_buffers[key], compute), mesh, layouts_all[key], device)
               for key in dict.fromkeys(sig.buffers.values())}
    constants = {}
    for key in dict.fromkeys(sig.constants.values()):
        value = host_buffers.get(key, ep.constants[key])  # a non-persistent buffer is lifted as a constant
        value = to_compute(value, compute)
        if isinstance(value, torch.Tensor):
            if value.is_meta:
                raise ValueError(f"model {name!r}: tensor constant {key!r} has no value: the "
                                 "module holds it as a tensor on the meta device; build the model's tensor "
                                 "attributes on the CPU (only parameters may be on meta)")
            value = local_shard(value, mesh, ("R",) * ndim, device)
        constants[key] = value
    return LocalState(ep, operands, sig, param_of, layouts, params, buffers, constants)


def local_shard(value: torch.Tensor, mesh: DeviceMesh | None, layout: Layout,
                device: torch.device) -> torch.Tensor:
    """This rank's shard of a full host ``value`` in ``layout``, as a DTensor owning its storage.

    Only the shard is copied to ``device`` (the full value is never moved there); without a mesh
    the whole value is.

    Example:
        >>> local_shard(torch.arange(4.0), None, (), torch.device("cpu"))
        tensor([0., 1., 2., 3.])
    """
    value = value.detach()
    if mesh is None:
        return value.to(device, copy=value.device != device)
    placements = to_placements(normalise(layout, value.dim()))
    shape, offset = compute_local_shape_and_global_offset(value.shape, mesh, placements)
    local = value
    for dim, (length, start) in enumerate(zip(shape, offset)):
        if length != value.shape[dim]:
            local = local.narrow(dim, start, length)
    if local is not value or value.device != device:
        local = local.to(device, copy=True).contiguous()
    return DTensor.from_local(local, mesh, placements, run_check=False, shape=value.shape,
                              stride=value.stride())


def canonical_layouts(ep, plan: ExecPlan, operands: dict[str, list[dict]], ndim: int) -> dict[str, Layout]:
    """State-dict key -> layout it is stored in: that of the first node using it (R if none names it).

    A parameter used by several nodes (tied embeddings) is stored once and redistributed per use.

    Example:
        >>> # not run here: needs a device mesh (a process group)
        >>> canonical_layouts(ep, plan, operands, 1)["fc1.weight"]  # doctest: +SKIP
        ('S0',)
    """
    sig = signature(ep)
    out: dict[str, Layout] = {}
    for node in ep.graph.nodes:
        config = plan.placements.get(node.name)
        if config is None:
            continue
        layouts = dict(config.params)
        for o in operands.get(node.name, []):
            key = o.get("key")
            if o["role"] == "param" and key not in out and key in layouts:
                out[key] = tuple(layouts[key])
    for key in [*sig.params.values(), *sig.buffers.values()]:
        out.setdefault(key, ("R",) * ndim)
    return out


def _checkpoint_path(spec) -> str | None:
    """The job's ``model.checkpoint`` (None without a job or without one)."""
    return ((spec.job or {}).get("model") or {}).get("checkpoint")


_EXPORTS: dict[str, tuple] = {}


def _exported(spec, skeleton: Skeleton, device: torch.device):
    """The exported program and OpGraph operands of a spec's model (cached per spec and device).

    The graph is the same for every plan of one model; it holds no weights (exported on meta).
    """
    key = json.dumps(spec.to_json(), sort_keys=True, default=str) + str(device)
    if key not in _EXPORTS:
        compute = getattr(torch, spec.mixed.compute_dtype) if spec.mixed is not None else None
        module = compute_module(skeleton.module, compute)  # mixed: float32 weights, the graph in 16 bits
        ep = export_on_meta(Skeleton(module, skeleton.seed), meta_inputs(spec), device)
        operands = {n: d["operands"] for n, d in build_graph(ep).nx.nodes(data=True)}
        _EXPORTS.clear()
        _EXPORTS[key] = (ep, operands)
    return _EXPORTS[key]
