"""Scheduling passes over a traced step's local program: collectives issued early, written in place.

``make_fx`` records each functional collective where the traced code called it and its wait right
after; :func:`~tensoropt.executor.program.lowering.defer_waits` then moves every wait to its first reader.
These passes go further, changing no value the program computes:

* :func:`reinplace_collectives`: an ``all_reduce`` whose input is a fresh tensor (a gradient
  bucket's ``cat``) that nothing else reads becomes ``all_reduce_`` on that tensor: the functional
  collective's copy of the bucket (every gradient's bytes, every step) is gone. Not for a program
  Inductor compiles (it re-inplaces on its own and wants functional collectives).
* :func:`hoist_collectives`: a small all-reduce (at most :data:`MAX_HOISTED_BYTES`) whose input
  is computed from the graph's inputs by a few pure operators (a loss's count of valid labels)
  moves, with them, to right after its last input: it runs while forward does instead of at the
  loss. An all-gather (ZeRO-3's parameters, gathered again for a recomputed block in backward)
  stays where it is: issued early, its result would be held from the start of the step, and dozens
  in flight at once are what break gloo's all-gather (:mod:`tensoropt.executor.ops.gloo_gathers`).
* :func:`sink_waits`: a wait whose result only feeds the program's output through a few pure
  operators (the loss's reported value) moves, with them, to the end: the all-reduce of the
  loss's sum runs while backward does instead of stopping both ranks at the loss. Backward's
  seed ``ones_like(loss)`` reads only the loss's shape: :func:`cut_shape_reads` makes it a
  ``full`` of that shape first, so backward does not wait for the loss's value. So does a wait
  whose result is only written into graph inputs that nothing reads afterwards (a channel-split
  batch norm's updated running statistics, gathered back into the replicated buffers): the
  all-gather runs beside the rest of the step instead of stopping both ranks at each batch norm
  (the CNN's leanest plan at width 256: 7 blocking all-gathers a step fewer, 2026-11-29).

Example:
    >>> gm = torch.fx.symbolic_trace(torch.nn.ReLU())
    >>> reinplace_collectives(gm), hoist_collectives(gm), sink_waits(gm)
    (0, 0, 0)
"""

from __future__ import annotations

import torch
import torch.fx as fx

_OPS = torch.ops._c10d_functional
_WAIT = _OPS.wait_tensor.default
_ALL_REDUCE = _OPS.all_reduce.default
_COPY = torch.ops.aten.copy_.default
_FRESH = {torch.ops.aten.cat.default, torch.ops.aten.stack.default, torch.ops.aten.clone.default,
          torch.ops.aten._to_copy.default}
"""Operators whose output is a new tensor no input aliases (what a collective may overwrite)."""

MAX_HOISTED_BYTES = 64 * 2**10
"""Largest result of a collective :func:`hoist_collectives` moves earlier (its memory is held longer)."""

MAX_MOVED_NODES = 24
"""Largest chain of operators moved with one collective or wait (the label count and the loss's value
are 3-10 operators; a collective fed by the forward pass or backward stays where it is)."""


def _is_collective(n: fx.Node) -> bool:
    return n.op == "call_function" and str(n.target).startswith("_c10d_functional.") and n.target is not _WAIT


def _pure(n: fx.Node) -> bool:
    """A call of an operator that writes no input and draws no random numbers (a getitem counts)."""
    if n.op != "call_function":
        return False
    target = n.target
    if isinstance(target, torch._ops.OpOverload):
        return not target._schema.is_mutable and torch.Tag.nondeterministic_seeded not in target.tags
    return getattr(target, "__name__", "") == "getitem"


def reinplace_collectives(gm: fx.GraphModule) -> int:
    """Turn ``all_reduce(x)`` into ``all_reduce_(x)`` where ``x`` is fresh and read by nothing else.

    Returns the number of collectives rewritten.

    Example:
        >>> g = fx.Graph(); a = g.placeholder("a")
        >>> c = g.call_function(torch.ops.aten.cat.default, ([a, a],))
        >>> r = g.call_function(_ALL_REDUCE, (c, "sum", "0"))
        >>> w = g.call_function(_WAIT, (r,)); _ = g.output(w)
        >>> gm = fx.GraphModule(torch.nn.Module(), g)
        >>> reinplace_collectives(gm), str(r.target)
        (1, '_c10d_functional.all_reduce_.default')
    """
    changed = 0
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is not _ALL_REDUCE:
            continue
        source = n.args[0]
        if not (isinstance(source, fx.Node) and source.op == "call_function" and source.target in _FRESH
                and len(source.users) == 1):
            continue
        n.target = _OPS.all_reduce_.default
        changed += 1
    if changed:
        gm.recompile()
    return changed


def _input_write(n: fx.Node) -> bool:
    """An in-place copy into a graph input whose result nothing reads (a buffer's new value written back:
    a channel-split batch norm's running statistics, :mod:`tensoropt.executor.ops.batch_norm`)."""
    return (n.op == "call_function" and n.target is _COPY and not n.users and isinstance(n.args[0], fx.Node)
            and n.args[0].op == "placeholder")


def _cone(start: fx.Node, forward: bool, writes: bool = False) -> list[fx.Node] | None:
    """The nodes ``start`` depends on (``forward=False``: back to placeholders) or that depend on it
    (``forward=True``: up to the output, excluded; ``writes``: also the in-place copies into graph
    inputs they end in, :func:`_input_write`), or None when one is impure, a collective, or there
    are more than :data:`MAX_MOVED_NODES`."""
    seen: set[fx.Node] = set()
    todo = [start]
    while todo:
        n = todo.pop()
        for m in (n.users if forward else n.all_input_nodes):
            if m in seen or m.op in ("placeholder", "get_attr", "output"):
                continue
            if writes and _input_write(m):
                seen.add(m)
                continue
            if not _pure(m) or _is_collective(m) or m.target is _WAIT:
                return None
            seen.add(m)
            if len(seen) > MAX_MOVED_NODES:
                return None
            todo.append(m)
    return list(seen)


def hoist_collectives(gm: fx.GraphModule) -> int:
    """Move each small all-reduce fed by a few pure operators on graph inputs, with them, as early as it
    can go. Returns the number of all-reduces moved.

    Example:
        >>> g = fx.Graph(); x = g.placeholder("x"); y = g.placeholder("y")
        >>> h = g.call_function(torch.ops.aten.relu.default, (x,))
        >>> s = g.call_function(torch.ops.aten.sum.default, (y,))
        >>> r = g.call_function(_ALL_REDUCE, (s, "sum", "0")); r.meta["val"] = torch.empty(())
        >>> w = g.call_function(_WAIT, (r,)); _ = g.output((h, w))
        >>> gm = fx.GraphModule(torch.nn.Module(), g)
        >>> hoist_collectives(gm), [n.name for n in gm.graph.nodes][2:5]
        (1, ['sum_default', 'all_reduce_default', 'relu_default'])
    """
    moved = 0
    for c in [n for n in gm.graph.nodes if n.op == "call_function" and n.target is _ALL_REDUCE]:
        val = c.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.numel() * val.element_size() > MAX_HOISTED_BYTES:
            continue
        cone = _cone(c, forward=False)
        if cone is None:
            continue
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        last_input = max((m for n in [*cone, c] for m in n.all_input_nodes if m not in cone),
                         key=order.__getitem__, default=None)
        if last_input is None:
            continue
        if last_input.op == "placeholder":  # after every placeholder: they are the program's arguments
            last_input = max((n for n in gm.graph.nodes if n.op == "placeholder"), key=order.__getitem__)
        anchor, before = last_input, order[c]
        for n in sorted([*cone, c], key=order.__getitem__):
            if order[n] > order[last_input]:  # only ever earlier: a node of the chain may have other readers
                anchor.append(n)
                anchor = n
        if {n: i for i, n in enumerate(gm.graph.nodes)}[c] < before:
            moved += 1
    if moved:
        gm.graph.lint()
        gm.recompile()
    return moved


_LIKE = {torch.ops.aten.ones_like.default: 1, torch.ops.aten.zeros_like.default: 0}


def cut_shape_reads(gm: fx.GraphModule) -> int:
    """Replace ``ones_like(x)`` / ``zeros_like(x)`` of a contiguous result by ``full(shape, value)``, which
    does not wait for ``x``'s value; returns how many were replaced.

    Example:
        >>> from torch.fx.experimental.proxy_tensor import make_fx
        >>> gm = make_fx(lambda x: torch.ones_like(x.sum()))(torch.ones(3))
        >>> cut_shape_reads(gm), [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
        (1, ['aten.sum.default', 'aten.full.default'])
    """
    changed = 0
    for n in list(gm.graph.nodes):
        val = n.meta.get("val")
        formats = (None, torch.preserve_format, torch.contiguous_format)
        if n.op != "call_function" or n.target not in _LIKE or not isinstance(val, torch.Tensor) \
                or not val.is_contiguous() or n.kwargs.get("memory_format") not in formats:
            continue
        with gm.graph.inserting_before(n):
            full = gm.graph.call_function(torch.ops.aten.full.default, (list(val.shape), _LIKE[n.target]),
                                          {"dtype": val.dtype, "layout": torch.strided, "device": val.device,
                                           "pin_memory": False})
        full.meta.update(n.meta)
        n.replace_all_uses_with(full)
        gm.graph.erase_node(n)
        changed += 1
    if changed:
        gm.recompile()
    return changed


def _read_later(write: fx.Node, order: dict[fx.Node, int]) -> bool:
    """Whether a node after the in-place copy ``write`` reads the graph input it writes."""
    return any(order[u] > order[write] for u in write.args[0].users if u is not write)


def sink_waits(gm: fx.GraphModule) -> int:
    """Move each wait whose result reaches only the output, or only in-place copies into graph inputs
    that nothing reads after them (a channel-split batch norm's running statistics gathered back),
    through a few pure operators, with them (and the copies), to right before the output. Returns the
    number of waits moved.

    Example:
        >>> g = fx.Graph(); x = g.placeholder("x")
        >>> r = g.call_function(_ALL_REDUCE, (x, "sum", "0"))
        >>> w = g.call_function(_WAIT, (r,))
        >>> d = g.call_function(torch.ops.aten.div.Tensor, (w, 2))
        >>> h = g.call_function(torch.ops.aten.relu.default, (x,)); _ = g.output((d, h))
        >>> gm = fx.GraphModule(torch.nn.Module(), g)
        >>> sink_waits(gm), [n.name for n in gm.graph.nodes][2:5]
        (1, ['relu_default', 'wait_tensor_default', 'div_tensor'])
    """
    cut_shape_reads(gm)
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    moved = 0
    for w in [n for n in gm.graph.nodes if n.op == "call_function" and n.target is _WAIT]:
        cone = _cone(w, forward=True, writes=True)
        if cone is None:
            continue
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        if any(_read_later(c, order) for c in cone if _input_write(c)):
            continue  # the input is read after its write: the write stays where it is
        if order[output] - order[w] == len(cone) + 1:  # the wait and its readers end the program already
            continue
        for n in sorted([w, *cone], key=order.__getitem__):
            output.prepend(n)
        moved += 1
    if moved:
        gm.graph.lint()
        gm.recompile()
    return moved
