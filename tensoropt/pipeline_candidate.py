"""The pipelined frontier of one (stage count, schedule, micro-batch count), planned as ``tensoropt
plan`` plans it but not merged with other plans: what a benchmark or a test runs to compare one
pipeline's stages with their prediction.

Example:
    >>> from tensoropt.config import Job
    >>> job = Job.from_dict({"model": {"name": "gpt", "kwargs": {"layers": 2, "width": 32, "heads": 2,
    ...     "seq_len": 8, "vocab_size": 64, "tie_weights": False}}, "cluster": "cpu-local",
    ...     "devices": [2], "training": {"global_batch_size": 4}})
    >>> plans = candidate_plans(job, 2, 2, "1F1B", 2)
    >>> plans[0].pipeline["micro_batches"], [s["in_flight"] for s in plans[0].pipeline_detail["stages"]]
    (2, [2, 1])
"""

from __future__ import annotations


def candidate_plans(job, num_devices: int, stages: int, schedule: str, micro_batches: int,
                    data_parallel_stages: bool = False) -> list:
    """Every plan of the exact pipelined frontier of ``stages`` stages, ``schedule`` and
    ``micro_batches`` on ``num_devices`` devices (:class:`tensoropt.plans.Plan`, fastest first, ids
    ``<schedule>-m<m>-<i>``), each stage's memory by part in ``pipeline_detail.stages``.
    ``data_parallel_stages``: every stage takes its data-parallel plan
    (:func:`tensoropt.data_parallel.data_parallel_assignment`) instead of its FT frontier: what the
    runtime runs today on ``devices / p > 1`` devices per stage.

    Raises:
        PipelineError: the request cannot be planned (the field named).
    """
    import frontier as ft
    from estimators.profiles import load_cluster
    from tensoropt.pipeline.schedules import check_pipeline
    from tensoropt.pipeline.search import StageSolver, pipelined_frontier, to_plan
    from tensoropt.pipeline.stages import find_blocks
    from tensoropt.planner import (
        AUTO_BOX_MIN_CANDIDATES,
        AUTO_STEP_EPSILON,
        PIPELINE_STAGE_PLANS,
        capture_job,
        job_cost_graph,
        micro_batch_job,
        thin_to_count,
    )

    batch = job.training.global_batch_size
    check_pipeline(schedule, stages, micro_batches, num_devices, batch)
    job_m = micro_batch_job(job, micro_batches)
    graph = capture_job(job_m)
    G = job_cost_graph(graph, job_m, load_cluster(job.cluster), num_devices // stages)

    def solve(H):
        if data_parallel_stages:
            from types import SimpleNamespace

            from tensoropt.data_parallel import data_parallel_assignment

            return [SimpleNamespace(assignment=data_parallel_assignment(H))]
        points = ft.solve(H, step_epsilon=AUTO_STEP_EPSILON, box_min_candidates=AUTO_BOX_MIN_CANDIDATES)
        return thin_to_count(points, PIPELINE_STAGE_PLANS)[0]

    solver = StageSolver(G, graph, find_blocks(graph), micro_batches, solve)
    found, _ = pipelined_frontier(solver, stages, schedule)
    plans = []
    for i, pp in enumerate(found):
        plan, _ = to_plan(pp, solver, num_devices, batch)
        plan.id = f"{schedule}-m{micro_batches}-{i}"
        plans.append(plan)
    return plans
