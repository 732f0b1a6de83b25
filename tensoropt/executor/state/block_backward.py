"""The activation gradients in flight while backward runs through a checkpointed block.

When backward reaches a block under ``block_recompute`` or ``block_selective``
(:mod:`tensoropt.executor.state.block_checkpoint`), the checkpoint reruns the block's forward, then
autograd runs the block's backward over the rebuilt activations. The recompute transient the plan
rows price (:func:`estimators.peak.recompute_excess_bytes`: the rebuilt activations less the
gradients not made yet and the activations freed already) leaves out the *gradients of the
activations* alive at that moment: the gradient arriving from the layers above (in a residual
block it stays alive through the whole block: the skip connection holds it), and at each operator
the gradient of its output beside the gradients its backward makes for its inputs. Measured at the
tensor peak of width-256 HF GPT-2 under ``block_recompute`` (the first block's rerun, its GELU's
backward): the gradient of the MLP's down projection input (4 MiB), the two gradients ``mul``'s
backward makes from it (4 + 4 MiB) and the residual stream's gradient (1 MiB): 13 MiB that the
rows' transient did not have (docs/results.md, "the activation gradients in flight").

:func:`block_gradient_bytes` walks each block's nodes in backward order (the graph's order
reversed) and, at each node, adds the gradients alive there, from the graph:

* a value's gradient is alive from the backward of its first consumer in backward order (its last
  reader in forward order; a value read after the block, one of its outputs: from the block's
  start) to the backward of its producer (a value the block reads from outside: to the block's end);
* a gradient is a storage of its own unless the value's only reader passes the gradient through
  without making a tensor (views, ``getitem``, ``clone``, an ``add`` operand of the output's shape:
  their backward returns the output's gradient itself), where it is that reader's output's gradient
  (one storage, counted once);
* only activations have gradients here: floating values that depend on both a user input and a
  parameter; a parameter's own gradient (and a cast or gathered copy's, which becomes it) is in the
  plan's gradient bytes already;
* bytes on this process: the value's bytes over the mesh axes its layout splits
  (:func:`tensoropt.executor.state.peak_memory.local_output_bytes`).

The largest sum over a block's nodes is its figure. Not modelled (both lower the real peak a little):
the rebuilt activations an operator saved are freed after its backward (the transient counts them
all alive), and the block's own parameter gradients appear as its backward runs (the rows count them
as not made yet).

Example:
    >>> block_gradient_bytes(trainer.ep.graph, trainer.plan, trainer.sig)  # doctest: +SKIP
    {'transformer.h.0': 13631488, ...}
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
    return {n for n in from_param & from_input if _floating(n.meta.get("val"))}


def _floating(val) -> bool:
    """A floating tensor, or a tuple holding one (an attention kernel's outputs)."""
    if isinstance(val, (tuple, list)):
        return any(_floating(v) for v in val)
    return isinstance(val, torch.Tensor) and val.is_floating_point()


def span_gradient_bytes(nodes: Sequence[fx.Node], activations: set[fx.Node],
                        local_bytes: dict[str, int]) -> int:
    """The most activation-gradient bytes alive at once while backward runs through ``nodes`` (one
    block's graph nodes in forward order; see the module doc).

    Example:
        >>> g = fx.Graph(); x = g.placeholder("x")
        >>> h = g.call_function(_aten.mul.Tensor, (x, x)); y = g.call_function(_aten.add.Tensor, (h, x))
        >>> out = g.output(y)
        >>> for n in (x, h, y):
        ...     n.meta["val"] = torch.ones(4)
        >>> span_gradient_bytes([h, y], {x, h, y}, {n.name: 16 for n in (x, h, y)})  # y's (= h's), x's
        32
    """
    inside = {n: i for i, n in enumerate(nodes)}
    end = len(nodes)
    values = [a for n in nodes for a in n.all_input_nodes if a not in inside] + list(nodes)
    root: dict[fx.Node, fx.Node] = {}

    def find(v: fx.Node) -> fx.Node:
        while root.get(v, v) is not v:
            v = root[v]
        return v

    intervals: dict[fx.Node, tuple[int, int]] = {}  # value -> (producer's index, first reader's in backward)
    for v in dict.fromkeys(values):
        if v not in activations:
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
        if len(readers) == 1 and readers[0] in inside and passes_gradient(readers[0], v):
            root[v] = readers[0]  # the reader's output gradient itself: one storage
    storages: dict[fx.Node, list] = {}
    for v, (low, high) in intervals.items():
        r = find(v)
        entry = storages.setdefault(r, [low, high, 0])
        entry[0], entry[1] = min(entry[0], low), max(entry[1], high)
        entry[2] = max(entry[2], int(local_bytes.get(v.name, 0)))
    best = 0
    for step in range(end - 1, -1, -1):
        best = max(best, sum(b for low, high, b in storages.values() if low <= step <= high))
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
    return {span.name: span_gradient_bytes(span.nodes, activations, local_bytes) for span in spans.values()}


__all__ = ["PASS_THROUGH", "activation_nodes", "block_gradient_bytes", "passes_gradient",
           "span_gradient_bytes"]
