"""What backward through a checkpointed block holds beyond the block's rebuilt activations.

When backward reaches a block under ``block_recompute`` or ``block_selective``
(:mod:`tensoropt.executor.state.block_checkpoint`), the checkpoint reruns the block's forward, then
autograd runs the block's backward over the rebuilt activations. The recompute transient the plan
rows price (:func:`estimators.peak.recompute_excess_bytes`: the rebuilt activations less the
gradients not made yet and the activations freed already) leaves out what that backward makes: the
*gradients of the activations* (the gradient arriving from the layers above, which in a residual
block stays alive through the whole block: the skip connection holds it; at each operator the
gradient of its output beside the gradients its backward makes for its inputs) and the block's
*parameter gradients* as they are made, while the rebuilt activations are freed as the operators
that saved them finish their backward. Measured at the tensor peak of width-256 HF GPT-2 under
``block_recompute`` (the first block's rerun, the backward of its GELU's last ``mul``): the gradient of
the MLP's down projection input (4 MiB), the two gradients ``mul``'s backward makes from it (4 + 4
MiB), the residual stream's gradient (1 MiB) and the down projection's weight gradient (1 MiB), the
projection's saved input freed (4 MiB): 10 MiB the rows' transient did not have (docs/results.md,
"Block plans' tensor peak within 5 %").

:func:`span_gradient_bytes` walks a block's nodes in backward order (the graph's order reversed)
and, at each node, sums from the graph:

* the activation gradients alive: a value's gradient is alive from the backward of its first reader
  in backward order (its last reader in forward order; a value read after the block, one of its
  outputs: from the block's start) to the backward of its producer (a value the block reads from
  outside: to the block's end). Where that first reader passes the gradient through without making
  a tensor (views, ``getitem``, ``clone``, an ``add`` operand of the output's shape: their backward
  returns the output's gradient itself), it is that reader's output's gradient (one storage, counted
  once; the later readers' contributions are added into it, each made beside it first);
* the parameter gradients made: a parameter (or its compute-dtype copy) the block reads gets its
  gradient at its last reader's backward;
* less the rebuilt activations freed: a value an operator's backward reads (its operands, except
  for ops that read none: ``add``, a ``mean``, a ``mul`` by a number, views; its output for ``tanh``,
  ``exp``, softmax, ...) is freed once the last of them in backward order ran (under
  ``block_selective`` the matmul-class and attention outputs are kept, not rebuilt: not freed here).

Only activations have gradients here: floating values that depend on both a user input and a
parameter (:func:`activation_nodes`); bytes are on this process (the value's bytes over the mesh axes
its layout splits, :func:`tensoropt.executor.state.peak_memory.local_output_bytes`; a parameter's
whole, as autograd makes its gradient before any reduction). The largest sum over a block's nodes
is its figure, added to the rows' excess of that block
(:func:`tensoropt.executor.state.peak_memory.recompute_transient_bytes`). Not modelled: the
temporaries inside one operator's backward formula (e.g. ``pow``'s ``x ** 2``).

Example:
    >>> block_gradient_bytes(trainer.ep.graph, trainer.plan, trainer.sig)  # doctest: +SKIP
    {'transformer.h.0': 10485760, ...}
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch
import torch.fx as fx

_aten = torch.ops.aten
_PASS_THROUGH_NAMES = ("view", "_unsafe_view", "reshape", "transpose", "t", "permute", "unsqueeze",
                       "squeeze", "alias", "clone", "contiguous", "expand_as", "view_as", "flatten",
                       "unflatten")
"""Ops whose backward hands the output's gradient on as the input's (a view of it, no new storage)."""


def _pass_through_targets() -> frozenset:
    out = {operator.getitem}
    for name in _PASS_THROUGH_NAMES:
        packet = getattr(_aten, name, None)
        if packet is not None:
            out.update(getattr(packet, o) for o in packet.overloads())
    return frozenset(out)


PASS_THROUGH = _pass_through_targets()
_ADDS = frozenset(getattr(_aten.add, o) for o in _aten.add.overloads())


def passes_gradient(node: fx.Node, operand: fx.Node) -> bool:
    """Whether ``node``'s backward hands its output's gradient to ``operand`` as it is (no new storage).

    Example:
        >>> g = fx.Graph(); x = g.placeholder("x"); y = g.placeholder("y")
        >>> x.meta["val"] = y.meta["val"] = torch.ones(2, 3)
        >>> s = g.call_function(_aten.add.Tensor, (x, y)); s.meta["val"] = torch.ones(2, 3)
        >>> m = g.call_function(_aten.mul.Tensor, (x, y)); m.meta["val"] = torch.ones(2, 3)
        >>> passes_gradient(s, x), passes_gradient(m, x)
        (True, False)
    """
    if node.target in PASS_THROUGH:
        return True
    if node.target in _ADDS:  # the sum's gradient is each operand's where no broadcast reduces it
        out, val = node.meta.get("val"), operand.meta.get("val")
        return isinstance(out, torch.Tensor) and isinstance(val, torch.Tensor) and \
            tuple(out.shape) == tuple(val.shape) and out.dtype == val.dtype
    return False


def activation_nodes(graph: fx.Graph, params: Sequence[str], user_inputs: Sequence[str]) -> set[fx.Node]:
    """The nodes whose values have activation gradients: floating, and depending on both a user input
    and a parameter (a parameter's copies and a mask made from the inputs alone have none here).

    Example:
        >>> g = fx.Graph(); w = g.placeholder("w"); x = g.placeholder("x")
        >>> y = g.call_function(_aten.mm.default, (x, w)); t = g.call_function(_aten.t.default, (w,))
        >>> for n in (w, x, y, t):
        ...     n.meta["val"] = torch.ones(2, 2)
        >>> sorted(n.name for n in activation_nodes(g, ["w"], ["x"]))
        ['mm_default']
    """
    from_param, from_input = _derived(graph, params, user_inputs)
    return {n for n in from_param & from_input if _floating(n.meta.get("val"))}


def parameter_nodes(graph: fx.Graph, params: Sequence[str], user_inputs: Sequence[str]) -> set[fx.Node]:
    """The floating values made from parameters alone (a parameter, its compute-dtype copy, a view
    of it): their gradients are the parameters' gradients.

    Example:
        >>> g = fx.Graph(); w = g.placeholder("w"); x = g.placeholder("x")
        >>> y = g.call_function(_aten.mm.default, (x, w)); t = g.call_function(_aten.t.default, (w,))
        >>> for n in (w, x, y, t):
        ...     n.meta["val"] = torch.ones(2, 2)
        >>> sorted(n.name for n in parameter_nodes(g, ["w"], ["x"]))
        ['t_default', 'w']
    """
    from_param, from_input = _derived(graph, params, user_inputs)
    return {n for n in from_param - from_input if _floating(n.meta.get("val"))}


def _derived(graph: fx.Graph, params: Sequence[str], user_inputs: Sequence[str]) -> tuple[set, set]:
    """(nodes depending on a parameter, nodes depending on a user input)."""
    from_param: set[fx.Node] = set()
    from_input: set[fx.Node] = set()
    params, user_inputs = set(params), set(user_inputs)
    for n in graph.nodes:
        if n.op == "placeholder":
            if n.name in params:
                from_param.add(n)
            elif n.name in user_inputs:
                from_input.add(n)
            continue
        args = n.all_input_nodes
        if any(a in from_param for a in args):
            from_param.add(n)
        if any(a in from_input for a in args):
            from_input.add(n)
    return from_param, from_input


def _floating(val) -> bool:
    """A floating tensor, or a tuple holding one (an attention kernel's outputs)."""
    if isinstance(val, (tuple, list)):
        return any(_floating(v) for v in val)
    return isinstance(val, torch.Tensor) and val.is_floating_point()


_KEEPS_NO_INPUT = frozenset({"add", "sub", "neg", "cat", "stack", "_to_copy", "to", "expand", "slice",
                             "select", "mean", "sum", "where", "new_zeros", "zeros_like", "ones_like",
                             "full_like", "dropout", "split", "chunk", "unbind"})
"""Ops whose backward reads none of their tensor operands (an ``add``'s, a ``mean``'s: shapes only;
a ``where``'s condition is no activation): nothing of theirs keeps an operand alive."""
_KEEPS_OUTPUT = frozenset({"tanh", "sigmoid", "exp", "rsqrt", "sqrt", "_softmax", "_log_softmax",
                           "softmax", "log_softmax", "relu"})
"""Ops whose backward reads their own output (their output stays alive to their backward)."""
_SELECTIVE_KEEPS = frozenset({"linear", "addmm", "mm", "bmm", "baddbmm", "matmul", "convolution", "conv2d",
                              "scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
                              "_scaled_dot_product_flash_attention",
                              "_scaled_dot_product_efficient_attention"})
"""The ops whose outputs ``block_selective`` keeps (:data:`estimators.block_options.SAVED_KINDS`):
kept through the block's backward, not rebuilt."""


def _op_name(node: fx.Node) -> str:
    target = node.target
    packet = getattr(target, "_overloadpacket", None)
    return getattr(packet, "__name__", None) or getattr(target, "__name__", str(target))


def _keeps_operand(node: fx.Node, operand: fx.Node) -> bool:
    """Whether ``node``'s backward reads ``operand`` (so autograd keeps it until then)."""
    name = _op_name(node)
    if node.target in PASS_THROUGH or name in _KEEPS_NO_INPUT:
        return False
    if name in ("mul", "div"):  # by a tensor: each operand's gradient reads the other one
        others = [a for a in node.args if isinstance(a, fx.Node) and a is not operand]
        return bool(others) or (name == "div" and node.args and node.args[-1] is operand)
    return True


def _activation_readers(v: fx.Node, inside: dict, activations: set) -> list[int]:
    """Positions in the span of the activation nodes reading ``v``, directly or through values made
    from it inside the span that are no activations (a parameter's transpose, its cast)."""
    out, todo, seen = [], list(v.users), set()
    while todo:
        u = todo.pop()
        if u in seen or u not in inside:
            continue
        seen.add(u)
        if u in activations:
            out.append(inside[u])
        else:
            todo.extend(u.users)
    return out


def span_gradient_bytes(nodes: Sequence[fx.Node], activations: set[fx.Node],
                        local_bytes: dict[str, int], selective: bool = False,
                        param_values: frozenset | set = frozenset()) -> int:
    """What backward through ``nodes`` (one block's graph nodes in forward order) holds at its peak
    beyond the block's rebuilt activations (see the module doc): at each node in backward order, the
    activation gradients alive, plus the block's parameter gradients made so far, less the rebuilt
    activations freed already; the most over the nodes.

    Args:
        nodes: the block's span.
        activations: :func:`activation_nodes` of the graph.
        local_bytes: node name -> its output's bytes on this process.
        selective: ``block_selective`` (the matmul-class and attention outputs are kept, not rebuilt:
            not freed here).
        param_values: :func:`parameter_nodes` of the graph (their gradients, made as the block's
            backward reaches their last reader, are the block's parameter gradients).

    Example:
        >>> g = fx.Graph(); x = g.placeholder("x")
        >>> h = g.call_function(_aten.mul.Tensor, (x, x)); y = g.call_function(_aten.add.Tensor, (h, x))
        >>> out = g.output(y)
        >>> for n in (x, h, y):
        ...     n.meta["val"] = torch.ones(4)
        >>> span_gradient_bytes([h, y], {x, h, y}, {n.name: 16 for n in (x, h, y)})  # y's (= h's = x's), x's
        32
    """
    inside = {n: i for i, n in enumerate(nodes)}
    end = len(nodes)
    values = list(dict.fromkeys([a for n in nodes for a in n.all_input_nodes if a not in inside]
                                + list(nodes)))
    root: dict[fx.Node, fx.Node] = {}

    def find(v: fx.Node) -> fx.Node:
        while root.get(v, v) is not v:
            v = root[v]
        return v

    intervals: dict[fx.Node, tuple[int, int]] = {}  # value -> (producer's index, first reader's in backward)
    made_at = [0] * end  # a gradient made beside a buffer that exists already (a second reader's)
    params_at = [0] * end  # parameter gradients made at each node
    freed_at = [0] * (end + 1)  # rebuilt activations whose last reader in backward ran at each node
    for v in values:
        if v not in activations:
            if v not in inside and v in param_values:  # a parameter (or its copy): its gradient is
                readers = _activation_readers(v, inside, activations)  # made at its last reader
                if readers:
                    params_at[max(readers)] += int(local_bytes.get(v.name, 0))
            continue
        readers = [u for u in v.users if u not in inside or u in activations]  # (read after the block:
        # the gradient comes from there)
        if not readers:
            continue
        start = max((inside.get(u, end) for u in readers), default=-1)
        producer = inside.get(v, -1)
        if producer >= 0 and v.target is operator.getitem and v.args[0] in inside:
            producer = inside[v.args[0]]  # a tuple's item: its gradient goes on to the tuple's producer
        intervals[v] = (producer, start)
        first = next(u for u in readers if inside.get(u, end) == start)
        if first in inside and passes_gradient(first, v):
            root[v] = first  # the reader's output gradient itself: one storage (later contributions are
            # added into it)
        for u in readers:  # a later reader's contribution: made beside the buffer, then added into it
            if u in inside and inside[u] < start and not passes_gradient(u, v):
                made_at[inside[u]] += int(local_bytes.get(v.name, 0))
        if v in inside and not (selective and _op_name(v) in _SELECTIVE_KEEPS):
            savers = [inside[u] for u in v.users if u in inside and _keeps_operand(u, v)]
            if _op_name(v) in _KEEPS_OUTPUT:
                savers.append(inside[v])
            if savers:  # rebuilt and kept by autograd until its last saver's backward ran
                freed_at[min(savers)] += int(local_bytes.get(v.name, 0))
    storages: dict[fx.Node, list] = {}
    for v, (low, high) in intervals.items():
        r = find(v)
        entry = storages.setdefault(r, [low, high, 0])
        entry[0], entry[1] = min(entry[0], low), max(entry[1], high)
        entry[2] = max(entry[2], int(local_bytes.get(v.name, 0)))
    best = 0
    params = freed = 0
    for step in range(end - 1, -1, -1):
        params += params_at[step]
        freed += freed_at[step + 1]  # freed once the saver after this node ran its backward
        alive = sum(b for low, high, b in storages.values() if low <= step <= high)
        best = max(best, alive + made_at[step] + params - freed)
    return best


def block_gradient_bytes(graph: fx.Graph, plan, sig, checkpoint_modules: Sequence[str] | None = None,
                         local_bytes: dict[str, int] | None = None) -> dict[str, int]:
    """Block name -> the activation gradients in flight at the peak of its backward, on one process
    (:func:`span_gradient_bytes` over each checkpointed block's span; empty without block options).

    Args:
        graph: the exported graph the plan places.
        plan: the :class:`tensoropt.executor.job.plan.ExecPlan`.
        sig: the graph's :class:`tensoropt.executor.job.program.Signature` (``params``, ``user_inputs``).
        checkpoint_modules: the job's ``training.checkpoint_modules`` (None: the repeated modules).
        local_bytes: node name -> its output's bytes on one process
            (:func:`tensoropt.executor.state.peak_memory.local_output_bytes`; computed when None).

    Example:
        >>> block_gradient_bytes(trainer.ep.graph, trainer.plan, trainer.sig)  # doctest: +SKIP
        {'transformer.h.0': 13631488, 'transformer.h.1': 13631488}
    """
    from tensoropt.executor.state.block_checkpoint import block_spans
    from tensoropt.executor.state.peak_memory import local_output_bytes

    spans = block_spans(graph, plan.placements, set(), checkpoint_modules)
    if not spans:
        return {}
    if local_bytes is None:
        local_bytes = local_output_bytes(graph, plan)
    activations = activation_nodes(graph, sig.params, sig.user_inputs)
    param_values = parameter_nodes(graph, sig.params, sig.user_inputs)
    return {span.name: span_gradient_bytes(span.nodes, activations, local_bytes,
                                           span.option == "block_selective", param_values)
            for span in spans.values()}


def block_copy_bytes(spans, copy_bytes: dict[str, int]) -> dict[str, int]:
    """Block name -> the parameters' compute-dtype copies its checkpoint keeps, in forward order.

    In a mixed precision the interpreter casts each parameter where the graph reads it (its
    placeholder); a checkpointed block reads the cast copies as inputs, so the checkpoint keeps them
    until the block's backward ran (under zero3 the cast shards: the gathers run inside the block).
    A copy two blocks read lives until the backward of the first of them (in forward order): it is
    that block's.

    Args:
        spans: the checkpointed blocks' :class:`~tensoropt.executor.state.block_checkpoint.BlockSpan`
            in forward order (:func:`~tensoropt.executor.state.block_checkpoint.block_spans`' values).
        copy_bytes: parameter placeholder name -> bytes of its compute-dtype copy on this process
            (:func:`tensoropt.executor.state.peak_memory.param_copy_bytes`; empty without a mixed
            precision: the blocks then keep the parameters themselves, which stay).

    Example:
        >>> from types import SimpleNamespace as Span
        >>> w0, w1 = Span(name="p_w0"), Span(name="p_w1")
        >>> spans = [Span(name="h.0", inputs=[w0]), Span(name="h.1", inputs=[w1, w0])]
        >>> block_copy_bytes(spans, {"p_w0": 8, "p_w1": 4})
        {'h.0': 8, 'h.1': 4}
    """
    out: dict[str, int] = {}
    taken: set[str] = set()
    for span in spans:
        names = {a.name for a in span.inputs if a.name in copy_bytes and a.name not in taken}
        taken |= names
        out[span.name] = sum(int(copy_bytes[n]) for n in names)
    return out


def released_copy_bytes(per_block: dict[str, int]) -> dict[str, int]:
    """Block name -> the copies of the blocks after it in forward order (:func:`block_copy_bytes`):
    released by the time backward reaches it (each checkpoint frees its inputs once its backward ran),
    though a plan's memory (its rows' ``param_bytes``) counts every block's copies at once.

    Measured (docs/results.md, 2026-11-28 ``blockfix``): HF Llama, 4 layers of width 256, bf16-mixed +
    zero3, ``block_recompute``: 0.56 MiB of cast shards per block; without this term the prediction
    peaked at the first layer's rerun, 3 x 0.56 MiB too high (+7.3 %).

    Example:
        >>> released_copy_bytes({"h.0": 8, "h.1": 4, "h.2": 2})
        {'h.0': 6, 'h.1': 2, 'h.2': 0}
    """
    out: dict[str, int] = {}
    later = 0
    for name in reversed(list(per_block)):
        out[name] = later
        later += int(per_block[name])
    return dict(reversed(list(out.items())))


__all__ = ["PASS_THROUGH", "activation_nodes", "block_copy_bytes", "block_gradient_bytes", "parameter_nodes",
           "passes_gradient", "released_copy_bytes", "span_gradient_bytes"]
