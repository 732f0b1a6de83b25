"""Configuration space: each operator's parallel configurations on a device mesh.

Example:
    >>> import torch
    >>> from tensoropt.capture import capture
    >>> from tensoropt.configspace import configurations
    >>> from tensoropt.configspace.configuration import Mesh
    >>> g = capture(torch.nn.Linear(8, 8), (torch.randn(4, 8),))
    >>> [c.label for c in configurations(g, Mesh.for_cluster(2, 2))["linear"]]
    ['replicate', 'batch=2', 'out=2', 'in=2']
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from tensoropt.configspace.configuration import Configuration, Mesh
from tensoropt.configspace.space import ParDim, configurations_of

if TYPE_CHECKING:
    import networkx as nx

# The rules (and the capture modules they use) are imported by the first enumeration, so that
# importing `tensoropt.configspace.configuration`, all the executor needs, stays light.

__all__ = ["configurations", "node_configurations", "parallel_dims", "ParDim"]


def _operand_names(g: nx.DiGraph, node: str) -> list[list]:
    """Dim names of each activation operand of ``node`` as it consumes it."""
    out = []
    for e in g.nodes[node]["inputs"]:
        src = g.nodes[e["source"]].get("dim_names") or []
        names = [None] * len(e["shape"])
        for d, m in enumerate(e["dim_map"]):
            if m is not None and d < len(src) and m < len(names):
                names[m] = src[d]
        out.append(names)
    return out


def parallel_dims(g: nx.DiGraph, node: str) -> list[ParDim]:
    """The parallel dims of one OpGraph node (see :mod:`tensoropt.configspace.rules`).

    Example:
        >>> import torch
        >>> from tensoropt.capture import capture
        >>> g = capture(torch.nn.Linear(8, 4), (torch.randn(2, 8),))
        >>> [(d.name, d.size) for d in parallel_dims(g.nx, "linear")]
        [('batch', 2), ('out', 4), ('in', 8)]
    """
    from tensoropt.configspace import rules

    data = dict(g.nodes[node])
    data["_operand_names"] = _operand_names(g, node)
    rule = rules.RULES.get(data["kind"], rules.opaque_dims)
    return rule(data)


def node_configurations(
    g: nx.DiGraph,
    node: str,
    mesh: Mesh,
    max_split_dims: int | None = None,
    whole_levels: bool = False,
    _cache: dict | None = None,
) -> list[Configuration]:
    """Configurations of one node; the first is always ``replicate`` (limits: see :func:`configurations`).

    Example:
        >>> import torch
        >>> from tensoropt.capture import capture
        >>> g = capture(torch.nn.ReLU(), (torch.randn(4, 6),))
        >>> [c.label for c in node_configurations(g.nx, "relu", Mesh.for_cluster(2, 2))]
        ['replicate', 'batch=2']
    """
    data = g.nodes[node]
    dims = parallel_dims(g, node)
    params = list(data["params"])
    # operators of the same structure (a transformer's repeated layers) share one enumeration:
    # it is built once with positional parameter names and renamed for each node
    signature = (
        len(data["inputs"]),
        len(params),
        tuple(
            (
                *(getattr(d, f.name) for f in dataclasses.fields(d) if f.name != "param_dims"),
                tuple(d.param_dims.get(k) for k in params),
            )
            for d in dims
        ),
    )
    cache = {} if _cache is None else _cache
    if signature not in cache:
        positional = [f"#{i}" for i in range(len(params))]
        renamed = [
            dataclasses.replace(d, param_dims={f"#{params.index(k)}": v for k, v in d.param_dims.items()})
            for d in dims
        ]
        cache[signature] = configurations_of(
            renamed,
            mesh,
            len(data["inputs"]),
            positional,
            max_split_dims=max_split_dims,
            whole_levels=whole_levels,
        )
    return [_rename(c, params) for c in cache[signature]]


def _rename(c: Configuration, params: list[str]) -> Configuration:
    """Replace positional parameter names ``#i`` by the node's state-dict keys."""
    if not params:
        return c
    return Configuration(  # the constructor: dataclasses.replace costs 2x over 10^5 renames
        c.label,
        c.splits,
        c.inputs,
        tuple((params[int(k[1:])], v) for k, v in c.params),
        c.output,
        c.partial_axes,
        tuple((params[int(k[1:])], v) for k, v in c.grad_sync_axes),
        c.options,
    )


def configurations(
    graph, mesh: Mesh, *, max_split_dims: int | None = None, whole_levels: bool = False,
    memoise: bool = True,
) -> dict[str, list[Configuration]]:
    """Every node's parallel configurations on ``mesh`` (equivalent ones enumerated once).

    The full space grows as ``C(n + d, d)`` per level of ``n`` axes for an operator of ``d``
    parallel dims (a linear layer has 35 configurations on 8 GPUs of one node, 1225 on 64 GPUs of
    8 nodes, 11541 on 1024 GPUs). For large meshes two limits keep it tractable.

    Args:
        graph: an :class:`~tensoropt.capture.OpGraph` or its ``networkx.DiGraph``.
        mesh: the device mesh (:meth:`Mesh.for_cluster`).
        max_split_dims: split at most this many parallel dims of an operator at once.
        whole_levels: give each level's axes (all nodes, or all GPUs of a node) to a single
            parallel dim or none, as 2-D-mesh planners do: ``(d + 1) ** levels`` configurations.
        memoise: enumerate once per operator signature (parallel dims, operand and parameter
            counts) and rename parameters for the others; ``False`` enumerates every node afresh
            (tests check both agree).

    Returns:
        node name -> configurations (``replicate`` first), labels unique per node.

    Example:
        >>> import torch
        >>> from tensoropt.capture import capture
        >>> g = capture(torch.nn.Linear(8, 8), (torch.randn(4, 8),))
        >>> {n: len(c) for n, c in configurations(g, Mesh.for_cluster(4, 4)).items()}
        {'input': 3, 'linear': 10}
    """
    g = graph.nx if hasattr(graph, "nx") else graph
    cache = {} if memoise else None
    limits = {"max_split_dims": max_split_dims, "whole_levels": whole_levels, "_cache": cache}
    return {node: node_configurations(g, node, mesh, **limits) for node in g.nodes}
