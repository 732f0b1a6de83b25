"""Simplifying passes over a traced step's local program: less work per replayed step, same values.

A traced step records every operator the DTensor interpreter ran, including work whose result is
the same every step and operators that only re-label a tensor. Eager PyTorch (and DDP) pays for
both on every step too; the replayed program need not:

* :func:`fold_constants`: an operator whose inputs are all constants (no graph input reaches it:
  HF Llama's causal mask and position ids built from ``arange``, BERT's position ids, the
  backward's ``full`` seed) is computed once, when the program is traced, and the program reads
  the result (a ``get_attr`` of a buffer of the ``GraphModule``). Only deterministic operators
  that write no input are folded, never a collective; a folded result that any later operator
  writes in place (through views too) or that the program returns stays computed every step,
  and at most :data:`MAX_FOLDED_BYTES` are kept per program (the memory they hold between steps).
* :func:`drop_aliases`: ``detach`` / ``alias`` (the replay runs without autograd, so they only
  re-label), and ``view`` / ``_unsafe_view`` to the shape the tensor already has, are replaced by
  their input: the same storage, sizes and strides, one Python call and dispatch fewer each.

Example:
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> gm = make_fx(lambda x: x + torch.arange(3).float().exp().detach())(torch.ones(3))
    >>> drop_aliases(gm), fold_constants(gm)
    (1, 1)
    >>> [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    ['aten.add.Tensor']
    >>> gm(torch.zeros(3)).tolist() == torch.arange(3).float().exp().tolist()
    True
"""

from __future__ import annotations

import torch
import torch.fx as fx
from torch.fx.node import map_arg

from tensoropt.executor.program.graph_passes import _WAIT, _is_collective, _pure

aten = torch.ops.aten

MAX_FOLDED_BYTES = 1 << 20
"""Most bytes of folded constants one program keeps between steps (HF Llama's local causal mask at
seq 64: 16 KiB; a mask at seq 2048 would be 16 MiB and is recomputed instead)."""

_UNDEFINED_VALUES = {aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default,
                     aten.new_empty.default, aten.new_empty_strided.default}
"""Operators whose result has no defined value (a buffer to be written): never folded."""

_RELABELS = {aten.detach.default, aten.alias.default}
_VIEWS = {aten.view.default, aten._unsafe_view.default}


def _nbytes(n: fx.Node) -> int:
    """Bytes of ``n``'s traced result (its ``meta["val"]``; 0 when unknown or not a tensor)."""
    val = n.meta.get("val")
    return val.numel() * val.element_size() if isinstance(val, torch.Tensor) else 0


def _foldable(n: fx.Node) -> bool:
    return (n.op == "call_function" and _pure(n) and not _is_collective(n) and n.target is not _WAIT
            and n.target not in _UNDEFINED_VALUES)


def _returns_alias(n: fx.Node) -> bool:
    """Whether ``n``'s result may share storage with an input (a view op, or a getitem of a tuple)."""
    target = n.target
    if isinstance(target, torch._ops.OpOverload):
        return any(r.alias_info is not None for r in target._schema.returns)
    return getattr(target, "__name__", "") == "getitem"


def _written_or_returned(n: fx.Node) -> bool:
    """Whether a reader of ``n`` (or of a view of it) writes it in place, is a collective or the output."""
    todo, seen = list(n.users), set()
    while todo:
        user = todo.pop()
        if user in seen:
            continue
        seen.add(user)
        if user.op != "call_function" or _is_collective(user) or user.target is _WAIT:
            return True
        target = user.target
        if isinstance(target, torch._ops.OpOverload):
            if target._schema.is_mutable:
                return True
        elif getattr(target, "__name__", "") != "getitem":
            return True  # a Python callable: what it does with its input is unknown
        if _returns_alias(user):
            todo.extend(user.users)
    return False


def fold_constants(gm: fx.GraphModule, max_bytes: int = MAX_FOLDED_BYTES) -> int:
    """Compute the operators no graph input reaches once, now; the program reads their results.

    Args:
        gm: a traced step (real-tensor trace: the folded operators run here on the trace's device).
        max_bytes: most storage bytes of folded results the program keeps between steps; an
            operator whose own result is larger is not computed here (nor what reads it), so
            folding holds at most a few such results at once while the program is traced.

    Returns:
        The number of results the program now reads as constants (``get_attr`` nodes).

    Example:
        >>> from torch.fx.experimental.proxy_tensor import make_fx
        >>> gm = make_fx(lambda x: x * torch.ones(2, 2).tril())(torch.ones(2, 2))
        >>> fold_constants(gm), gm(torch.full((2, 2), 3.0)).tolist()
        (1, [[3.0, 0.0], [3.0, 3.0]])
    """
    values: dict[fx.Node, object] = {}
    for n in gm.graph.nodes:
        if not _foldable(n) or any(m not in values for m in n.all_input_nodes) or _nbytes(n) > max_bytes:
            continue
        try:
            read = values.__getitem__
            values[n] = n.target(*map_arg(n.args, read), **map_arg(n.kwargs, read))
        except Exception:  # noqa: BLE001 - an operator that cannot run here is simply computed every step
            continue
    kept_bytes, folded = 0, 0
    for n in list(values):
        value = values[n]
        if not isinstance(value, torch.Tensor) or all(u in values for u in n.users) \
                or _written_or_returned(n):
            continue
        nbytes = value.untyped_storage().nbytes()
        if kept_bytes + nbytes > max_bytes:
            continue
        kept_bytes += nbytes
        name = f"_folded_{folded}"
        gm.register_buffer(name, value, persistent=False)
        with gm.graph.inserting_before(n):
            const = gm.graph.get_attr(name)
        const.meta.update(n.meta)
        n.replace_all_uses_with(const, delete_user_cb=lambda user: user not in values)
        folded += 1
    for n in reversed(list(values)):  # what no step reads any more
        if not n.users:
            gm.graph.erase_node(n)
    if folded:
        gm.graph.lint()
        gm.recompile()
    return folded


def drop_aliases(gm: fx.GraphModule) -> int:
    """Replace ``detach``/``alias`` and same-shape ``view``/``_unsafe_view`` nodes by their input.

    Only for a program run without autograd (the replay runs under ``no_grad``). Returns how many
    nodes were removed.

    Example:
        >>> from torch.fx.experimental.proxy_tensor import make_fx
        >>> gm = make_fx(lambda x: x.view(2, 3).detach().view(3, 2))(torch.ones(2, 3))
        >>> drop_aliases(gm), [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
        (2, ['aten.view.default'])
    """
    dropped = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or not n.args or not isinstance(n.args[0], fx.Node):
            continue
        source = n.args[0]
        if n.target in _VIEWS:
            before, after = source.meta.get("val"), n.meta.get("val")
            if not isinstance(before, torch.Tensor) or not isinstance(after, torch.Tensor) \
                    or tuple(before.shape) != tuple(after.shape):
                continue
        elif n.target not in _RELABELS:
            continue
        n.replace_all_uses_with(source)
        gm.graph.erase_node(n)
        dropped += 1
    return _recompiled(gm, dropped)


def drop_unread(gm: fx.GraphModule) -> int:
    """Remove operator nodes whose result nothing reads and that write nothing: pure, not random, not a
    collective nor a wait (the DTensor trace leaves ``empty_like(..., device='meta')`` and
    ``empty([0])`` results behind, one call each per step, and unread ``getitem``s). Returns how
    many were removed.

    Example:
        >>> g = fx.Graph(); x = g.placeholder("x")
        >>> _ = g.call_function(aten.empty_like.default, (x,), {"device": torch.device("meta")})
        >>> _ = g.output(g.call_function(aten.neg.default, (x,)))
        >>> gm = fx.GraphModule(torch.nn.Module(), g)
        >>> drop_unread(gm), [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
        (1, ['aten.neg.default'])
    """
    dropped = 0
    for n in reversed(list(gm.graph.nodes)):
        if n.users or not _pure(n) or _is_collective(n) or n.target is _WAIT:
            continue
        gm.graph.erase_node(n)
        dropped += 1
    return _recompiled(gm, dropped)


def _recompiled(gm: fx.GraphModule, changed: int) -> int:
    """``changed``, after checking and recompiling ``gm`` where a pass changed something."""
    if changed:
        gm.graph.lint()
        gm.recompile()
    return changed


def simplify(gm: fx.GraphModule) -> dict[str, int]:
    """The passes as the replay applies them to each traced step: :func:`drop_aliases`,
    :func:`fold_constants`, then :func:`drop_unread`. Returns how many nodes each changed.

    Example:
        >>> from torch.fx.experimental.proxy_tensor import make_fx
        >>> simplify(make_fx(lambda x: x.detach() * torch.arange(2))(torch.ones(2)))
        {'aliases': 1, 'constants': 1, 'unread': 0}
    """
    return {"aliases": drop_aliases(gm), "constants": fold_constants(gm), "unread": drop_unread(gm)}
