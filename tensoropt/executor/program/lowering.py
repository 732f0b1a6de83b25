"""Lower one training step of a plan to a local program: ``make_fx`` over the DTensor interpreter.

The :class:`~tensoropt.executor.program.interpreter.PlanInterpreter` stays the reference and becomes the
tracer. :func:`lower_step` runs one step through it under ``make_fx`` (real tensors, the same
collectives on every rank): the parameters enter as DTensor leaves built on their local tensors,
forward follows the plan's layouts, ``loss.backward()`` runs DTensor's autograd, each gradient's
synchronisation is traced where its hook fires (the data-parallel buckets of
:class:`~tensoropt.executor.state.gradsync.GradSync` in functional mode, ZeRO-2's reduce-scatter, any
other redistribution to the parameter's placement), recompute and ZeRO-3 through the
interpreter's saved-tensor recipes. What comes out is an ``fx.GraphModule`` of local aten ops and
``_c10d_functional`` collectives with their waits:

    inputs:  local parameter tensors, then the local values of the other placeholders (buffers,
             constants, the batch shard), then the whole labels of each partial loss (its count of
             valid labels, computed in the graph with no collective)
    outputs: the loss (summed over the ranks where it is a partial sum: :func:`reported_loss`), local
             gradients (the parameters' placements), local ZeRO-2 gradient shards

:func:`defer_waits` then moves each ``wait_tensor`` to right before the first op that reads its
result, so a bucket's all-reduce, issued as soon as its last gradient exists, runs while the rest
of backward does (no dead-code elimination: every collective stays). The graph is rank-specific
and shape-specialised; :mod:`tensoropt.executor.program.replay` keeps one per input shapes. Buffers are
traced on copies and the RNG state is restored, so tracing changes nothing the replay sees.

Example:
    >>> # not run here: needs a Trainer on a process group
    >>> lowered = lower_step(trainer, trainer._placeholder_values(trainer.batch(0)))  # doctest: +SKIP
    >>> outputs = lowered.gm(*lowered.flat_inputs(values))  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx
from torch._guards import TracingContext, tracing
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.fx.experimental.proxy_tensor import make_fx

from tensoropt.executor.program.graph_passes import hoist_collectives, reinplace_collectives, sink_waits
from tensoropt.executor.state.gradsync import GradSync

_WAIT = torch.ops._c10d_functional.wait_tensor.default


def _local(t):
    return t._local_tensor if isinstance(t, DTensor) else t


@dataclass
class LoweredStep:
    """One traced training step of one rank.

    Attributes:
        gm: the local program (``gm(*inputs)`` -> ``[loss, *grads, *shard_grads]``, plain tensors).
        param_keys: state-dict keys of the parameters, the first graph inputs in this order.
        value_slots: for each placeholder of the exported graph that is not a parameter, its index in
            the interpreter's placeholder values when its local tensor is a graph input (in order).
        label_inputs: graph input names whose whole value (every rank holds it) follows the slots.
        grad_keys: parameters whose gradient follows the loss in the outputs (parameter placement).
        shard_grad_keys: ZeRO-2 parameters whose gradient shard follows the gradients.
        loss_spec: the loss's DTensor spec (its placements: Partial where it is a per-rank share), or
            None on a plain single-process run.
        traced_nodes: operator nodes (``call_function``, waits included) as traced, before any pass
            removes some: the unit of the runtime memory a program costs (:mod:`estimators.peak`).
    """

    gm: fx.GraphModule
    param_keys: tuple[str, ...]
    value_slots: tuple[int, ...]
    label_inputs: tuple[str, ...]
    grad_keys: tuple[str, ...]
    shard_grad_keys: tuple[str, ...]
    loss_spec: DTensorSpec | None
    traced_nodes: int = 0
    grad_specs: tuple = ()
    """Each output gradient's DTensor spec as traced (None for a plain tensor): the parameter's own
    placements, or a partial sum in a program traced without gradient synchronisation."""

    def flat_inputs(self, params: dict[str, torch.Tensor], values: list,
                    whole: dict[str, torch.Tensor]) -> list:
        """The graph's inputs: parameters' local tensors, placeholder values' local tensors, labels.

        Example:
            >>> # not run here: needs a Trainer on a process group
            >>> lowered.flat_inputs(trainer.params, values, {"y": y})  # doctest: +SKIP
        """
        return ([_local(params[k]) for k in self.param_keys] + [_local(values[i]) for i in self.value_slots]
                + [whole[name] for name in self.label_inputs])

    def collectives(self) -> int:
        """Number of functional collectives in the program (each with its wait).

        Example:
            >>> lowered.collectives()  # needs a Trainer on a process group  # doctest: +SKIP
            3
        """
        return sum(1 for n in self.gm.graph.nodes
                   if n.op == "call_function" and str(n.target).startswith("_c10d_functional.")
                   and n.target is not _WAIT)


def overlapped_nodes(gm: fx.GraphModule) -> int:
    """Compute nodes that run while a functional collective is in flight (between it and its wait).

    Example:
        >>> overlapped_nodes(fx.symbolic_trace(torch.nn.ReLU()))
        0
    """
    inflight: set[fx.Node] = set()
    count = 0
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        name = str(n.target)
        if n.target is _WAIT:
            inflight.discard(n.args[0])
        elif name.startswith("_c10d_functional."):
            inflight.add(n)
        elif inflight:
            count += 1
    return count


def shared_fake_mode():
    """A context under which ``make_fx(tracing_mode="real")`` gives every node one shared fake mode.

    A real-tensor trace records each node's ``meta["val"]`` as a fake tensor of its output; with no
    fake mode in reach, torch makes a new ``FakeTensorMode`` per node, and each keeps the Python
    stack it was made in (``traceback.extract_stack``, ~60 frames and the source lines they read),
    held by the graph as long as the program lives: 15 KiB of resident memory per program node
    measured on torch 2.13 (an MLP's 1174-node program: 21.5 -> 6.1 MiB above the interpreted
    step; the tiny HF Llama's peak 27.8 -> 20.9 MiB). Under a :class:`TracingContext` holding one
    mode, ``detect_fake_mode`` returns it for every node instead; the graph is the same.

    Example:
        >>> with shared_fake_mode():
        ...     gm = make_fx(lambda x: x.relu() + 1, tracing_mode="real")(torch.ones(2))
        >>> len({id(n.meta["val"].fake_mode) for n in gm.graph.nodes if "val" in n.meta})
        1
    """
    return tracing(TracingContext(FakeTensorMode(allow_fallback_kernels=True)))


def lower_step(trainer, values: list, reinplace: bool = True, sync_grads: bool = True) -> LoweredStep:
    """Trace one training step of ``trainer`` (a :class:`~tensoropt.parallel.runtime.StepGraph`:
    its interpreter, parameters and ZeRO state).

    Args:
        trainer: the rank's trainer (its interpreter, parameters, ZeRO state and mesh).
        values: the interpreter's placeholder values of one step (``trainer._placeholder_values``):
            they give the shapes the program is specialised to and the non-parameter inputs.
        reinplace: write each gradient bucket's all-reduce into its ``cat`` (no copy per step:
            :func:`~tensoropt.executor.program.graph_passes.reinplace_collectives`); False for a program
            Inductor compiles.
        sync_grads: synchronise the gradients in the program (False: each comes out as backward
            left it, a partial sum where it is one, for accumulation over micro-batches; ZeRO-2
            parameters too, their full gradient: :mod:`tensoropt.parallel`'s ``no_sync``).

    Returns:
        The traced step; tracing leaves the trainer's parameters, buffers, gradients, optimizer
        and RNG state as they were.

    Example:
        >>> # not run here: needs a Trainer on a process group
        >>> lowered = lower_step(trainer, trainer._placeholder_values(trainer.batch(0)))  # doctest: +SKIP
    """
    interp = trainer.interpreter
    sig = trainer.sig
    placeholders = [n for n in interp.graph.nodes if n.op == "placeholder"]
    param_keys = tuple(trainer.params)
    value_slots = tuple(i for i, n in enumerate(placeholders)
                        if n.name not in sig.params and isinstance(values[i], torch.Tensor))
    label_inputs = tuple(dict.fromkeys(labels.name for _, labels, _ in interp._losses
                                       if labels.name in interp.global_inputs))
    zero2 = {k: s for k, s in trainer.zero.sharded.items() if s.grads_too}
    outputs: dict[str, object] = {}

    def step(*flat):
        flat = list(flat)
        leaves = {}
        for key, t in zip(param_keys, flat):
            p = trainer.params[key]
            if isinstance(p, DTensor):
                leaves[key] = DTensor(t, p._spec, requires_grad=p.requires_grad)
            else:
                leaves[key] = t.detach().requires_grad_(p.requires_grad)
        key_of = {id(leaf): key for key, leaf in leaves.items()}
        rest = iter(flat[len(param_keys):])
        slot_values = {i: next(rest) for i in value_slots}
        whole = {name: next(rest) for name in label_inputs}
        step_values = []
        for i, n in enumerate(placeholders):
            if n.name in sig.params:
                step_values.append(leaves[trainer.param_of[sig.params[n.name]]])
            elif i in slot_values:
                v = values[i]
                step_values.append(DTensor(slot_values[i], v._spec, requires_grad=False)
                                   if isinstance(v, DTensor) else slot_values[i])
            else:
                step_values.append(values[i])
        sync = GradSync(leaves.values(), functional=True)
        shard_grads: dict[str, torch.Tensor] = {}

        def on_grad(leaf):
            if not sync_grads:
                return
            key = key_of.get(id(leaf))
            if key in zero2 and isinstance(leaf.grad, DTensor):  # ZeRO-2: reduce-scatter to the shard
                grad, leaf.grad = leaf.grad, None
                shard = zero2[key].shard
                moved = grad.redistribute(shard.device_mesh, shard.placements)
                shard_grads[key] = moved if key not in shard_grads else shard_grads[key] + moved
            else:
                sync.add(leaf)

        hooks = [leaf.register_post_accumulate_grad_hook(on_grad) for leaf in leaves.values()
                 if isinstance(leaf, DTensor) and leaf.requires_grad]
        interp.on_grad = on_grad  # the whole-graph local mode sets its leaves' gradients itself
        interp.global_inputs = whole
        out = interp.run(*step_values)
        loss = out[0] if isinstance(out, (tuple, list)) else out
        reported, reported_spec = reported_loss(loss)  # issued here, waited for at the program's end
        loss.backward()
        if sync_grads:
            sync.finish()
        # leaf -> its hook (held in C++, which the garbage collector cannot see) -> on_grad -> sync ->
        # sync.params -> leaf: a cycle nothing collects, which kept the traced leaves and their
        # gradients (the buckets: every synchronised gradient's bytes) for the whole run
        for handle in hooks:
            handle.remove()
        sync.params.clear()
        grad_keys = [k for k in param_keys if leaves[k].grad is not None]
        outputs.update(grad_keys=tuple(grad_keys), shard_grad_keys=tuple(shard_grads),
                       loss_spec=reported_spec,
                       grad_specs=tuple(leaves[k].grad._spec if isinstance(leaves[k].grad, DTensor) else None
                                        for k in grad_keys))
        return [reported, *[_local(leaves[k].grad) for k in grad_keys],
                *[_local(g) for g in shard_grads.values()]]

    flat = [_local(trainer.params[k]).detach() for k in param_keys]
    for i in value_slots:  # copies: traced in-place updates (batch-norm statistics) must not land twice
        local = _local(values[i]).detach()
        flat.append(local.clone() if placeholders[i].name in sig.buffers else local)
    flat += [interp.global_inputs[name] for name in label_inputs]
    saved = (interp.on_grad, interp.global_inputs, dict(interp._leaves))
    rng = torch.random.get_rng_state()
    try:
        # the trace needs autograd even when called under no_grad; one fake mode for every node's
        # meta["val"] (see :func:`shared_fake_mode`)
        with torch.enable_grad(), shared_fake_mode():
            gm = make_fx(step, tracing_mode="real")(*flat)
    finally:
        interp.on_grad, interp.global_inputs, interp._leaves = saved
        # fx.Interpreter.run keeps ``iter(args)`` and its ``env`` (the output: the loss, whose autograd
        # graph holds the traced step's leaves and their gradients, a model's worth) until its next
        # run, and the batch with them: drop both, so the trace leaves no real tensor behind
        interp.args_iter, interp.env = iter(()), {}
        torch.random.set_rng_state(rng)
    traced_nodes = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    defer_waits(gm)
    hoist_collectives(gm)  # the label count's all-reduce runs while forward does
    sink_waits(gm)  # the loss value's all-reduce is waited at the end, not at the loss
    if reinplace:
        reinplace_collectives(gm)
    return LoweredStep(gm, param_keys, value_slots, label_inputs, outputs["grad_keys"],
                       outputs["shard_grad_keys"], outputs["loss_spec"], traced_nodes, outputs["grad_specs"])


def reported_loss(loss: torch.Tensor) -> tuple[torch.Tensor, DTensorSpec | None]:
    """The loss as a traced step reports it: (its local value, its DTensor spec or None).

    A loss left a partial sum over some mesh axes (each rank's share of a mean, read only after the
    step) is summed over them here, by functional all-reduces: in the replayed program each is
    issued right after forward and waited for at the program's end (:func:`defer_waits`), so the
    reported value costs no blocking collective after the step, where
    :func:`~tensoropt.parallel.runtime.read_loss` would sum it (the same all-reduce of the same
    values: the same result). Any other loss is returned as it is.

    Example:
        >>> reported_loss(torch.tensor(2.0))
        (tensor(2.), None)
    """
    if not isinstance(loss, DTensor):
        return loss.detach(), None
    local = loss._local_tensor.detach()
    placements = loss.placements
    summed = [axis for axis, p in enumerate(placements) if p.is_partial() and p.reduce_op == "sum"]
    if not summed or any(not p.is_replicate() and axis not in summed for axis, p in enumerate(placements)):
        return local, loss._spec
    for axis in summed:  # the raw ops (no AsyncCollectiveTensor): one wait each, which defer_waits can move
        group = loss.device_mesh.get_group(axis).group_name
        local = _WAIT(torch.ops._c10d_functional.all_reduce.default(local, "sum", group))
    return local, DTensorSpec(loss.device_mesh, tuple(Replicate() for _ in placements),
                              tensor_meta=loss._spec.tensor_meta)


def defer_waits(gm: fx.GraphModule) -> int:
    """Move every ``wait_tensor`` to right before the first node that reads it; returns how many moved.

    ``make_fx`` records a functional collective's wait right after it; deferred, the collective
    runs while the ops in between do (a gradient bucket's all-reduce beside the rest of backward).
    Nothing is removed.

    Example:
        >>> def f(x):
        ...     return torch.ops._c10d_functional.wait_tensor(x) + 1, x * 2
        >>> gm = make_fx(f)(torch.ones(1))
        >>> defer_waits(gm)
        0
    """
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    moved = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not _WAIT or not node.users:
            continue
        first = min(node.users, key=order.__getitem__)
        if order[first] > order[node] + 1:
            first.prepend(node)
            moved += 1
    gm.graph.lint()
    gm.recompile()
    return moved
