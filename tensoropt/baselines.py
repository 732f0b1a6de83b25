"""The plan users would write by hand instead: data parallelism, priced on the planner's cost graph.

Data parallelism splits every operator's batch dimension over every mesh axis and replicates
operators that have no batch dimension (``replicate``). It is one point of the configuration
space, so it is priced by the same tables as the frontier's plans, and written as the same
plan document: benchmarks and tests run it next to the frontier's plans without depending on
whether the frontier happens to list it (it is dominated whenever a model-parallel plan is both
faster and leaner).
"""

from __future__ import annotations

import numpy as np

from tensoropt.plans import Frontier


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


def data_parallel_frontier(G, graph, global_batch_size: int, options: tuple[str, ...] = ()) -> Frontier:
    """A one-plan :class:`Frontier` holding the data-parallel plan of ``G``, id ``d<P>-dp`` (with
    ``options``, e.g. ``("zero3",)`` for FSDP's layout: ``d<P>-dp-zero3``).

    Its plan carries the cost model's time and memory, the summary and the per-operator
    breakdown like a frontier plan's, so ``plan_file_text`` turns it into the plan.json
    ``tensoropt run`` reads.

    Example:
        >>> from estimators.profiles import load_cluster
        >>> from tensoropt.config import Job
        >>> from tensoropt.planner import capture_job, job_cost_graph
        >>> job = Job.from_dict({"model": {"name": "mlp"}, "cluster": "cpu-local", "devices": [2],
        ...                      "training": {"global_batch_size": 8}})
        >>> graph = capture_job(job)
        >>> G = job_cost_graph(graph, job, load_cluster("cpu-local"), 2)
        >>> plan = data_parallel_frontier(G, graph, 8).plans[0]
        >>> plan.id, plan.ops["linear"]
        ('d2-dp', 'batch=2')
    """
    from frontier.point import Point
    from tensoropt.planner import frontier_from_points

    assignment = data_parallel_assignment(G, options)
    point = Point(cost=plan_cost(G, assignment), assignment=assignment)
    one = frontier_from_points(G, graph, [point], global_batch_size)
    one.plans[0].id = "-".join((f"d{one.devices}-dp", *options))
    return one


def data_parallel_plan_json(job, devices: int, options: tuple[str, ...] = ()) -> dict:
    """The plan.json document of ``job``'s data-parallel plan on ``devices`` devices; ``options``
    (memory options the job lists, e.g. ``("zero3",)``) on every operator that has them.

    Planned as ``tensoropt plan`` plans (the job resolved, captured on meta, priced on the job's
    cluster), so ``tensoropt run`` and the launcher read it like a selected frontier plan, graph
    fingerprint included.

    Example:
        >>> from tensoropt.config import Job
        >>> job = Job.from_dict({"model": {"name": "mlp"}, "cluster": "cpu-local", "devices": [2],
        ...                      "training": {"global_batch_size": 8}})
        >>> plan = data_parallel_plan_json(job, 2)
        >>> plan["id"], plan["devices"], plan["placements"]["linear"]["output"]
        ('d2-dp', 2, ['S(0)'])
    """
    import json

    from tensoropt.capture.fingerprint import fingerprint
    from tensoropt.planner import build_job_model, capture_job, job_cost_graph, load_job_cluster, resolve_job
    from tensoropt.plans import FrontierFile, plan_file_text

    missing = [o for o in options if o not in job.training.memory_options]
    if missing:
        raise ValueError(f"data-parallel plan with {missing}: add them to training.memory_options "
                         f"(the job lists {list(job.training.memory_options)})")
    cluster = load_job_cluster(job)
    model, spec = build_job_model(job, "meta")
    job = resolve_job(job, spec, cluster)
    graph = capture_job(job, (model, spec))
    G = job_cost_graph(graph, job, cluster, devices)
    one = data_parallel_frontier(G, graph, job.training.global_batch_size, tuple(options))
    doc = FrontierFile(job=job.to_dict(), frontiers=[one], graph=fingerprint(graph, job)).to_json()
    return json.loads(plan_file_text(doc, one.plans[0].id))
