"""The plan users would write by hand instead: data parallelism, priced on the planner's cost graph.

Data parallelism splits every operator's batch dimension over every mesh axis and replicates
operators that have no batch dimension (``replicate``). It is one point of the configuration
space, so it is priced by the same tables as the frontier's plans, and written as the same
plan document: benchmarks and tests run it next to the frontier's plans without depending on
whether the frontier happens to list it (it is dominated whenever a model-parallel plan is both
faster and leaner).
"""

from __future__ import annotations

from tensoropt.data_parallel import data_parallel_assignment, data_parallel_index, plan_cost
from tensoropt.plans import Frontier

__all__ = ["data_parallel_assignment", "data_parallel_frontier", "data_parallel_index",
           "data_parallel_plan_json", "plan_cost"]


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
