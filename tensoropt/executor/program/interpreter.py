"""Runs an exported graph on DTensors, node by node, exactly as a plan lays it out.

For each node the plan names (a compute node of the OpGraph), :class:`PlanInterpreter`

1. lays out each operand: an activation to the configuration's input layout, a parameter to
   its parameter layout. When views lie between the producer and the operand (folded into the
   OpGraph edge), the producer's value is first redistributed to the layout whose image through
   the views is the target (the views' ``dim_map``), then the views are replayed: DTensor never
   gets to all-gather inside a view on its own;
2. runs the op (through :mod:`tensoropt.executor.ops.explicit_ops` where DTensor is wrong);
3. checks the placement DTensor produced against the configuration's raw output layout
   (``output`` with ``"P"`` on ``partial_axes``) and raises :class:`PlacementMismatch` naming
   the node when they differ, instead of letting a silent all-gather or a wrong shard through;
4. reduces the partial axes (Partial -> the configuration's output layout).

View nodes are evaluated lazily (by their consumers); static nodes (built from buffers and
constants only, e.g. ``arange``) run as they are, a plain tensor result wrapped as replicated.

A plan that is a pure batch split throughout (every node :func:`estimators.overhead.batch_local`,
each consuming its producers' layout unchanged: data parallelism of an MLP) needs no
communication in forward; it runs as a whole on local tensors, as DDP does: the parameters'
local tensors as leaves whose gradients become Partial(sum) DTensor gradients (``on_grad`` is
then told, for the bucketed all-reduce), the batch-split cross entropy through
:func:`local_ops.partial_mean_cross_entropy`.

In both modes a plain-mean cross entropy that is the graph's output returns the loss as a
Partial(sum) DTensor (each rank's share of the global mean), summed only when read after the
step; the count of valid labels comes from an all-reduce launched when forward starts
(:meth:`_launch_label_counts`: ranks hold only their rows of the batch), or from
:attr:`global_inputs` where a caller holds a step's whole labels. Forward then has no blocking
collective for the loss; where the loss feeds further ops it is the replicated mean
(:func:`local_ops.mean_cross_entropy`, one blocking all-reduce). A batch-split mse_loss runs on the
local rows (:func:`local_ops.mse_loss`: a Partial(sum) share, the mean's divisor from the shapes), left
partial when it is the graph's output, else summed. DTensor's per-operator dispatch
costs about as much as a small operator's compute on a CPU.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed._functional_collectives as funcol
import torch.fx as fx
from torch.distributed.tensor import DeviceMesh, DTensor, Partial, Replicate
from torch.distributed.tensor._dtensor_spec import DTensorSpec

from estimators.overhead import batch_local
from tensoropt.configspace.configuration import Configuration, Layout, shard_dim
from tensoropt.executor.job.program import arg_nodes, op_name, packet_name
from tensoropt.executor.ops import chunked_loss, explicit_ops, fallback, local_ops
from tensoropt.executor.ops.dtensor_rules import register_elementwise_rules, register_group_norm_backward_rule
from tensoropt.executor.ops.placements import normalise, raw_output_layout, to_layout, to_placements
from tensoropt.executor.state import block_checkpoint
from tensoropt.executor.state import options as memory_options
from tensoropt.executor.state.mixed_precision import cast_param, scale_grad

_CONV_ARGS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
_POOLS = {"max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "max_pool1d", "avg_pool1d",
          "adaptive_avg_pool1d"}
"""Pooling ops (one output) run per sample and channel through ``explicit_ops.pool``."""


register_elementwise_rules()
register_group_norm_backward_rule()

DTENSOR_EQUIVALENTS = {torch.ops.aten.lift_fresh_copy.default: torch.ops.aten.clone.default}
"""Ops DTensor has no sharding strategy for -> an op of the same result it has one for."""


class PlacementMismatch(RuntimeError):
    """DTensor produced a placement other than the one the plan names, or the plan does not fit."""


class _Lazy:
    """Marker of a view node not evaluated yet."""


_LAZY = _Lazy()


def preimage(target: Layout, dim_map: list[int | None], shape: tuple[int, ...],
             mesh_shape: tuple[int, ...]) -> Layout:
    """The layout of a producer of ``shape`` whose image through views with ``dim_map`` is ``target``.

    Axes whose target shard dim no producer dim maps onto, or whose producer dim would split
    unevenly, become ``"R"`` (the views cannot carry that shard; it is cut after them, free).

    Example:
        >>> preimage(("S(1)", "S(2)"), [0, 1, None, None], (4, 8, 2, 2), (2, 2))
        ('S(1)', 'R')
        >>> preimage(("S(2)", "S(2)"), [0, 2, 1, None], (4, 2, 4, 4), (2, 2))
        ('S(1)', 'R')
    """
    out = []
    splits = [1] * len(shape)
    for p, axis_size in zip(target, mesh_shape):
        d = shard_dim(p)
        sources = [i for i, m in enumerate(dim_map) if d is not None and m == d and i < len(shape)]
        if sources and shape[sources[0]] % (splits[sources[0]] * axis_size) == 0:
            splits[sources[0]] *= axis_size
            out.append(f"S({sources[0]})")
        else:
            out.append("R")
    return tuple(out)


def carried(current: Layout, pre: Layout, dim_map: list[int | None]) -> Layout:
    """``pre`` (the layout to take before the views, :func:`preimage`) with each axis it replicates kept
    sharded where the producer's value is sharded on a dim the views carry (``dim_map`` not None): the
    views run on the shard and the smaller operand is redistributed after them, as the cost graph
    prices it (``estimators.redistribution.through_view``). ViT's head reads the CLS row of a
    batch-split ``(8, 65, 256)`` output: 8 KiB gathered, not 0.51 MiB.

    Example:
        >>> carried(("S(0)",), ("R",), [0, None, 1])  # the batch shard passes the row's select
        ('S(0)',)
        >>> carried(("S(1)",), ("R",), [0, None, 1])  # the select cuts the sharded dim: gather first
        ('R',)
    """
    out = []
    for cur, want in zip(current, pre):
        d = shard_dim(cur)
        keep = want == "R" and d is not None and d < len(dim_map) and dim_map[d] is not None
        out.append(cur if keep else want)
    return tuple(out)


_CE_ARGS = ("input", "target", "weight", "reduction", "ignore_index", "label_smoothing")
_RESHAPES = {"view", "reshape", "_unsafe_view", "flatten"}
"""Ops that keep every element of a tensor (the count of valid labels does not change through them)."""


def _plain_mean(n: fx.Node) -> bool:
    """Whether a cross-entropy node is the plain mean (no class weights, no label smoothing)."""
    bound = dict(zip(_CE_ARGS, n.args), **n.kwargs)
    return bound.get("weight") is None and bound.get("reduction", 1) == 1 and not bound.get("label_smoothing")


class PlanInterpreter(fx.Interpreter):
    """An ``fx.Interpreter`` over an exported program's graph that follows a plan.

    Args:
        gm: the exported program's ``graph_module``.
        placements: node name -> Configuration (empty for a plain single-device run).
        mesh: the DeviceMesh, or None for a plain run (no DTensor at all).
        operands: node name -> the OpGraph node's ``operands`` (role, index or key, dim_map of
            each tensor argument in argument order).
        lazy: names of the view nodes folded into edges (evaluated by their consumers).
        local: run :data:`local_ops.LOCAL_PACKETS` (batch-split cross entropy) on local shards
            (:mod:`tensoropt.executor.ops.local_ops`); False sends every op through DTensor.

    Example:
        >>> # not run here: needs an exported program laid out on a process group's mesh
        >>> PlanInterpreter(ep.graph_module, placements, mesh, operands, lazy).run(*values)  # doctest: +SKIP
    """

    def __init__(self, gm: fx.GraphModule, placements: dict[str, Configuration], mesh: DeviceMesh | None,
                 operands: dict[str, list[dict]], lazy: set[str], local: bool = True,
                 checkpoint_modules: list[str] | None = None):
        super().__init__(gm)
        self.placements = placements
        self.mesh = mesh
        self.operands = operands
        self.lazy = lazy
        self.user_to_last_uses = self._last_uses()
        self._memo: dict[tuple, Any] = {}
        self._memo_roots: dict[fx.Node, list[tuple]] = {}
        """Node -> the keys of the memo entries made from its value (its views, their layouts): dropped
        when the node's value is (:meth:`_release_memo`)."""
        self._root: fx.Node | None = None
        """The node whose value (or views of it) is being laid out now: who a new memo entry belongs to."""
        self.local = {n.name: packet_name(n) for n in gm.graph.nodes
                      if local and n.op == "call_function" and packet_name(n) in local_ops.LOCAL_PACKETS
                      and n.name in placements and not placements[n.name].options}
        """Node name -> aten packet of the nodes tried on local shards first."""
        self.fallback = fallback.fallback_nodes(gm.graph)
        """Nodes whose op has no parallel rule: run on local tensors
        (:mod:`tensoropt.executor.ops.fallback`)."""
        self.on_grad = None
        """Called with each parameter whose gradient the whole-graph local mode has just set."""
        self.spans = block_checkpoint.block_spans(gm.graph, placements, lazy, checkpoint_modules) \
            if mesh is not None else {}
        """First node of each checkpointed block -> its span
        (:mod:`tensoropt.executor.state.block_checkpoint`)."""
        self._in_block = False
        fused = any(chunked_loss.is_chunked(c) for c in placements.values())
        self.batch_axes = self._batch_axes(gm, placements) \
            if local and mesh is not None and not self.spans and not fused else None
        """Mesh axes the batch is split on when the whole plan runs on local tensors, else None."""
        self._leaves: dict[int, tuple[DTensor, torch.Tensor]] = {}
        self._partial_outputs: set[fx.Node] = set()
        """Loss nodes returned as partial sums over the batch axes (summed when read, after the step)."""
        self._counts: dict[fx.Node, tuple] = {}
        """Loss node -> its label count's all-reduce, launched when the forward pass starts."""
        self._losses = self._partial_losses() if mesh is not None else []
        """(loss node, its labels' graph input, ignore_index) of the losses left partial sums."""
        self._partial_sums = self._partial_mse_losses() if mesh is not None else set()
        """Names of the batch-split mse_loss nodes returned as partial sums (no collective in forward)."""
        self.compute_dtype: torch.dtype | None = None
        """Mixed precision: the dtype each parameter is cast to where the graph reads it (its gradient
        flows back through the cast to the float32 master;
        :mod:`tensoropt.executor.state.mixed_precision`)."""
        self.loss_scale: float | None = None
        """fp16-mixed: the loss's gradient is multiplied by this in backward (the loss itself unscaled)."""
        self.batch_norm_stats = "synchronized"
        """``training.batch_norm``: statistics of a batch-split batch norm over the global batch
        (``synchronized``) or over each rank's rows (``local``; :mod:`tensoropt.executor.ops.batch_norm`)."""
        self.loss_chunk_tokens: int | None = None
        """``training.loss_chunk_tokens``: rows per chunk of a ``chunked_loss`` head + loss
        (:mod:`tensoropt.executor.ops.chunked_loss`; None: its default)."""
        self.global_inputs: dict[str, torch.Tensor] = {}
        """Graph input name -> the step's whole (global) value, where a caller holds it: label counts are
        then taken from it. The trainer leaves it empty (each rank produces only its rows of a batch)."""

    def run(self, *args, **kwargs):
        out = self._forward(*args, **kwargs)
        if self.loss_scale is None:
            return out
        if isinstance(out, (tuple, list)):  # the loss is the first output
            return type(out)([scale_grad(out[0], self.loss_scale), *out[1:]])
        return scale_grad(out, self.loss_scale)

    def placeholder(self, target, args, kwargs):
        return cast_param(super().placeholder(target, args, kwargs), self.compute_dtype)

    def _forward(self, *args, **kwargs):
        # Views and redistributions are memoised within one forward pass: q, k and v taken from
        # one split must share that split (its backward needs every output's gradient). An entry
        # lives as long as the value it was made from (:meth:`_release_memo`), not to the forward's end.
        self._memo, self._memo_roots = {}, {}
        if self.batch_axes is not None:
            return self._run_local_graph(args)
        placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        self._counts = self._launch_label_counts({n: v for n, v in zip(placeholders, args)})
        self._partial_outputs = set()
        try:
            with memory_options.forward_hooks(self):
                return super().run(*args, **kwargs)
        finally:
            self._memo, self._memo_roots = {}, {}
            for work, _ in self._counts.values():  # a failed forward still matches the collectives
                if work is not None:
                    work.wait()
            self._counts = {}

    # -- whole-graph local mode (pure batch splits) -------------------------------------------

    def _batch_axes(self, gm: fx.GraphModule, placements: dict[str, Configuration]) -> tuple[int, ...] | None:
        if self.lazy:
            return None
        layout = None
        for n in gm.graph.nodes:
            if n.op in ("placeholder", "output"):
                continue
            config = placements.get(n.name)
            operands = self.operands.get(n.name)
            nodes = arg_nodes(n)
            if n.op != "call_function" or config is None or operands is None or len(operands) != len(nodes):
                return None
            inputs = [{"shape": tuple(o["shape"])} for o in operands if o["role"] == "input"]
            if not batch_local({"op": op_name(n), "inputs": inputs}, config):
                return None
            if packet_name(n) == "cross_entropy_loss" and not _plain_mean(n):
                return None  # class weights, another reduction or label smoothing: DTensor runs it
            for a, o in zip(nodes, operands):
                if o["role"] != "input":
                    continue
                source = placements.get(a.name)
                if source is None or tuple(source.output) != tuple(config.inputs[o["index"]]):
                    return None  # a redistribution between the two: DTensor runs it
                if layout is None:
                    layout = tuple(source.output)
                elif tuple(source.output) != layout:
                    return None
        if layout is None:
            return None
        return tuple(a for a, p in enumerate(layout) if p == "S(0)")

    def _run_local_graph(self, args: tuple):
        mesh = self.mesh
        grad_placements = [Partial() if a in self.batch_axes else Replicate() for a in range(mesh.ndim)]
        env: dict[fx.Node, Any] = {}
        placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        for n, value in zip(placeholders, args):
            if isinstance(value, DTensor) and value.requires_grad and value.is_leaf:  # a parameter
                env[n] = cast_param(self._leaf(value, grad_placements), self.compute_dtype)
            elif isinstance(value, DTensor):
                config = self.placements.get(n.name)
                expected = normalise(tuple(config.output), value.dim()) if config else ("R",) * mesh.ndim
                if to_layout(value.placements, value.dim()) != expected:
                    raise PlacementMismatch(
                        f"input {n.name!r} is {value.placements}, the plan lays it out as {expected}")
                env[n] = value._local_tensor
            else:
                env[n] = value
        # a loss that is the graph's output stays a partial sum over the batch axes (read after the
        # step): its label count is all-reduced while forward runs, and forward has no blocking collective
        counts = self._launch_label_counts({n: v for n, v in zip(placeholders, args)})
        self._partial_outputs = set(counts)
        result = None
        for n in self.graph.nodes:
            if n.op == "call_function":
                a, kw = fx.node.map_arg((n.args, n.kwargs), env.__getitem__)
                if packet_name(n) == "cross_entropy_loss":
                    bound = dict(zip(("logits", "labels") + _CE_ARGS[2:], a), **kw)
                    ignore_index = bound.get("ignore_index", -100)
                    if n in counts:
                        count = self._take_count(counts, n)
                        env[n] = local_ops.partial_mean_cross_entropy(bound["logits"], bound["labels"],
                                                                      ignore_index, count)
                    else:
                        groups = [mesh.get_group(x) for x in self.batch_axes]
                        env[n] = local_ops.mean_cross_entropy(bound["logits"], bound["labels"], ignore_index,
                                                              groups)
                else:
                    env[n] = n.target(*a, **kw)
            elif n.op == "output":
                result = fx.node.map_arg(n.args[0], lambda a: self._local_output(a, env[a]))
            for used in self.user_to_last_uses.get(n, []):
                env.pop(used, None)
        return result

    def _partial_losses(self) -> list[tuple[fx.Node, fx.Node, int]]:
        """The losses that can stay partial sums: (node, labels' graph input, ignore_index).

        Each plain-mean cross entropy whose only user is the graph's output and whose labels are a
        graph input (through reshapes only, which keep every label): it is read after the step, so
        the one number forward needs from the other ranks is the count of valid labels.
        """
        out = []
        for n in self.graph.nodes:
            if n.op != "call_function" or packet_name(n) != "cross_entropy_loss" or not _plain_mean(n):
                continue
            config = self.placements.get(n.name)
            users = list(n.users)
            if config is None or config.options or len(users) != 1 or users[0].op != "output":
                continue
            if self.batch_axes is None and n.name not in self.local:
                continue
            labels = n.args[1] if len(n.args) > 1 else n.kwargs.get("target")
            while isinstance(labels, fx.Node) and labels.op == "call_function" \
                    and packet_name(labels) in _RESHAPES:
                labels = labels.args[0]
            if isinstance(labels, fx.Node) and labels.op == "placeholder":
                out.append((n, labels, dict(zip(_CE_ARGS, n.args), **n.kwargs).get("ignore_index", -100)))
        return out

    def _partial_mse_losses(self) -> set[str]:
        """The mse_loss nodes left partial sums: split (``partial_axes``), no option, and read only as
        the graph's output (after the step); their mean's divisor is the element count of the shapes."""
        out = set()
        for n in self.graph.nodes:
            config = self.placements.get(n.name)
            if n.op != "call_function" or packet_name(n) != "mse_loss" or config is None:
                continue
            users = list(n.users)
            if config.partial_axes and not config.options and len(users) == 1 and users[0].op == "output":
                out.add(n.name)
        return out

    def _launch_label_counts(self, values: dict) -> dict:
        """Loss node -> (async all-reduce work or None, float64 count of valid labels on all ranks).

        For each loss of :meth:`_partial_losses`. ``values``: placeholder node -> its value (a local
        tensor or a DTensor). Where the step's whole labels are at hand (:attr:`global_inputs`) the
        count needs no collective; otherwise it is all-reduced while the forward pass runs, and
        labels split over more than one mesh axis are left to the blocking path.
        """
        out = {}
        for n, labels, ignore_index in self._losses:
            whole = self.global_inputs.get(labels.name)
            if whole is not None:  # every rank holds the step's whole batch: no collective at all
                out[n] = (None, (whole != ignore_index).sum().to(torch.float64).reshape(1))
                continue
            if labels not in values:
                continue
            source = self.placements.get(labels.name)
            layout = tuple(source.output) if source is not None else ("R",) * self.mesh.ndim
            axes = [a for a, p in enumerate(layout) if shard_dim(p) is not None]
            if len(axes) > 1:
                continue
            value = values[labels]
            local = value._local_tensor if isinstance(value, DTensor) else value
            count = (local != ignore_index).sum().to(torch.float64).reshape(1)
            if axes:  # functional: waited on first use, and traceable into the replayed program
                count = funcol.all_reduce(count, "sum", self.mesh.get_group(axes[0]))
            out[n] = (None, count)
        return out

    @staticmethod
    def _take_count(counts: dict, n: fx.Node) -> torch.Tensor:
        """The label count of loss ``n`` (waiting for its all-reduce), removed from ``counts``."""
        work, count = counts.pop(n)
        if work is not None:
            work.wait()
        if isinstance(count, funcol.AsyncCollectiveTensor):  # a plain tensor from here on: a wrapper
            count = count.wait()  # has no storage (autograd may save it: a float64 loss's .to is a no-op)
        return count

    def _local_output(self, n: fx.Node, value):
        if not isinstance(value, torch.Tensor):
            return value
        meta = n.meta.get("val")
        if n in self._partial_outputs:  # the loss's partial sum over the batch axes
            placements = [Partial() if a in self.batch_axes else Replicate() for a in range(self.mesh.ndim)]
        else:
            config = self.placements.get(n.name)
            layout = tuple(config.output) if config is not None else ("R",) * self.mesh.ndim
            placements = to_placements(normalise(layout, value.dim()))
        return DTensor.from_local(value, self.mesh, placements,
                                  run_check=False, shape=None if meta is None else tuple(meta.shape),
                                  stride=None if meta is None else tuple(meta.stride()))

    def _leaf(self, p: DTensor, grad_placements) -> torch.Tensor:
        """The local tensor of parameter ``p`` as an autograd leaf (kept across steps: it shares the
        storage the optimizer updates), whose gradient is handed to ``p`` as a Partial(sum) DTensor."""
        local = p._local_tensor
        cached = self._leaves.get(id(p))
        if cached is not None and cached[0] is p and cached[1].data_ptr() == local.data_ptr():
            return cached[1]
        leaf = local.detach().requires_grad_()
        spec = DTensorSpec(p.device_mesh, tuple(grad_placements), tensor_meta=p._spec.tensor_meta)
        leaf.register_post_accumulate_grad_hook(lambda leaf, p=p, spec=spec: self._local_grad(p, leaf, spec))
        self._leaves[id(p)] = (p, leaf)
        return leaf

    def _local_grad(self, p: DTensor, leaf: torch.Tensor, spec: DTensorSpec) -> None:
        grad = DTensor(leaf.grad, spec, requires_grad=False)
        leaf.grad = None
        p.grad = grad if p.grad is None else p.grad + grad
        if self.on_grad is not None:
            self.on_grad(p)

    def _last_uses(self) -> dict[fx.Node, list[fx.Node]]:
        """When each value can be freed: a lazy view keeps its inputs alive until its consumers ran."""
        order = list(self.graph.nodes)
        last: dict[fx.Node, int] = {}

        def touch(a: fx.Node, i: int) -> None:
            last[a] = i
            if a.name in self.lazy:
                for b in a.all_input_nodes:
                    touch(b, i)

        for i, node in enumerate(order):
            if node.name not in self.lazy:
                for a in node.all_input_nodes:
                    touch(a, i)
            if node.op == "call_function" and packet_name(node) == "cross_entropy_loss" \
                    and chunked_loss.is_chunked(self.placements.get(node.name)):
                for a in chunked_loss.head_of(node, self.lazy).all_input_nodes:  # the loss runs its head
                    touch(a, i)
        out: dict[fx.Node, list[fx.Node]] = {}
        for a, i in last.items():
            out.setdefault(order[i], []).append(a)
        return out

    def run_node(self, n: fx.Node) -> Any:
        out = self._run_node(n)
        self._release_memo(n)
        return out

    def _release_memo(self, n: fx.Node) -> None:
        """Drop the memo entries made from the values whose last use was ``n`` (the loop frees those
        values next): a redistributed copy and its source would otherwise stay alive until the forward
        ends, unsaved (the zoo GPT's end of forward held 9 MiB of them beside 41.5 MiB of saved
        activations; docs/results.md, 2026-11-28). Every consumer of such a value has run by then, so
        none needs its entry again."""
        for root in self.user_to_last_uses.get(n, ()):
            for key in self._memo_roots.pop(root, ()):
                self._memo.pop(key, None)

    def _remember(self, key: tuple, entry: tuple) -> None:
        self._memo[key] = entry
        if self._root is not None:
            self._memo_roots.setdefault(self._root, []).append(key)

    def _run_node(self, n: fx.Node) -> Any:
        if self.mesh is None or n.op != "call_function":
            return super().run_node(n)
        if n in self.spans and not self._in_block:  # a checkpointed block, run as a whole
            return block_checkpoint.run_block(self, self.spans[n], _LAZY)
        if n.name in self.lazy:
            return _LAZY
        config = self.placements.get(n.name)
        if config is None:
            args = fx.node.map_arg(n.args, self._value)
            kwargs = fx.node.map_arg(n.kwargs, self._value)
            return self._wrap_plain(self.call_function(n.target, args, kwargs))
        if chunked_loss.is_chunked(config):  # the fused head + loss: the head is computed by its loss
            if packet_name(n) == "cross_entropy_loss":
                return chunked_loss.run_loss(self, n, config, memory_options.lay_out)
            return _LAZY
        if config.options:  # recompute / zero3 (tensoropt.executor.state.options)
            return memory_options.run_node(self, n, config)
        args, kwargs = self._lay_out_operands(n, config)
        if n in self._counts:  # the loss, left a partial sum (see _partial_losses)
            out = local_ops.partial_cross_entropy(args, kwargs, self._take_count(self._counts, n))
            if out is not None:
                self._partial_outputs.add(n)
                return out
        if n.name in self.local:
            out = local_ops.run_local(self.local[n.name], args, kwargs)
            if out is not None:
                return self._check_reduced(n, config, out)
        out, bias = self._compute(n, args, kwargs)
        return self._check_and_reduce(n, config, out, bias, reduce=n.name not in self._partial_sums)

    def fetch_args_kwargs_from_env(self, n: fx.Node):
        return fx.node.map_arg(n.args, self._value), fx.node.map_arg(n.kwargs, self._value)

    # -- operands ---------------------------------------------------------------------------

    def _value(self, a: fx.Node):
        """The value of ``a``, replaying its view chain if it is lazy."""
        value = self.env[a]
        if value is not _LAZY:
            return value
        chain, root = self._chain(a)
        outer, self._root = self._root, root
        try:
            return self._replay(chain, self.env[root])
        finally:
            self._root = outer

    def _chain(self, a: fx.Node) -> tuple[list[fx.Node], fx.Node]:
        chain = []
        while a.name in self.lazy:
            chain.append(a)
            a = a.args[0]
        return chain[::-1], a

    def _replay(self, chain: list[fx.Node], value):
        for node in chain:
            key = (node, id(value))
            if key not in self._memo:
                args = (value, *fx.node.map_arg(node.args[1:], self._value))
                out = self.call_function(node.target, args, dict(node.kwargs))
                self._remember(key, (value, self._wrap_plain(out)))
            value = self._memo[key][1]
        return value

    def _lay_out_operands(self, n: fx.Node, config: Configuration):
        """Fetch ``n``'s arguments with every operand laid out as ``config`` says."""
        nodes = arg_nodes(n)
        operands = self.operands.get(n.name)
        if operands is None or len(operands) != len(nodes):
            raise PlacementMismatch(
                f"node {n.name!r} ({op_name(n)}): the OpGraph lists "
                f"{'no' if operands is None else len(operands)} operands but the exported node has "
                f"{len(nodes)}; was the plan made for this model and torch version?"
            )
        num_inputs = sum(1 for o in operands if o["role"] == "input")
        if len(config.inputs) != num_inputs:
            raise PlacementMismatch(
                f"node {n.name!r} ({op_name(n)}): the plan gives {len(config.inputs)} input layouts "
                f"but the node reads {num_inputs} activations; was the plan made for this model?"
            )
        param_layouts = dict(config.params)
        placed = iter([self._operand(n, a, o, config, param_layouts) for a, o in zip(nodes, operands)])

        def load(a: fx.Node):
            return next(placed)

        return fx.node.map_arg(n.args, load), fx.node.map_arg(n.kwargs, load)

    def _operand(self, n: fx.Node, a: fx.Node, operand: dict, config: Configuration, param_layouts: dict):
        if operand["role"] == "input":
            target = config.inputs[operand["index"]]
        elif operand["role"] == "param":
            target = param_layouts.get(operand["key"])
        else:
            target = None
        chain, root = self._chain(a)
        outer, self._root = self._root, root
        try:
            return self._laid_out(n, chain, self.env[root], operand, target)
        finally:
            self._root = outer

    def _laid_out(self, n: fx.Node, chain: list[fx.Node], value, operand: dict, target):
        """The operand ``value`` (its root's) through the views ``chain``, laid out as ``target``."""
        if target is None or not isinstance(value, torch.Tensor):
            out = self._replay(chain, value)
            if target is None or operand["role"] != "input" or not isinstance(out, DTensor):
                return out
            # one tensor of a producer's list (broadcast_tensors' outputs): laid out once taken from it
            return self._redistribute(n, out, normalise(target, len(operand["shape"])))
        if not chain:
            return self._redistribute(n, value, target)
        if operand["role"] == "input":
            target_in = normalise(target, len(operand["shape"]))
            pre = preimage(target_in, operand["dim_map"], tuple(value.shape), tuple(self.mesh.shape))
            if isinstance(value, DTensor):
                pre = carried(to_layout(value.placements, value.dim()), pre, operand["dim_map"])
            value = self._redistribute(n, value, pre)
            return self._redistribute(n, self._replay(chain, value), target_in)
        # A parameter's layout is in its own dims: lay it out, then take the views.
        return self._replay(chain, self._redistribute(n, value, target))

    def _redistribute(self, n: fx.Node, value: torch.Tensor, target) -> torch.Tensor:
        if not isinstance(value, DTensor):
            value = self._wrap_plain(value)
        target = normalise(target, value.dim())
        if len(target) != self.mesh.ndim:
            raise PlacementMismatch(
                f"node {n.name!r} ({op_name(n)}): layout {target} has {len(target)} axes, "
                f"the mesh has {self.mesh.ndim}"
            )
        current = to_layout(value.placements, value.dim())
        if current == tuple(target):
            return value
        if "P" in target:
            raise PlacementMismatch(
                f"node {n.name!r} ({op_name(n)}): an operand is {current} but the plan asks for the "
                f"partial layout {tuple(target)}, which cannot be produced by redistribution"
            )
        key = ("redistribute", id(value), tuple(target))
        if key not in self._memo:
            moved = explicit_ops.consistent_grad(value).redistribute(self.mesh, to_placements(target))
            moved = explicit_ops.consistent_strides(moved)
            self._remember(key, (value, moved))
        return self._memo[key][1]

    def call_function(self, target, args, kwargs):
        """The op, or its equivalent where DTensor has a strategy only for that
        (:data:`DTENSOR_EQUIVALENTS`: DeBERTa's ``torch.tensor(size)`` in forward copies its lifted
        constant with ``aten.lift_fresh_copy``). A list op's DTensor outputs (``split``, ``unbind``)
        get a gradient each in backward (:func:`explicit_ops.every_output_grad`): the interpreter
        replays a split once per layout its consumers need, each replay feeding only some outputs."""
        out = super().call_function(DTENSOR_EQUIVALENTS.get(target, target), args, kwargs)
        if self.mesh is not None and explicit_ops.returns_tensor_list(target):
            return explicit_ops.every_output_grad(out)
        return out

    def _wrap_plain(self, out):
        if isinstance(out, torch.Tensor) and not isinstance(out, DTensor) and self.mesh is not None:
            return DTensor.from_local(out, self.mesh, [Replicate()] * self.mesh.ndim, run_check=False)
        return out

    # -- compute and check ------------------------------------------------------------------

    def _compute(self, n: fx.Node, args, kwargs):
        """Run the op; returns (raw output, bias to add after the partial sum is reduced)."""
        if n.name in self.fallback:
            config = self.placements[n.name]
            return fallback.run_local(n.name, n.target, args, kwargs, config, self.mesh), None
        name = packet_name(n)
        if name == "conv2d":
            bound = dict(zip(_CONV_ARGS, args), **kwargs)
            rest = {k: bound[k] for k in _CONV_ARGS[3:] if k in bound}
            return explicit_ops.conv2d(n.name, bound["input"], bound["weight"], **rest), bound.get("bias")
        if name == "scaled_dot_product_attention":
            return explicit_ops.sdpa(n.name, *args, **kwargs), None
        if name == "batch_norm":
            return explicit_ops.batch_norm(n.name, *args, **kwargs, stats=self.batch_norm_stats), None
        if name == "cross_entropy_loss":
            return explicit_ops.cross_entropy(n.name, n.target, *args, **kwargs), None
        if name == "mse_loss":  # DTensor has no sharding strategy for it: the local rows' share
            out = local_ops.mse_loss(args, kwargs)
            if out is None:
                raise PlacementMismatch(
                    f"node {n.name!r} (aten.mse_loss): its prediction and target must be DTensors of one "
                    f"shape, both batch-split (S(0)) or replicated on each mesh axis; re-plan this model")
            return out, None
        if name in _POOLS and isinstance(args[0], DTensor):
            return explicit_ops.pool(n.name, n.target, *args, **kwargs), None
        return self.call_function(n.target, args, kwargs), None

    def _check_reduced(self, n: fx.Node, config: Configuration, out: DTensor) -> DTensor:
        """Check an output that its op reduced itself against the configuration's output layout."""
        expected = normalise(tuple(config.output), out.dim())
        actual = to_layout(out.placements, out.dim())
        if actual != expected:
            raise PlacementMismatch(
                f"node {n.name!r} ({op_name(n)}, configuration {config.label!r}): expected output "
                f"placement {expected}, the local op produced {actual}"
            )
        return out

    def _check_and_reduce(self, n: fx.Node, config: Configuration, out, bias, reduce: bool = True):
        first = out[0] if isinstance(out, (tuple, list)) else out
        if isinstance(first, torch.Tensor):
            first = self._wrap_plain(first)
            expected = normalise(raw_output_layout(config), first.dim())
            actual = to_layout(first.placements, first.dim())
            if actual != expected:
                raise PlacementMismatch(
                    f"node {n.name!r} ({op_name(n)}, configuration {config.label!r}): expected output "
                    f"placement {expected}, DTensor produced {actual}"
                )
            target = normalise(tuple(config.output), first.dim())
            if actual != target and reduce:
                first = explicit_ops.reduce_partial(first, self.mesh, to_placements(target))
            if bias is not None:
                first = explicit_ops.add_bias(first, bias)
        if isinstance(out, tuple):
            return (first, *out[1:])
        if isinstance(out, list):
            return [first, *out[1:]]
        return first
