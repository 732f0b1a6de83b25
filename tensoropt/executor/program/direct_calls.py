"""A replayed program's aten operators called through their Python bindings: the same kernels, less
host time per node.

A traced program calls each operator as an ``OpOverload`` (``torch.ops.aten.relu.default(x)``):
torch's generic path, which converts every argument into a boxed stack against the schema on every
call. Most aten operators also have a generated Python binding (``torch.relu``, ``Tensor.view``,
``torch._C._nn.max_pool2d_with_indices``) that parses its arguments in C++ and calls the same
operator unboxed, as eager PyTorch does. :data:`MEASURED_US_PER_CALL` gives the two costs.

:func:`direct_calls` returns a copy of a program whose nodes call such a binding where it is
*checked* to be the same call: the binding is run once on meta tensors of the node's traced values
under a dispatch mode that stops at the first operator it dispatches, and it is kept only when that
operator is the node's own overload with equal arguments (the same tensors, equal constants of the
same types). Collectives, waits, Python callables (:mod:`tensoropt.executor.ops.gloo_gathers`) and
operators without such a binding (most backward kernels: ``convolution_backward``,
``native_batch_norm_backward``) keep their targets. The kernels, their arguments and so every value
are the program's own, bit for bit.

Example:
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> gm = make_fx(lambda x: (x.relu() * 2).view(4))(torch.ones(2, 2))
    >>> fast = direct_calls(gm)
    >>> [getattr(n.target, "__name__", str(n.target)) for n in fast.graph.nodes if n.op == "call_function"]
    ['relu', 'mul', 'view']
    >>> torch.equal(fast(torch.full((2, 2), -1.0)), gm(torch.full((2, 2), -1.0)))
    True
"""

from __future__ import annotations

import math

import torch
import torch.fx as fx
from torch.fx.node import map_arg
from torch.utils._python_dispatch import TorchDispatchMode

from tensoropt.executor.ops.gloo_gathers import retargeted_copy

__all__ = ["MEASURED_US_PER_CALL", "binding_of", "direct_calls"]

MEASURED_US_PER_CALL = {"relu": (1.97, 1.12), "view": (3.02, 1.72), "add.Tensor": (2.12, 1.17)}
"""Host time of one call in us, (``OpOverload``, binding), on a 10-element tensor under ``no_grad``:
the mean of 20 000 calls, one thread, torch 2.13 on this project's 2-core CPU at load 1.4
(docs/results.md, branch ``cnnfast``)."""

_SOURCES = (torch._C._VariableFunctions, torch._C._nn, torch._C.TensorBase)
"""Where the bindings live, in the order they are tried: ``torch.*``, ``torch._C._nn.*``, tensor
methods (called as ``TensorBase.view(x, shape)``)."""


class _Dispatched(Exception):
    """The first operator a binding dispatched, with its arguments (raised by :class:`_FirstDispatch`)."""

    def __init__(self, func, args, kwargs):
        super().__init__(str(func))
        self.func, self.args, self.kwargs = func, args, kwargs


class _FirstDispatch(TorchDispatchMode):
    """Stops a call at its first dispatched operator (nothing is computed)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        raise _Dispatched(func, args, kwargs or {})


def _same(a, b) -> bool:
    """The same argument: the same tensor object, or equal constants of the same type (elementwise)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def _same_kwargs(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(_same(a[k], b[k]) for k in a)


def _meta_value(n: fx.Node):
    val = n.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    return torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype, device="meta")


def binding_of(n: fx.Node, metas: dict | None = None):
    """The Python binding that dispatches exactly ``n``'s call (its aten overload, its arguments), or None.

    Args:
        n: a ``call_function`` node of a traced program (its tensor arguments carry ``meta["val"]``).
        metas: a cache of meta tensors per node, shared across the nodes of one program.

    Example:
        >>> from torch.fx.experimental.proxy_tensor import make_fx
        >>> gm = make_fx(lambda x: x.relu() + 1)(torch.ones(2))
        >>> [binding_of(n).__name__ for n in gm.graph.nodes if n.op == "call_function"]
        ['relu', 'add']
        >>> add = gm.graph.find_nodes(op="call_function", target=torch.ops.aten.add.Tensor)[0]
        >>> add.target = torch.ops.aten.add.Scalar  # torch.add(x, 1) dispatches add.Tensor: not this call
        >>> binding_of(add) is None
        True
    """
    target = n.target
    if n.op != "call_function" or not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
        return None
    metas = {} if metas is None else metas
    missing = False

    def meta(m: fx.Node):
        nonlocal missing
        if m not in metas:
            metas[m] = _meta_value(m)
        if metas[m] is None:
            missing = True
        return metas[m]

    args, kwargs = map_arg(n.args, meta), map_arg(n.kwargs, meta)
    if missing:
        return None
    name = target._schema.name.split("::", 1)[1]
    for source in _SOURCES:
        binding = getattr(source, name, None)
        if binding is None or not callable(binding):
            continue
        try:
            with _FirstDispatch():
                binding(*args, **kwargs)
        except _Dispatched as seen:
            if seen.func is target and _same(list(seen.args), list(args)) \
                    and _same_kwargs(seen.kwargs, kwargs):
                return binding
        except Exception:  # noqa: BLE001, S112 - a binding that refuses these arguments is not this call
            continue
    return None


def direct_calls(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` whose aten nodes call their checked Python binding (:func:`binding_of`); ``gm``
    itself when no node has one. Parameters, buffers and folded constants are shared, not copied.

    Example:
        >>> g = fx.Graph(); x = g.placeholder("x"); x.meta["val"] = torch.empty(2)
        >>> _ = g.output(g.call_function(torch.ops.aten.neg.default, (x,)))
        >>> direct_calls(fx.GraphModule(torch.nn.Module(), g)).code.strip().splitlines()[-2].strip()
        'neg_default = torch.neg(x);  x = None'
    """
    metas: dict = {}
    found = {n: b for n in gm.graph.nodes if (b := binding_of(n, metas)) is not None}
    return retargeted_copy(gm, found) if found else gm
