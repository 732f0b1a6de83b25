"""Memory options that multiply an operator's configurations: recompute and ZeRO-1/2/3 (torch-free).

In ``estimators/`` beside :mod:`estimators.configuration` (the cost model prices the layouts it
gives: :mod:`estimators.options`); ``tensoropt.configspace.options`` re-exports it.

A job opts in with ``training.memory_options`` (default: none, the plain space). Each option
adds configurations to the operators it applies to; labels append it
(``"batch=8,zero3,recompute"``). ``zero1``, ``zero2`` and ``zero3`` are mutually exclusive in one
configuration; each combines with ``recompute`` (up to 8 variants of one split):

* ``recompute``: nothing the operator produces is kept for backward: neither what it saves
  itself (it runs under ``torch.utils.checkpoint``) nor its output where consumers save it (they
  keep a recipe instead); its forward runs again in backward, once for itself and once per
  consumer that needs the output. The operands it reads are kept instead. Offered where that keeps
  less (the caller's ``recomputable`` predicate, :func:`estimators.options.recomputable`) and the
  configuration has no partial-sum reduction (the recipe is the local op alone). Chains of
  recomputed operators give the segment checkpointing of Chen et al. (2016): only the operands of
  each chain's first operator stay.
* ``zero3``: the parameters of an operator whose gradient is a partial sum over some mesh axes
  (``grad_sync_axes``: it is replicated there while the batch is split) are *stored* sharded
  over those axes: all-gathered before use in forward and again in backward, their gradient
  reduce-scattered instead of all-reduced; gradient and optimizer state are sharded with them.
  ``Configuration.params`` of a zero3 configuration is the storage layout (the one the
  executor keeps, checkpoints and steps the optimizer on); :func:`compute_params` gives the layout
  the operator computes with. Not offered for tied parameters (one storage, several users).
* ``zero1``: parameters and gradients stay as they are (gradients all-reduced over the
  gradient-sync axes); the optimizer state is kept for a shard only (:func:`state_layouts`: the
  parameter sharded further over its gradient-sync axes), the optimizer steps that shard and the
  updated shards are all-gathered into the parameter.
* ``zero2``: as ``zero1``, and the gradient is reduce-scattered to the shard (as soon as
  backward has accumulated it) instead of all-reduced: each rank keeps only its gradient shard.

  Both are offered where some parameter with gradient-sync axes has a state layout (a dim no other
  mesh axis splits that divides evenly); parameters without one stay plain. Not for tied
  parameters.

Example:
    >>> from estimators.configuration import Configuration, Mesh
    >>> mesh = Mesh((2,), ("gpu",))
    >>> c = Configuration("batch=2", (("batch", (0,)),), (("S(0)",),), (("w", ("R",)),), ("S(0)",),
    ...                   grad_sync_axes=(("w", (0,)),))
    >>> [x.label for x in option_variants(c, {"w": (8, 4)}, mesh, ("recompute", "zero3"), True)]
    ['batch=2', 'batch=2,recompute', 'batch=2,zero3', 'batch=2,zero3,recompute']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from estimators.configuration import Configuration, Layout, Mesh, shard_dim

MEMORY_OPTIONS: tuple[str, ...] = (
    "recompute", "zero1", "zero2", "zero3", "block_recompute", "block_selective", "chunked_loss")
"""Options a job may list in ``training.memory_options`` (the block ones: :mod:`estimators.block_options`;
``chunked_loss``: :mod:`estimators.chunked_loss`)."""

ZERO_OPTIONS: tuple[str, ...] = ("zero1", "zero2", "zero3")
"""The sharding options (at most one per configuration)."""

_LABEL_ORDER = (*ZERO_OPTIONS, "recompute", "block_recompute", "block_selective", "chunked_loss")


def check_options(options: Iterable[str]) -> tuple[str, ...]:
    """Validate a list of memory options; returns them as a tuple (duplicates removed).

    Example:
        >>> check_options(["zero3", "recompute", "zero3"])
        ('zero3', 'recompute')
    """
    out = tuple(dict.fromkeys(options))
    for o in out:
        if o not in MEMORY_OPTIONS:
            raise ValueError(f"unknown memory option {o!r}; expected some of {list(MEMORY_OPTIONS)}")
    return out


def zero_layout(layout: Layout, shape: tuple[int, ...], axes: tuple[int, ...], mesh: Mesh) -> Layout | None:
    """Storage layout of a parameter laid out as ``layout`` and sharded further over ``axes``.

    The shard goes on the first dim that divides evenly by everything split on it; None when no
    dim does (the parameter then cannot be sharded and the option is not offered).

    Example:
        >>> zero_layout(("R", "S(0)"), (4, 6), (0,), Mesh((2, 3), ("gpu", "gpu")))
        ('S(1)', 'S(0)')
    """
    for d, size in enumerate(shape):
        degree = 1
        for a, p in enumerate(layout):
            if shard_dim(p) == d or a in axes:
                degree *= mesh.shape[a]
        if size % degree == 0:
            return tuple(f"S({d})" if a in axes else p for a, p in enumerate(layout))
    return None


def state_layout(layout: Layout, shape: tuple[int, ...], axes: tuple[int, ...], mesh: Mesh) -> Layout | None:
    """Layout of the optimizer-state shard (zero1/zero2) of a parameter laid out as ``layout``.

    Sharded over ``axes`` (its gradient-sync axes) on the first dim that no other mesh axis splits
    and that divides evenly by the product of their sizes, so each rank's shard is a slice of its
    local parameter; None when no dim qualifies.

    Example:
        >>> state_layout(("R", "S(0)"), (4, 6), (0,), Mesh((2, 3), ("gpu", "gpu")))
        ('S(1)', 'S(0)')
        >>> state_layout(("R",), (5,), (0,), Mesh((2,), ("gpu",))) is None
        True
    """
    degree = 1
    for a in axes:
        degree *= mesh.shape[a]
    taken = {shard_dim(p) for a, p in enumerate(layout) if a not in axes}
    for d, size in enumerate(shape):
        if d not in taken and size % degree == 0:
            return tuple(f"S({d})" if a in axes else p for a, p in enumerate(layout))
    return None


def state_layouts(
    config: Configuration, param_shapes: dict[str, tuple[int, ...]], mesh: Mesh
) -> dict[str, Layout]:
    """State-dict key -> optimizer-state layout of the parameters a zero1/zero2 configuration shards.

    Parameters without gradient-sync axes or without a :func:`state_layout` are left out (they
    stay plain); empty for configurations without ``zero1``/``zero2``.

    Example:
        >>> c = Configuration("batch=2,zero2", (("batch", (0,)),), (("S(0)",),),
        ...                   (("w", ("R",)), ("b", ("R",))), ("S(0)",),
        ...                   grad_sync_axes=(("w", (0,)), ("b", (0,))), options=("zero2",))
        >>> state_layouts(c, {"w": (8, 4), "b": (3,)}, Mesh((2,), ("gpu",)))
        {'w': ('S(0)',)}
    """
    if not {"zero1", "zero2"} & set(config.options):
        return {}
    return _state_layouts(config, param_shapes, mesh)


def _state_layouts(config: Configuration, param_shapes, mesh: Mesh) -> dict[str, Layout]:
    sync = dict(config.grad_sync_axes)
    out = {}
    for key, lay in config.params:
        if sync.get(key) and key in param_shapes:
            new = state_layout(lay, tuple(param_shapes[key]), tuple(sync[key]), mesh)
            if new is not None:
                out[key] = new
    return out


def compute_params(config: Configuration) -> tuple[tuple[str, Layout], ...]:
    """Parameter layouts the operator computes with (a zero3 storage layout gathered on its axes).

    Example:
        >>> c = Configuration("batch=2,zero3", (("batch", (0,)),), (("S(0)",),), (("w", ("S(0)",)),),
        ...                   ("S(0)",), grad_sync_axes=(("w", (0,)),), options=("zero3",))
        >>> compute_params(c)
        (('w', ('R',)),)
    """
    if "zero3" not in config.options:
        return config.params
    sync = dict(config.grad_sync_axes)
    return tuple(
        (k, tuple("R" if a in sync.get(k, ()) else p for a, p in enumerate(lay))) for k, lay in config.params
    )


def base_configuration(config: Configuration) -> Configuration:
    """The same split without options (parameters in their compute layout, the plain label).

    Example:
        >>> c = Configuration("replicate,recompute", (), (("R",),), (), ("R",), options=("recompute",))
        >>> base_configuration(c).label
        'replicate'
    """
    if not config.options:
        return config
    label = ",".join(t for t in config.label.split(",") if t not in MEMORY_OPTIONS)
    return dataclasses.replace(config, label=label, params=compute_params(config), options=())


def _with(config: Configuration, options: tuple[str, ...], params=None) -> Configuration:
    ordered = tuple(o for o in _LABEL_ORDER if o in options)
    return dataclasses.replace(
        config,
        label=",".join([config.label, *ordered]),
        params=config.params if params is None else params,
        options=ordered,
    )


def option_variants(
    config: Configuration,
    param_shapes: dict[str, tuple[int, ...]],
    mesh: Mesh,
    options: tuple[str, ...],
    recomputable: bool,
    tied: frozenset[str] = frozenset(),
) -> list[Configuration]:
    """``config`` and its variants under ``options`` (the plain one first).

    Args:
        config: a configuration without options.
        param_shapes: the node's parameters (state-dict key -> shape).
        mesh: the device mesh.
        options: the job's memory options (:data:`MEMORY_OPTIONS`).
        recomputable: whether recomputing this operator keeps less (see the module docstring).
        tied: parameter keys shared with other operators (never sharded by a zero option).

    Returns:
        The plain configuration, then (where offered) ``recompute``, and for each of ``zero1``,
        ``zero2``, ``zero3`` in that order the option alone and with ``recompute``.

    Example:
        >>> c = Configuration("replicate", (), (("R",),), (("w", ("R",)),), ("R",))
        >>> [x.label for x in option_variants(c, {"w": (4,)}, Mesh((2,), ("gpu",)), ("zero3",), False)]
        ['replicate']
    """
    recompute = "recompute" in options and recomputable and not config.partial_axes
    out = [config, _with(config, ("recompute",))] if recompute else [config]
    if not config.grad_sync_axes or set(param_shapes) & tied:
        return out
    for option in ZERO_OPTIONS:
        if option not in options:
            continue
        params = config.params
        if option == "zero3":
            params = _zero3_params(config, param_shapes, mesh)
            if params is None:
                continue
        elif not _state_layouts(config, param_shapes, mesh):
            continue
        out.append(_with(config, (option,), params))
        if recompute:
            out.append(_with(config, (option, "recompute"), params))
    return out


def _zero3_params(config: Configuration, param_shapes, mesh: Mesh):
    """The zero3 storage layouts of ``config``'s parameters; None when one cannot be sharded."""
    sync = dict(config.grad_sync_axes)
    params = []
    for key, lay in config.params:
        new = zero_layout(lay, tuple(param_shapes[key]), sync[key], mesh) if sync.get(key) else lay
        if new is None:
            return None
        params.append((key, new))
    return tuple(params)


def with_options(
    graph,
    configurations: dict[str, list[Configuration]],
    mesh: Mesh,
    options: Iterable[str],
    recomputable: Callable[[str], bool] = lambda name: False,
) -> dict[str, list[Configuration]]:
    """Every node's configurations multiplied by the memory ``options`` (see the module docstring).

    Args:
        graph: the OpGraph (or its networkx graph): node ``params`` and ``shared_params``.
        configurations: node -> configurations without options (:func:`tensoropt.configurations`).
        mesh: the device mesh.
        options: some of :data:`MEMORY_OPTIONS`; empty returns ``configurations`` unchanged.
        recomputable: node name -> whether ``recompute`` is offered for it.

    Example:
        >>> import torch
        >>> from tensoropt.capture import capture
        >>> from tensoropt.configspace import configurations
        >>> g = capture(torch.nn.Linear(8, 8), (torch.randn(4, 8),))
        >>> mesh = Mesh.for_cluster(2, 2)
        >>> [c.label for c in with_options(g, configurations(g, mesh), mesh, ["zero3"])["linear"]]
        ['replicate', 'batch=2', 'batch=2,zero3', 'out=2', 'in=2']
    """
    options = check_options(options)
    if not options:
        return configurations
    g = graph.nx if hasattr(graph, "nx") else graph
    tied = frozenset(k for n in g.nodes for k in (g.nodes[n].get("shared_params") or ()))
    out = {}
    for name, confs in configurations.items():
        params = g.nodes[name].get("params") or {}
        can_recompute = "recompute" in options and recomputable(name)
        out[name] = [
            v for c in confs for v in option_variants(c, params, mesh, options, can_recompute, tied)
        ]
    return out
