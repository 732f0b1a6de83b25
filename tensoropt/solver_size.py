"""How much memory a device count's cost tables take, known before they are built.

The cost graph holds, for every edge ``(u, v)``, ``C_u x C_v`` configuration pairs with a cost
vector and three components (``estimators`` fills them); the solver copies each into a leaf
table. Both are fixed by the configuration counts, which are cheap to enumerate, so a space too
large for the solver's memory limit (:func:`frontier.memory_limit.default_limit_bytes`) is refused
in seconds, naming what to shrink, instead of after minutes of pricing and solving.

Example:
    >>> import torch
    >>> from tensoropt.capture import capture
    >>> from tensoropt.configspace import configurations
    >>> from tensoropt.configspace.configuration import Mesh
    >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    >>> g = capture(model, (torch.randn(4, 8),))
    >>> size = table_size(g, configurations(g, Mesh((2,), ("gpu",))))
    >>> size.edges, size.max_configurations, size.bytes > 0
    (2, 4, True)
"""

from __future__ import annotations

from dataclasses import dataclass

#: float64 values stored per configuration pair: the cost vector (time, memory) and the cost
#: graph's components (comm_s, memory_bytes, buffer_bytes), then the solver's leaf copy of the
#: cost vector and its group offset.
VALUES_PER_PAIR = 2 + 3 + 2 + 1


@dataclass(frozen=True)
class TableSize:
    """The size of a device count's cost tables."""

    bytes: float
    """Bytes of the edge cost tables and the solver's copies of them (about)."""
    edges: int
    """Edges of the operator graph."""
    max_configurations: int
    """Most configurations of one operator (memory options included)."""
    largest_edge: str
    """The edge with the most configuration pairs, ``"u -> v"``."""


def _option_factor(node: dict, memory_options) -> int:
    """Upper bound on the variants the memory options make of one configuration."""
    blocks = sum(o in memory_options for o in ("block_recompute", "block_selective"))
    factor = max(2 if "recompute" in memory_options else 1, 1 + blocks)
    if node.get("params"):
        factor *= 1 + sum(o in memory_options for o in ("zero1", "zero2", "zero3"))
    return factor


def table_size(graph, configurations: dict, memory_options=()) -> TableSize:
    """Bytes of the cost tables of ``graph`` with ``configurations`` (see the module docstring).

    Args:
        graph: the OpGraph (or its networkx graph).
        configurations: node -> configurations without options
            (:func:`tensoropt.configspace.configurations`).
        memory_options: the job's ``training.memory_options`` (each multiplies configurations).

    Returns:
        The :class:`TableSize`; configurations with options are counted as offered everywhere
        they could be (an upper bound on the options' share).

    Example:
        >>> import networkx as nx
        >>> g = nx.DiGraph([("x", "fc")])
        >>> g.nodes["fc"]["params"] = {"weight": (4, 4)}
        >>> size = table_size(g, {"x": [None] * 3, "fc": [None] * 10}, ["zero3"])
        >>> size.largest_edge, size.max_configurations
        ('x -> fc', 20)
    """
    g = graph.nx if hasattr(graph, "nx") else graph
    count = {
        n: max(1, len(configurations.get(n) or ())) * _option_factor(g.nodes[n], memory_options)
        for n in g.nodes
    }
    pairs = {(u, v): count[u] * count[v] for u, v in g.edges}
    largest = max(pairs, key=pairs.get) if pairs else None
    total = 8.0 * VALUES_PER_PAIR * sum(pairs.values()) + 8.0 * 4 * sum(count.values())
    return TableSize(
        bytes=total,
        edges=len(pairs),
        max_configurations=max(count.values(), default=0),
        largest_edge=f"{largest[0]} -> {largest[1]}" if largest else "",
    )


def check_table_size(
    size: TableSize, num_devices: int, limit_bytes: float | None, hierarchical: bool
) -> None:
    """Raise ``MemoryError`` with what to shrink when ``size`` is past ``limit_bytes``.

    Example:
        >>> try:
        ...     check_table_size(TableSize(2.0**31, 10, 500, "a -> b"), 64, 2.0**30, False)
        ... except MemoryError as e:
        ...     print(str(e).split(";")[0])
        the cost tables of 64 devices need about 2.0 GiB (10 edges, up to 500 configurations per operator, \
the largest edge a -> b), past the solver limit of 1.0 GiB
    """
    from frontier.memory_limit import ENV

    if limit_bytes is None or size.bytes <= limit_bytes:
        return
    shrink = "" if hierarchical else (
        "use planner.space: hierarchical (or a smaller planner.full_space_max_devices), "
    )
    raise MemoryError(
        f"the cost tables of {num_devices} device{'s' * (num_devices != 1)} need about "
        f"{size.bytes / 2**30:.1f} GiB "
        f"({size.edges} edges, up to {size.max_configurations} configurations per operator, the "
        f"largest edge {size.largest_edge}), past the solver limit of "
        f"{limit_bytes / 2**30:.1f} GiB; "
        f"{shrink}fewer training.memory_options, or raise the limit with {ENV}"
    )
