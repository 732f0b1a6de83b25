"""The data model of one operator's parallel configuration (torch-free).

It lives in ``estimators/`` because the cost model prices configurations and imports nothing of
``tensoropt``; ``tensoropt.configspace.configuration`` re-exports it (the configuration space
enumerates these, the planner, plans and executor read them).

Vocabulary (fixed across the project):

* **axis**: a device-mesh axis. Meshes are factorised into prime-sized axes, grouped by
  cluster level (``"node"`` for axes that cross machines, ``"gpu"`` for axes inside one
  machine). A P=8 job on one 8-GPU node has the mesh ``(2, 2, 2)``, all of level ``gpu``;
  P=8 on 2 nodes x 4 GPUs has ``(2, 2, 2)`` with levels ``("node", "gpu", "gpu")``.
  Axes of one level are interchangeable, so a configuration only says how many axes of
  each level a parallel dimension uses, and the canonical assignment takes them in order.
* **dim**: a tensor dimension (an integer index into a shape).
* **parallel dim**: a named dimension of an operator's iteration space, from the
  vocabulary ``batch``, ``out``, ``in``, ``spatial``, ``seq``, ``heads``, ``vocab``.
* **placement**: one string per mesh axis, in DTensor's notation: ``"R"`` (Replicate),
  ``"S(d)"`` (Shard on tensor dim d), ``"P"`` (Partial sum). A tensor's layout is a tuple
  of placements, one per mesh axis, e.g. ``("S(0)", "R", "S(1)")``.

Label: ``"batch=4,out=2"`` lists the split parallel dims with their degrees in vocabulary
order; ``"replicate"`` when nothing is split. When a dim uses axes of the ``node`` level the
token carries that part in brackets, ``"batch=8[nodes=2]"``; a regex ``(\\w+)=(\\d+)`` still
reads every degree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

PARALLEL_DIMS: tuple[str, ...] = ("batch", "out", "in", "spatial", "seq", "heads", "vocab")
"""The label vocabulary, in the order labels list them."""

Layout = tuple[str, ...]
"""One placement string per mesh axis."""

_SHARD_RE = re.compile(r"^S\((\d+)\)$")


def shard_dim(placement: str) -> int | None:
    """Return the tensor dim of a ``"S(d)"`` placement, else None.

    Example:
        >>> shard_dim("S(1)"), shard_dim("R")
        (1, None)
    """
    m = _SHARD_RE.match(placement)
    return int(m.group(1)) if m else None


def local_shape(shape: tuple[int, ...], layout: Layout, mesh_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of the largest local shard of a tensor of ``shape`` laid out as ``layout``.

    Uneven shards round up (DTensor gives the first ranks the larger chunk).

    Example:
        >>> local_shape((8, 6), ("S(0)", "S(1)"), (2, 2))
        (4, 3)
    """
    out = list(shape)
    for placement, axis_size in zip(layout, mesh_shape):
        d = shard_dim(placement)
        if d is not None:
            out[d] = -(-out[d] // axis_size)
    return tuple(out)


@dataclass(frozen=True)
class Mesh:
    """A device mesh of ``num_devices`` devices factorised into prime-sized axes.

    Example:
        >>> m = Mesh.for_cluster(8, devices_per_node=4)
        >>> m.shape, m.levels
        ((2, 2, 2), ('node', 'gpu', 'gpu'))
    """

    shape: tuple[int, ...]
    levels: tuple[str, ...]

    @property
    def num_devices(self) -> int:
        """Product of the axis sizes."""
        n = 1
        for s in self.shape:
            n *= s
        return n

    @staticmethod
    def for_cluster(num_devices: int, devices_per_node: int) -> Mesh:
        """Inter-node axes first, then intra-node axes, each level factorised into primes.

        Example:
            >>> Mesh.for_cluster(1, 8).shape
            ()
        """
        if num_devices < 1:
            raise ValueError(f"num_devices must be >= 1, got {num_devices}")
        intra = _gcd(num_devices, max(1, devices_per_node))
        inter = num_devices // intra
        node_axes = _prime_factors(inter)
        gpu_axes = _prime_factors(intra)
        return Mesh(
            shape=tuple(node_axes + gpu_axes),
            levels=tuple(["node"] * len(node_axes) + ["gpu"] * len(gpu_axes)),
        )

    def to_json(self) -> dict:
        """JSON form: ``{"shape": [...], "levels": [...]}``."""
        return {"shape": list(self.shape), "levels": list(self.levels)}

    @staticmethod
    def from_json(data: dict) -> Mesh:
        """Inverse of :meth:`to_json`."""
        return Mesh(shape=tuple(int(s) for s in data["shape"]), levels=tuple(data["levels"]))


@dataclass(frozen=True)
class Configuration:
    """One parallel configuration of one operator on one mesh.

    Attributes:
        label: readable, unique within the operator, e.g. ``"batch=4,out=2"``.
        splits: parallel dim -> mesh axes it is split over (ascending axis indices).
        inputs: layout of each tensor input the operator consumes, in the order of the
            OpGraph node's ``inputs`` attribute (the layout the operator computes with).
        params: state-dict key -> layout of that parameter's local shard.
        output: layout of the output *after* the operator's own partial-sum reduction
            (never contains ``"P"``).
        partial_axes: mesh axes on which the raw output is a partial sum (a split
            reduction dim); the operator all-reduces them itself (a node cost).
        grad_sync_axes: state-dict key -> mesh axes over which that parameter's gradient
            is a partial sum (the weight is replicated there while the batch, sequence or
            spatial dim is split); all-reduced every step (a node cost).
        options: extra execution options (e.g. ``("recompute",)``), part of the label.
    """

    label: str
    splits: tuple[tuple[str, tuple[int, ...]], ...]
    inputs: tuple[Layout, ...]
    params: tuple[tuple[str, Layout], ...]
    output: Layout
    partial_axes: tuple[int, ...] = ()
    grad_sync_axes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    options: tuple[str, ...] = field(default=())

    def degree(self, dim: str, mesh: Mesh) -> int:
        """Number of shards of parallel dim ``dim``.

        Example:
            >>> c = Configuration("batch=2", (("batch", (0,)),), (("S(0)",),), (), ("S(0)",))
            >>> c.degree("batch", Mesh((2,), ("gpu",))), c.degree("out", Mesh((2,), ("gpu",)))
            (2, 1)
        """
        axes = dict(self.splits).get(dim, ())
        n = 1
        for a in axes:
            n *= mesh.shape[a]
        return n

    def to_json(self) -> dict:
        """JSON form used in plan.json (placements per node)."""
        return {
            "label": self.label,
            "splits": {d: list(a) for d, a in self.splits},
            "inputs": [list(x) for x in self.inputs],
            "params": {k: list(v) for k, v in self.params},
            "output": list(self.output),
            "partial_axes": list(self.partial_axes),
            "grad_sync_axes": {k: list(v) for k, v in self.grad_sync_axes},
            "options": list(self.options),
        }

    @staticmethod
    def from_json(data: dict) -> Configuration:
        """Inverse of :meth:`to_json`."""
        return Configuration(
            label=data["label"],
            splits=tuple((d, tuple(a)) for d, a in data["splits"].items()),
            inputs=tuple(tuple(x) for x in data["inputs"]),
            params=tuple((k, tuple(v)) for k, v in data["params"].items()),
            output=tuple(data["output"]),
            partial_axes=tuple(data.get("partial_axes", ())),
            grad_sync_axes=tuple((k, tuple(v)) for k, v in data.get("grad_sync_axes", {}).items()),
            options=tuple(data.get("options", ())),
        )


def make_label(splits: dict[str, tuple[int, ...]], mesh: Mesh, options: tuple[str, ...] = ()) -> str:
    """Canonical label of a split assignment.

    Example:
        >>> mesh = Mesh((2, 2, 2), ("node", "gpu", "gpu"))
        >>> make_label({"out": (2,), "batch": (0, 1)}, mesh)
        'batch=4[nodes=2],out=2'
        >>> make_label({}, mesh)
        'replicate'
    """
    tokens = []
    for dim in PARALLEL_DIMS:
        axes = splits.get(dim, ())
        if not axes:
            continue
        degree = 1
        node_degree = 1
        for a in axes:
            degree *= mesh.shape[a]
            if mesh.levels[a] == "node":
                node_degree *= mesh.shape[a]
        token = f"{dim}={degree}"
        if node_degree > 1:
            token += f"[nodes={node_degree}]"
        tokens.append(token)
    tokens.extend(options)
    return ",".join(tokens) if tokens and any("=" in t for t in tokens) else ",".join(["replicate", *options])


def parse_label(label: str) -> dict[str, int]:
    """Degrees by parallel dim from a label (options and node detail ignored).

    Example:
        >>> parse_label("batch=8[nodes=2],out=2,recompute")
        {'batch': 8, 'out': 2}
    """
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"(\w+)=(\d+)", label) if m.group(1) != "nodes"}


def _prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a
