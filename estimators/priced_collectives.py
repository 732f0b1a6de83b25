"""The collectives one plan's price holds, one row each (torch-free): what the cost graph charges.

The cost graph sums each operator's and each edge's time; its collectives are inside those sums
(:mod:`estimators.op_costs`, :mod:`estimators.redistribution`). :func:`priced_collectives` prices a
plan's chosen configurations once more, operator by operator and edge by edge, with a
:class:`RecordingCommModel` that keeps every collective priced (its kind, its ``n`` bytes, whether
priced blocking, :meth:`~estimators.collectives.CommModel.blocking_time_s`, or at its fit, and the
seconds; an all-to-all on a cluster without one as the all-gather it is priced as), so a plan's
priced collectives can be laid beside the ones its replayed program issues
(``benchmarks/collective_match.py``). Each row says where it was priced: ``owner`` (the operator
whose cost or whose incoming edge holds it), ``edge`` (the producer, for an edge) and ``phase``
(``edge``: a redistribution between operators, forward or backward; ``node``: one inside an
operator: a partial sum's reduction, a synchronised batch norm's statistics, a class-split loss's
all-reduces; ``grad``: a gradient's share of the bucketed all-reduce; ``tied``: a tied weight's copy).

Example:
    >>> rows = [{"kind": "all_gather", "bytes": 4096.0, "blocking": True},
    ...         {"kind": "all_reduce", "bytes": 64.0, "blocking": False}]
    >>> blocking_count(rows)
    1
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import networkx as nx

from estimators import op_costs
from estimators.collectives import CommModel
from estimators.configuration import Configuration, Mesh
from estimators.memory import SavingRules
from estimators.profiles import Cluster, load_cluster
from estimators.tied import tied_edge_table, tied_pairs


class _NoMemo(dict):
    """A memo that is never hit: every collective is priced (and recorded) each time it is met, an
    operand read twice (q, k and v of one split) twice, as the edge's price sums it."""

    def __contains__(self, key) -> bool:
        return False


class RecordingCommModel(CommModel):
    """A :class:`CommModel` that appends each collective it prices to :attr:`rows` and memoises none.

    Example:
        >>> cm = RecordingCommModel(load_cluster("cpu-local"), Mesh((2,), ("gpu",)))
        >>> t = cm.blocking_time_s("all_reduce", 4096, (0,))
        >>> [(r["kind"], r["bytes"], r["blocking"]) for r in cm.rows]
        [('all_reduce', 4096, True)]
    """

    def __init__(self, cluster: Cluster, mesh: Mesh):
        super().__init__(cluster, mesh)
        self.memo = _NoMemo()
        self.rows: list[dict] = []
        self.tags: dict = {}
        """Fields added to each row recorded now (:meth:`tagged`)."""
        self._blocking = False

    @contextlib.contextmanager
    def tagged(self, **tags) -> Iterator[None]:
        """Record the collectives priced inside the block with ``tags`` added."""
        outer = self.tags
        self.tags = {**outer, **tags}
        try:
            yield
        finally:
            self.tags = outer

    def time_s(self, collective: str, nbytes: float, axes) -> float:
        t = super().time_s(collective, nbytes, axes)
        if t > 0 and not self._blocking:
            self.rows.append({"kind": collective, "bytes": nbytes, "blocking": False, "priced_s": t,
                              **self.tags})
        return t

    def blocking_time_s(self, collective: str, nbytes: float, axes) -> float:
        self._blocking = True
        try:
            t = super().blocking_time_s(collective, nbytes, axes)
        finally:
            self._blocking = False
        if t > 0:
            kind, n = collective, nbytes
            if kind == "all_to_all" and not self.cluster.has_all_to_all:  # priced as gloo runs it
                kind, n = "all_gather", nbytes * math.prod(self.group(axes))
            self.rows.append({"kind": kind, "bytes": n, "blocking": True, "priced_s": t, **self.tags})
        return t


def priced_collectives(g: nx.DiGraph, cluster, mesh: Mesh, assignment: dict[str, Configuration],
                       optimizer: str = "adamw", batch_norm_stats: str = "synchronized",
                       rules: SavingRules | None = None, precision: str = "fp32") -> list[dict]:
    """Every collective the cost graph prices for the plan ``assignment`` (node -> its configuration),
    in the graph's topological order: ``kind``, ``bytes`` (the estimator's ``n``), ``blocking``,
    ``priced_s``, ``owner``, ``edge`` (the producer, or None) and ``phase`` (see the module docstring).
    Priced as :func:`tensoropt.cost_graph.cost_graph` prices them (the same :class:`CostModel` fields;
    no memory options). ``g``: the OpGraph's networkx graph; ``cluster``: a name, path or Cluster.

    Example:
        >>> from estimators.configuration import Configuration
        >>> g = nx.DiGraph()
        >>> g.add_node("x", op="input", kind="input", inputs=[], params={}, out_shape=(8, 4),
        ...            out_dtype="float32")
        >>> g.add_node("l", op="aten.linear.default", kind="linear", flops=256, out_shape=(8, 4),
        ...            out_dtype="float32", params={"w": (4, 4)},
        ...            inputs=[{"source": "x", "shape": (8, 4), "dtype": "float32"}])
        >>> g.add_edge("x", "l")
        >>> mesh = Mesh((2,), ("gpu",))
        >>> x = Configuration("batch=2", (("batch", (0,)),), (), (), ("S(0)",))
        >>> rep = Configuration("replicate", (), (("R",),), (("w", ("R",)),), ("R",))
        >>> rows = priced_collectives(g, "cpu-local", mesh, {"x": x, "l": rep})
        >>> [(r["kind"], r["bytes"], r["blocking"], r["owner"], r["edge"], r["phase"]) for r in rows]
        [('all_gather', 128, True, 'l', 'x', 'edge')]
    """
    cl = cluster if isinstance(cluster, Cluster) else load_cluster(cluster)
    rules = rules or SavingRules(cl.device.kind)
    model = op_costs.CostModel(cl, mesh, optimizer, rules=rules, precision=precision,
                               batch_norm_stats=batch_norm_stats)
    comm = model.comm = RecordingCommModel(cl, mesh)
    model.operand_cache = _NoMemo()
    info = op_costs.GraphInfo.of(g, rules)
    for v in nx.topological_sort(g):
        with comm.tagged(owner=v, edge=None, phase="node"):
            op_costs.node_cost(model, info, v, g.nodes[v], assignment[v])
        for u in g.predecessors(v):
            with comm.tagged(owner=v, edge=u, phase="edge"):
                op_costs.edge_cost_table(model, info, g, u, v, [assignment[u]], [assignment[v]])
    for u, v, key in tied_pairs(g):
        with comm.tagged(owner=v, edge=u, phase="tied"):
            tied_edge_table(model, info, g, u, v, key, [assignment[u]], [assignment[v]])
    for row in comm.rows:
        if row["phase"] == "node" and not row["blocking"] and row["kind"] == "all_reduce":
            row["phase"] = "grad"  # a gradient's share of the bucketed all-reduce (its fit, not blocking)
    return comm.rows


def blocking_count(rows: list[dict]) -> int:
    """How many of ``rows`` (:func:`priced_collectives`) are priced as blocking (each with a sync point).

    Example:
        >>> blocking_count([{"blocking": True}, {"blocking": True}, {"blocking": False}])
        2
    """
    return sum(1 for r in rows if r["blocking"])
