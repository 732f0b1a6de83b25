"""Tied parameters priced between their users: one cost-graph edge per (first user, other user).

A parameter read by several operators (GPT-2's and BERT's token embedding, read again by the
output head) is stored once, in the layout of its first user in graph order
(:func:`tensoropt.executor.state.local_state.canonical_layouts`), and redistributed to each other
user's parameter layout where that user reads it (``PlanInterpreter._operand``); DTensor's
redistribution sends the gradient back the other way in backward. The node costs charge the
parameter, its gradient synchronisation and its optimizer state at the first user only
(``shared_params``), so what the tie costs depends on two configurations: a pairwise term, the
table of an extra edge from the first user ``u`` to the other user ``v`` (``u`` precedes ``v``
in graph order, a topological order, so the cost graph stays acyclic):

* forward: the weight from ``u``'s parameter layout to ``v``'s (nothing when they are equal);
* backward: ``v``'s gradient, partial on ``v``'s gradient-sync axes for that parameter, back to
  ``u``'s layout. DTensor reduces a partial gradient there (all-reduce to R, reduce-scatter to a
  shard). When the two layouts are equal nothing is redistributed: ``v``'s partial gradient is
  summed into ``u``'s and reduced once by the synchronisation ``u`` is charged for, so only the
  axes ``v`` syncs and ``u`` does not cost a reduction;
* memory: a redistribution is a new storage in ``v``'s layout; ``v`` keeps it for backward when
  it keeps its weight (:func:`estimators.memory.keeps_param`). In a mixed precision ``v`` already
  charges the compute-dtype copy it keeps, in its own layout.
"""

from __future__ import annotations

import networkx as nx
import numpy as np

from estimators.memory import itemsize, keeps_param, numel
from estimators.op_costs import CostModel, GraphInfo
from estimators.redistribution import local_shape, redistribution_steps, redistribution_time_s


def tied_pairs(g: nx.DiGraph) -> list[tuple[str, str, str]]:
    """``(first user, other user, parameter key)`` of every tied parameter, in graph order.

    The first user is the node whose ``params`` name the key without listing it in
    ``shared_params`` (the capture's convention: the first in graph order, as the executor stores it).

    Example:
        >>> g = nx.DiGraph()
        >>> g.add_node("emb", params={"w": (8, 4)}, shared_params=[])
        >>> g.add_node("head", params={"w": (8, 4)}, shared_params=["w"])
        >>> tied_pairs(g)
        [('emb', 'head', 'w')]
    """
    owner: dict[str, str] = {}
    pairs = []
    for n in g.nodes:  # insertion order: the exported graph's, a topological order
        d = g.nodes[n]
        shared = set(d.get("shared_params") or ())
        for key in d.get("params") or {}:
            if key not in shared:
                owner.setdefault(key, n)
        for key in d.get("params") or {}:
            if key in shared:
                if key not in owner:
                    raise ValueError(f"node {n!r} lists {key!r} in shared_params but no earlier node "
                                     "owns it; capture the graph again (tensoropt.capture)")
                if owner[key] != n:
                    pairs.append((owner[key], n, key))
    return pairs


def _sync(config, key: str) -> frozenset[int]:
    return frozenset(dict(config.grad_sync_axes).get(key, ()))


def _layout(config, key: str, ndim: int) -> tuple:
    return tuple(dict(config.params).get(key, ("R",) * ndim))


def tie_time_s(model: CostModel, shape: tuple, size: int, src: tuple, dst: tuple,
               sync_u: frozenset, sync_v: frozenset, grad: bool) -> tuple[float, float]:
    """(seconds forward + backward, largest buffer bytes) of one tied parameter between two layouts.

    Args:
        model: the cost model (its communication model and the device's redistribution overhead).
        shape, size: the parameter's shape and the item size it is moved in.
        src, dst: the first user's and the other user's parameter layouts.
        sync_u, sync_v: the mesh axes each user synchronises the parameter's gradient over.
        grad: whether the other user sends a gradient back.

    Example:
        >>> from estimators.profiles import load_cluster
        >>> from tensoropt.configspace.configuration import Mesh
        >>> m = CostModel(load_cluster("h100x8"), Mesh((2,), ("gpu",)))
        >>> same = tie_time_s(m, (8, 4), 4, ("R",), ("R",), frozenset({0}), frozenset({0}), True)
        >>> moved = tie_time_s(m, (8, 4), 4, ("S(1)",), ("R",), frozenset(), frozenset({0}), True)
        >>> same[0], moved[0] > 0
        (0.0, True)
    """
    comm, overhead = model.comm, model.cluster.device.redistribute_overhead_s
    moved = src != dst
    t = buf = 0.0
    if moved:
        t += redistribution_time_s(comm, shape, size, src, dst) + overhead
        buf = max([0.0] + [n for _, n, _ in redistribution_steps(shape, size, src, dst, model.mesh.shape)])
    if grad:
        partial = sync_v if moved else sync_v - sync_u
        back = tuple("P" if a in partial else p for a, p in enumerate(dst))
        if back != src:
            t += redistribution_time_s(comm, shape, size, back, src) + overhead
            steps = redistribution_steps(shape, size, back, src, model.mesh.shape)
            buf = max([buf] + [n for _, n, _ in steps])
    return t, buf


def tied_edge_table(model: CostModel, info: GraphInfo, g: nx.DiGraph, u: str, v: str, key: str,
                    confs_u: list, confs_v: list) -> dict[str, np.ndarray]:
    """The tie's ``{"comm_s", "memory_bytes", "buffer_bytes"}`` tables (``C_u x C_v``) for parameter
    ``key`` stored at ``u`` and read again by ``v`` (see the module docstring).

    Example:
        >>> from estimators.profiles import load_cluster
        >>> from tensoropt.configspace.configuration import Configuration, Mesh
        >>> g = nx.DiGraph()
        >>> g.add_node("emb", kind="embedding", params={"w": (8, 4)}, shared_params=[], inputs=[],
        ...            out_dtype="float32")
        >>> g.add_node("head", kind="linear", params={"w": (8, 4)}, shared_params=["w"],
        ...            inputs=[{"source": "x"}], out_dtype="float32")
        >>> rep = Configuration("r", (), (), (("w", ("R",)),), ("R",))
        >>> col = Configuration("out=2", (), (("R",),), (("w", ("S(0)",)),), ("S(1)",))
        >>> info = GraphInfo({"x": True}, {"head": True}, {}, {})
        >>> m = CostModel(load_cluster("h100x8"), Mesh((2,), ("gpu",)))
        >>> t = tied_edge_table(m, info, g, "emb", "head", "w", [rep], [rep, col])
        >>> t["memory_bytes"].tolist()  # the head keeps its half of the weight, a new storage
        [[0.0, 64.0]]
    """
    dv = g.nodes[v]
    shape = tuple(dv["params"][key])
    ndim = len(model.mesh.shape)
    dtype = str(dv.get("out_dtype", "float32"))  # the executor moves the tensor v computes with
    size = itemsize(dtype)
    grad = bool(info.computes_grad.get(v, True))
    need = [info.needs_grad.get(e["source"], False) for e in dv["inputs"]]
    keeps = grad and keeps_param(dv, shape, need) and not model.precision.mixed
    src_keys = [(_layout(c, key, ndim), _sync(c, key)) for c in confs_u]
    dst_keys = [(_layout(c, key, ndim), _sync(c, key)) for c in confs_v]
    memo: dict = {}
    shape_uv = (len(confs_u), len(confs_v))
    comm, memory, buffer = np.zeros(shape_uv), np.zeros(shape_uv), np.zeros(shape_uv)
    for i, (src, sync_u) in enumerate(src_keys):
        for j, (dst, sync_v) in enumerate(dst_keys):
            k = (src, dst, sync_u, sync_v)
            if k not in memo:
                t, buf = tie_time_s(model, shape, size, src, dst, sync_u, sync_v, grad)
                copy = numel(local_shape(shape, dst, model.mesh.shape)) * size if keeps and src != dst else 0
                memo[k] = (t, float(copy), buf)
            comm[i, j], memory[i, j], buffer[i, j] = memo[k]
    return {"comm_s": comm, "memory_bytes": memory, "buffer_bytes": buffer}
