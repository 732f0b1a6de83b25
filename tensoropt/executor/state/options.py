"""Memory options of a plan's nodes in the executor: ``recompute`` and ``zero3`` (forward).

``zero1`` and ``zero2`` change nothing in forward (the node runs as its plain configuration):
they live in the optimizer step, :mod:`tensoropt.executor.state.zero`.

See :mod:`tensoropt.configspace.options` for what they mean and :mod:`estimators.options` for
what they cost. Both rest on :class:`Recipes`, saved-tensor hooks active over the whole forward
that replace a saved tensor (or a view of it) by a recipe that rebuilds it in backward; every other
saved tensor goes to the hooks that were active before (the trainer's memory measurement).

* ``recompute``: the node's op runs under ``torch.utils.checkpoint`` (non-reentrant) on its
  operands already laid out (so what the op would save is rebuilt in backward), and its output is
  registered as a recipe: consumers that save it keep the recipe, which runs the op again from the
  operands. Those operands are kept: as recipes themselves when their producers recompute too (a
  chain of recomputed nodes keeps only the operands entering it, and each recipe runs once per
  backward), else as saved tensors through the outer hooks (measured). Only configurations
  without a partial-sum reduction are offered (the recipe is the op alone).
* ``zero3``: the node's parameters are stored in the configuration's ``params`` layout (sharded
  over the gradient-sync axes; the trainer distributes them so), laid out to the compute layout
  (:func:`tensoropt.configspace.options.compute_params`: an all-gather, whose backward
  reduce-scatters the gradient to the stored shard) right before the op, not memoised, and
  registered as recipes that gather them again in backward (in mixed precision the stored shard
  is cast to the compute dtype before the gather, and cast again from the float32 master for the
  gather in backward: no cast shard is kept).

Example:
    >>> with forward_hooks(interpreter):  # needs a PlanInterpreter on a process group  # doctest: +SKIP
    ...     out = interpreter.run(*values)
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

from tensoropt.configspace.configuration import Configuration
from tensoropt.configspace.options import base_configuration
from tensoropt.executor.job.program import arg_nodes
from tensoropt.executor.state.memory import local
from tensoropt.executor.state.mixed_precision import master_of


def _root(t: torch.Tensor) -> torch.Tensor:
    lt = local(t)
    return lt._base if lt._base is not None else lt


class _Recipe:
    """How to rebuild one tensor; the rebuilt value is cached until every saved copy is unpacked."""

    def __init__(self, root: torch.Tensor, rebuild: Callable[[], torch.Tensor]):
        self.root = weakref.ref(root)
        self.rebuild = rebuild
        self.pending = 0
        self.cached: torch.Tensor | None = None

    def take(self) -> torch.Tensor:
        if self.cached is None:
            with torch.no_grad():
                self.cached = _root(self.rebuild())
        value = self.cached
        self.pending -= 1
        if self.pending <= 0:
            self.cached = None
        return value


class Recipes:
    """Saved-tensor hooks: tensors whose storage has a registered recipe are saved as the recipe.

    A recipe runs at most once per backward (its result is cached until its last saved copy is
    unpacked). Tensors without a recipe go to the hooks active before (packed with :meth:`keep`).

    Example:
        >>> r = Recipes()
        >>> with r:
        ...     x = torch.ones(3, requires_grad=True)
        ...     y = x * 2
        ...     r.register(y, lambda: torch.full((3,), 2.0))
        ...     z = (y * y).sum()  # saves y twice: as two recipes
        >>> z.backward(); x.grad
        tensor([8., 8., 8.])
    """

    def __init__(self):
        self.entries: dict[int, _Recipe] = {}
        self._outer = None
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.keep, self.unkeep)

    def register(self, value: torch.Tensor, rebuild: Callable[[], torch.Tensor]) -> None:
        """Save ``value``'s storage (any view of it) as ``rebuild()`` while ``value`` is alive."""
        root = _root(value)
        self.entries[root.untyped_storage().data_ptr()] = _Recipe(root, rebuild)

    def __enter__(self) -> Recipes:
        self._outer = torch._C._autograd._top_saved_tensors_default_hooks(False)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)

    def keep(self, t):
        """Pack ``t`` (a saved tensor, or an operand a recomputing node keeps): a recipe or ``t``."""
        if not isinstance(t, torch.Tensor):
            return ("plain", t)
        lt = local(t)
        recipe = self.entries.get(lt.untyped_storage().data_ptr())
        root = recipe.root() if recipe else None
        if root is None:
            return ("outer", self._outer[0](t)) if self._outer else ("plain", t)
        recipe.pending += 1
        view = (tuple(lt.size()), tuple(lt.stride()), lt.storage_offset() - root.storage_offset())
        spec = (t.device_mesh, tuple(t.placements), tuple(t.shape), tuple(t.stride())) \
            if isinstance(t, DTensor) else None
        return ("recipe", recipe, view, spec)

    def unkeep(self, packed):
        """Inverse of :meth:`keep` (runs the recipe, or takes its cached result)."""
        if packed[0] == "plain":
            return packed[1]
        if packed[0] == "outer":
            return self._outer[1](packed[1])
        _, recipe, (size, stride, offset), spec = packed
        base = recipe.take()
        with torch.no_grad():
            lt = base.as_strided(size, stride, base.storage_offset() + offset)
            if spec is None:
                return lt
            mesh, placements, shape, global_stride = spec
            return DTensor.from_local(lt, mesh, placements, run_check=False, shape=shape,
                                      stride=global_stride)


_FORWARD = {"recompute", "zero3"}
"""Options that act in forward (and so need :class:`Recipes`)."""


def forward_hooks(interp):
    """The :class:`Recipes` of one forward pass of ``interp`` (a no-op when no node has options).

    Example:
        >>> with forward_hooks(interpreter):  # needs a PlanInterpreter on a process group  # doctest: +SKIP
        ...     out = interpreter.run(*values)
    """
    if interp.mesh is None or not any(_FORWARD & set(c.options) for c in interp.placements.values()):
        interp._recipes = None
        return contextlib.nullcontext()
    interp._recipes = Recipes()
    return interp._recipes


def _checkpointed(compute, n: fx.Node, args, kwargs):
    """``compute(n, args, kwargs)`` under non-reentrant checkpoint, tensors passed at top level."""
    leaves, tree = pytree.tree_flatten((args, kwargs))
    biases = []

    def fn(*values):
        a, k = pytree.tree_unflatten(list(values), tree)
        out, bias = compute(n, a, k)
        if not biases:
            biases.append(bias)
        return out

    out = checkpoint(fn, *leaves, use_reentrant=False)
    return out, biases[0]


def _gathered(interp, n: fx.Node, before: set) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(stored, gathered) parameters of ``n``'s zero3 layout; their memo entries are dropped."""
    stored = set()
    for a, o in zip(arg_nodes(n), interp.operands.get(n.name, [])):
        if o["role"] == "param":
            root = interp._chain(a)[1]
            stored.add(id(interp.env[root]))
    pairs = []
    sources = set(stored)
    for key in [k for k in interp._memo if k not in before]:
        src, moved = interp._memo[key]
        if id(src) in sources:
            if key[0] == "redistribute" and id(src) in stored:
                pairs.append((src, moved))
            sources.add(id(moved))
            del interp._memo[key]
    return pairs


def lay_out(interp, n: fx.Node, config: Configuration):
    """``n``'s operands laid out as ``config``'s split says (its parameters in their compute layout); under
    zero3 the gathered parameters are registered to be gathered again in backward (no gathered copy kept).

    Example:
        >>> # not run here: needs a PlanInterpreter on a process group
        >>> args, kwargs = lay_out(interpreter, node, config)  # doctest: +SKIP
    """
    recipes: Recipes | None = getattr(interp, "_recipes", None)
    before = set(interp._memo)
    args, kwargs = interp._lay_out_operands(n, base_configuration(config))
    if recipes is not None and "zero3" in config.options:
        for stored, gathered in _gathered(interp, n, before):
            def gather(s=stored, p=tuple(gathered.placements)):
                return s.detach().redistribute(s.device_mesh, p)

            master = master_of(stored)
            if master is not None:  # mixed precision: cast the master again, keep no cast shard
                def gather(m=master, dtype=stored.dtype, p=tuple(gathered.placements)):  # noqa: F811
                    return m.detach().to(dtype).redistribute(m.device_mesh, p)

            recipes.register(gathered, gather)
    return args, kwargs


def run_node(interp, n: fx.Node, config: Configuration):
    """Lay out, run and reduce ``n`` under a configuration with memory options; returns its value.

    Example:
        >>> # not run here: needs a PlanInterpreter on a process group
        >>> value = run_node(interpreter, node, config)  # doctest: +SKIP
    """
    recipes: Recipes | None = getattr(interp, "_recipes", None)
    args, kwargs = lay_out(interp, n, config)
    if recipes is None or "recompute" not in config.options:
        out, bias = interp._compute(n, args, kwargs)
        return interp._check_and_reduce(n, config, out, bias)
    out, bias = _checkpointed(interp._compute, n, args, kwargs)
    value = interp._check_and_reduce(n, config, out, bias)
    first = value[0] if isinstance(value, (tuple, list)) else value
    if isinstance(first, torch.Tensor) and not config.partial_axes:
        leaves, tree = pytree.tree_flatten((args, kwargs))
        kept = [recipes.keep(x) for x in leaves]

        def rebuild():
            a, k = pytree.tree_unflatten([recipes.unkeep(x) for x in kept], tree)
            again = interp._check_and_reduce(n, config, *interp._compute(n, a, k))
            return again[0] if isinstance(again, (tuple, list)) else again

        recipes.register(first, rebuild)
    return value
