"""The data-parallel plan of a cost graph: which configuration each node takes, and a plan's total cost.

Data parallelism splits every operator's batch dimension over every mesh axis and replicates
operators that have no batch dimension (``replicate``). The planner records that plan beside each
frontier (``Frontier.data_parallel``: selection prefers it within the estimator's measured error)
and :mod:`tensoropt.baselines` writes it as a plan document; both read it here, below them.
"""

from __future__ import annotations

import numpy as np


def data_parallel_index(configurations, mesh, options: tuple[str, ...] = ()) -> int:
    """Index of one node's data-parallel configuration among ``configurations``: the batch split
    over every axis of ``mesh``, or ``replicate`` (no split) where the node has no batch split.
    ``options``: the memory options wanted on it (``("zero3",)``: FSDP's layout), taken where that
    variant exists (a node without parameters has no ZeRO variant), else the plain one.

    Raises:
        ValueError: neither exists (every configuration space offers ``replicate``, so this means
        a hand-made list).

    Example:
        >>> from tensoropt.configspace.configuration import Configuration, Mesh
        >>> confs = [Configuration("replicate", (), (), (), ("R",)),
        ...          Configuration("out=2", (("out", (0,)),), (), (), ("S(1)",)),
        ...          Configuration("batch=2", (("batch", (0,)),), (), (), ("S(0)",))]
        >>> mesh = Mesh((2,), ("gpu",))
        >>> data_parallel_index(confs, mesh), data_parallel_index(confs[:2], mesh)
        (2, 0)
        >>> with_zero3 = confs + [Configuration("batch=2,zero3", (("batch", (0,)),), (), (), ("S(0)",),
        ...                                     options=("zero3",))]
        >>> data_parallel_index(with_zero3, mesh, ("zero3",)), data_parallel_index(with_zero3, mesh)
        (3, 2)
    """
    every_axis = tuple(range(len(mesh.shape)))
    splits = [{dim: tuple(axes) for dim, axes in c.splits if axes} for c in configurations]
    batch = [i for i, s in enumerate(splits) if s == {"batch": every_axis}]
    whole = [i for i, s in enumerate(splits) if not s]
    if not batch and not whole:
        raise ValueError(f"no batch-split and no replicated configuration among "
                         f"{[c.label for c in configurations]}; a data-parallel plan needs one of them")
    candidates = batch or whole
    for wanted in (tuple(options), ()):
        chosen = [i for i in candidates if tuple(configurations[i].options) == wanted]
        if chosen:
            return chosen[0]
    return candidates[0]


def data_parallel_assignment(G, options: tuple[str, ...] = ()) -> dict[str, int]:
    """Node -> configuration index of the data-parallel plan of cost graph ``G``
    (:func:`data_parallel_index` of every node, with ``options`` where a node has them).

    Raises:
        ValueError: naming a node that has neither a batch split nor ``replicate``.

    Example:
        >>> import networkx as nx
        >>> from tensoropt.configspace.configuration import Configuration, Mesh
        >>> G = nx.DiGraph(mesh=Mesh((2,), ("gpu",)))
        >>> G.add_node("fc", configurations=[Configuration("replicate", (), (), (), ("R",)),
        ...            Configuration("out=2", (("out", (0,)),), (), (), ("S(1)",)),
        ...            Configuration("batch=2", (("batch", (0,)),), (), (), ("S(0)",))])
        >>> G.add_node("norm", configurations=[Configuration("replicate", (), (), (), ("R",))])
        >>> data_parallel_assignment(G)
        {'fc': 2, 'norm': 0}
    """
    assignment = {}
    for name, data in G.nodes(data=True):
        try:
            assignment[name] = data_parallel_index(data["configurations"], G.graph["mesh"], options)
        except ValueError as e:
            raise ValueError(f"node {name!r}: {e}") from None
    return assignment


def plan_cost(G, assignment: dict) -> np.ndarray:
    """Total cost vector (time_s, memory_bytes, ...) of one plan of ``G``: node plus edge costs.

    Example:
        >>> import networkx as nx
        >>> G = nx.DiGraph()
        >>> G.add_node("a", cost=np.array([[1.0, 2.0], [2.0, 1.0]]))
        >>> G.add_node("b", cost=np.array([[1.0, 1.0]]))
        >>> G.add_edge("a", "b", cost=np.array([[[0.0, 0.0]], [[0.5, 0.0]]]))
        >>> plan_cost(G, {"a": 1, "b": 0}).tolist()
        [3.5, 2.0]
    """
    total = sum(np.asarray(G.nodes[n]["cost"][c], dtype=float) for n, c in assignment.items())
    for u, v, data in G.edges(data=True):
        total = total + np.asarray(data["cost"][assignment[u], assignment[v]], dtype=float)
    return np.asarray(total)
