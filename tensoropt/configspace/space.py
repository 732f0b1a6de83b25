"""Enumerate split assignments of an operator's parallel dims over a mesh and derive placements.

An operator is described by its *parallel dims* (:class:`ParDim`): a name from the label
vocabulary, a size, and where the dim sits in each activation operand, each parameter and the
output. A configuration gives each parallel dim a set of mesh axes. Axes of one level and size are
interchangeable, so only the *number* of such axes per dim is enumerated; the canonical assignment
hands out the axes of a group in ascending order to the dims in vocabulary order (``batch`` first),
which every operator follows, so equal labels mean equal placements across operators.

Placements follow: a tensor dim split over axis ``a`` is ``S(d)`` on ``a``, anything else ``R``.
Splitting a reduction dim (``reduction=True``, e.g. a matmul's ``in``) makes the raw output a
partial sum on those axes (``partial_axes``; the output layout, after the node's all-reduce, is
``R`` there). Splitting a dim with ``grad_sync=True`` (batch, sequence, heads...) over an axis on
which a parameter is replicated makes that parameter's gradient a partial sum there
(``grad_sync_axes``). A dim is split only when its size is divisible by the degree.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from tensoropt.configspace.configuration import PARALLEL_DIMS, Configuration, Mesh, make_label


@dataclass(frozen=True)
class ParDim:
    """One parallel dim of an operator.

    Attributes:
        name: vocabulary name (``batch``, ``out``, ``in``, ``spatial``, ``seq``, ``heads``, ``vocab``).
        size: its extent.
        operand_dims: per activation operand (OpGraph ``inputs`` order): the tensor dim, or None.
        param_dims: state-dict key -> the parameter's own dim (keys absent or None: not split).
        out_dim: the output dim, or None.
        reduction: splitting it leaves a partial-sum output.
        grad_sync: splitting it leaves parameters it does not index with partial gradients.
        max_axes: split over at most this many mesh axes (None: no limit), for splits DTensor
            cannot run over several axes.
        excludes: names of dims never split together with this one.
    """

    name: str
    size: int
    operand_dims: tuple[int | None, ...]
    param_dims: dict = field(default_factory=dict)
    out_dim: int | None = None
    reduction: bool = False
    grad_sync: bool = True
    max_axes: int | None = None
    excludes: tuple[str, ...] = ()

    def __hash__(self) -> int:
        return hash((self.name, self.size, self.operand_dims, self.out_dim))


def axis_groups(mesh: Mesh) -> list[list[int]]:
    """Interchangeable mesh axes: grouped by (level, size), ascending.

    Example:
        >>> axis_groups(Mesh.for_cluster(8, devices_per_node=4))
        [[0], [1, 2]]
    """
    groups: dict[tuple[str, int], list[int]] = {}
    for a, (size, level) in enumerate(zip(mesh.shape, mesh.levels)):
        groups.setdefault((level, size), []).append(a)
    return list(groups.values())


def _counts(n_axes: int, n_dims: int, whole: bool):
    """All ways to give 0..n_axes axes in total to n_dims dims (per-dim counts).

    With ``whole``, a group goes entirely to one dim or stays replicated.
    """
    if whole:
        yield (0,) * n_dims
        for d in range(n_dims):
            yield tuple(n_axes if i == d else 0 for i in range(n_dims))
        return
    for combo in itertools.product(range(n_axes + 1), repeat=n_dims):
        if sum(combo) <= n_axes:
            yield combo


def enumerate_splits(
    dims: list[ParDim], mesh: Mesh, max_split_dims: int | None = None, whole_levels: bool = False
) -> list[dict[str, tuple[int, ...]]]:
    """Every canonical assignment of mesh axes to ``dims`` whose degrees divide the dim sizes.

    Args:
        dims: the operator's parallel dims (names unique).
        mesh: the device mesh.
        max_split_dims: if set, at most this many dims are split at once (a smaller space for
            large meshes).
        whole_levels: if True, the axes of one level (and size) all go to one dim or none:
            ``(d + 1)`` choices per level instead of ``C(n + d, d)`` (for P in the hundreds).

    Returns:
        ``{dim name: ascending axes}`` per assignment (unsplit dims omitted); the empty dict
        (replicate) first.

    Example:
        >>> mesh = Mesh((2, 2), ("gpu", "gpu"))
        >>> dims = [ParDim("batch", 4, (0,)), ParDim("out", 2, (None,), out_dim=1)]
        >>> [make_label(s, mesh) for s in enumerate_splits(dims, mesh)]
        ['replicate', 'batch=2', 'out=2', 'batch=2,out=2', 'batch=4']
    """
    order = sorted(dims, key=lambda d: PARALLEL_DIMS.index(d.name))
    groups = axis_groups(mesh)
    per_group = [list(_counts(len(g), len(order), whole_levels)) for g in groups]
    result = []
    for choice in itertools.product(*per_group):
        axes: dict[str, list[int]] = {d.name: [] for d in order}
        for group, counts in zip(groups, choice):
            it = iter(group)
            for d, c in zip(order, counts):
                axes[d.name].extend(next(it) for _ in range(c))
        ok = True
        for d in order:
            degree = 1
            for a in axes[d.name]:
                degree *= mesh.shape[a]
            too_many = d.max_axes is not None and len(axes[d.name]) > d.max_axes
            clash = axes[d.name] and any(axes.get(other) for other in d.excludes)
            if d.size % degree or too_many or clash:
                ok = False
                break
        if ok and max_split_dims is not None:
            ok = sum(1 for v in axes.values() if v) <= max_split_dims
        if ok:
            result.append({k: tuple(sorted(v)) for k, v in axes.items() if v})
    result.sort(
        key=lambda s: (sum(len(v) for v in s.values()), [(PARALLEL_DIMS.index(k), v) for k, v in s.items()])
    )
    return result


def build_configuration(
    dims: list[ParDim],
    splits: dict[str, tuple[int, ...]],
    mesh: Mesh,
    num_operands: int,
    params: list[str],
    options: tuple[str, ...] = (),
) -> Configuration:
    """The Configuration (layouts, partial and gradient-sync axes) of one split assignment.

    Example:
        >>> mesh = Mesh((2,), ("gpu",))
        >>> dims = [ParDim("batch", 4, (0,), out_dim=0), ParDim("in", 8, (1,), {"w": 1}, reduction=True)]
        >>> c = build_configuration(dims, {"in": (0,)}, mesh, 1, ["w"])
        >>> c.inputs, c.params, c.output, c.partial_axes
        ((('S(1)',),), (('w', ('S(1)',)),), ('R',), (0,))
    """
    by_name = {d.name: d for d in dims}
    n = len(mesh.shape)
    inputs = [["R"] * n for _ in range(num_operands)]
    param_layouts = {k: ["R"] * n for k in params}
    output = ["R"] * n
    partial: list[int] = []
    sync: dict[str, list[int]] = {k: [] for k in params}
    for name, axes in splits.items():
        d = by_name[name]
        for a in axes:
            for i, od in enumerate(d.operand_dims):
                if od is not None:
                    inputs[i][a] = f"S({od})"
            for k in params:
                pd = d.param_dims.get(k)
                if pd is not None:
                    param_layouts[k][a] = f"S({pd})"
                elif d.grad_sync and not d.reduction:
                    sync[k].append(a)
            if d.reduction:
                partial.append(a)
            elif d.out_dim is not None:
                output[a] = f"S({d.out_dim})"
    ordered = [(name, splits[name]) for name in PARALLEL_DIMS if name in splits]
    return Configuration(
        label=make_label(splits, mesh, options),
        splits=tuple(ordered),
        inputs=tuple(tuple(x) for x in inputs),
        params=tuple((k, tuple(v)) for k, v in param_layouts.items()),
        output=tuple(output),
        partial_axes=tuple(sorted(partial)),
        grad_sync_axes=tuple((k, tuple(sorted(v))) for k, v in sync.items() if v),
        options=options,
    )


def configurations_of(
    dims: list[ParDim], mesh: Mesh, num_operands: int, params: list[str], **limits
) -> list[Configuration]:
    """All configurations of an operator with parallel dims ``dims`` (replicate first).

    ``limits`` are :func:`enumerate_splits`'s ``max_split_dims`` and ``whole_levels``.

    Example:
        >>> mesh = Mesh.for_cluster(4, devices_per_node=4)
        >>> [c.label for c in configurations_of([ParDim("batch", 8, (0,), out_dim=0)], mesh, 1, [])]
        ['replicate', 'batch=2', 'batch=4']
    """
    names = [d.name for d in dims]
    if len(set(names)) != len(names):
        raise ValueError(f"parallel dims must have unique names, got {names}")
    splits = enumerate_splits(dims, mesh, **limits)
    return [build_configuration(dims, s, mesh, num_operands, params) for s in splits]
