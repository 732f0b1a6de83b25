"""The one-call planning API: a job in, the frontier file out.

For the common case :func:`plan_job` does everything; the steps are public for finer control::

    model, spec = build_job_model(job, device="meta")       # the zoo preset or the user factory
    graph = capture_job(job)                                 # OpGraph (captured on meta: no memory)
    cluster = load_job_cluster(job)
    frontier = plan_devices(graph, job, cluster, 8)          # cost graph -> FT solve -> plans

Example:
    >>> from tensoropt.config import Job
    >>> job = Job(model={"name": "mlp", "kwargs": {"in_features": 32, "hidden": [64],
    ...           "num_classes": 8}}, cluster="cpu-local", devices=[1, 2],
    ...           training={"global_batch_size": 8})
    >>> ff = plan_job(job)
    >>> [f.devices for f in ff.frontiers]
    [1, 2]
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from tensoropt.config import Job

# re-exported: the planner's public steps (one resolution for plan, run and elastic selection)
from tensoropt.job_model import (  # noqa: F401
    PlanningError,
    build_job_model,
    job_model_kwargs,
    load_job_cluster,
    resolve_job,
)
from tensoropt.plans import Frontier, FrontierFile, Plan, plan_id
from tensoropt.summary import plan_layers, plan_summary

Progress = Callable[[str, float], None]
"""A progress callback: ``progress(message, fraction_done)`` with fraction in [0, 1]."""

#: With ``planner.epsilon: auto``, the factor of each large elimination's cover (docs/algorithm.md 6):
#: the tables of a real model's 32 layers keep a least (1 + 0.05 %)-cover per configuration instead
#: of thousands of points; the bound is tracked on the derivation paths taken (0.3-0.6 % for
#: Llama-3-8B's shape, layers composed by doubling) and printed together with the final cover's.
AUTO_STEP_EPSILON = 0.0005
#: With ``planner.epsilon: auto``, only eliminations generating more candidate points than this
#: are covered; a solve with none that large is exact before the final cover (Llama-3-8B's shape on
#: 8 GPUs: 8.7 s of CPU against 15.9 s with 1e7, and a smaller bound).
AUTO_BOX_MIN_CANDIDATES = 1e6


def capture_job(job: Job, spec_and_model=None):
    """Capture the job's training step (forward + loss) on the meta device.

    Example:
        >>> from tensoropt.config import Job
        >>> job = Job(model={"name": "mlp"}, cluster="cpu-local", devices=[1],
        ...           training={"global_batch_size": 4})
        >>> capture_job(job).nx.nodes["linear"]["out_shape"]
        (4, 4096)
    """
    from tensoropt.capture import capture
    from tensoropt.models import example_inputs
    from tensoropt.precision import get_precision

    model, spec = spec_and_model if spec_and_model is not None else build_job_model(job, "meta")
    batch = job.training.global_batch_size or spec.default_batch_size
    inputs = example_inputs(spec, batch, device="meta", model=model)
    compute_dtype = get_precision(job.training.precision).compute_dtype  # mixed: the graph computes in it
    if compute_dtype != "float32":
        import torch

        dtype = getattr(torch, compute_dtype)
        model = model.to(dtype)
        inputs = tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)
    return capture(model, inputs)


def input_shapes_line(job: Job) -> str:
    """The job's per-sample input shapes as key paths, and the batch: what a shape error is about.

    Example:
        >>> from tensoropt.config import Job
        >>> input_shapes_line(Job(model={"name": "mlp"}, cluster="cpu-local", devices=[1],
        ...                       training={"global_batch_size": 4}))
        'model.input_shape (default), training.global_batch_size 4'
    """
    m = job.model
    parts = [f"model.inputs.{name}.shape {list(spec.get('shape', []))}"
             for name, spec in (m.inputs or {}).items()]
    if m.targets:
        parts.append(f"model.targets.shape {list(m.targets.get('shape', []))}")
    if not parts:
        parts.append(f"model.input_shape {list(m.input_shape)}" if m.input_shape
                     else "model.input_shape (default)")
    return ", ".join(parts) + f", training.global_batch_size {job.training.global_batch_size}"


def plan_devices(graph, job: Job, cluster, num_devices: int, progress: Progress | None = None,
                 micro_graph: Callable[[int], object] | None = None,
                 pipeline_graphs: dict | None = None) -> Frontier:
    """Cost graph, exact frontier and per-plan breakdown for one device count.

    With ``training.micro_batches`` other than 1, each micro-batch count ``m`` is planned on the
    graph captured at the micro-batch's shapes (:mod:`tensoropt.accumulation` prices its step) and
    the frontier is the Pareto set over counts and splits together; ``auto`` stops doubling ``m``
    once a count adds no plan to that set.

    Args:
        graph: the captured OpGraph (the global batch's).
        job: the (resolved) job.
        cluster: the loaded cluster profile.
        num_devices: device count.
        progress: called with the solver's progress (fraction of this device count).
        micro_graph: ``m -> OpGraph`` captured at global batch ``B / m`` (default: captured here).
        pipeline_graphs: captures at each micro-batch size, shared across device counts
            (:func:`plan_pipelines`).

    Returns:
        The :class:`Frontier`, plans sorted by time with ids ``d<P>-p<i>``.
    """
    from tensoropt.accumulation import micro_batch_counts, pareto_over_counts

    cpu_start, wall_start = time.process_time(), time.perf_counter()
    batch = job.training.global_batch_size
    setting = job.training.micro_batches
    try:
        counts = micro_batch_counts(batch, setting) if batch else [1]
    except ValueError as e:
        raise PlanningError(str(e)) from None
    graph_for = micro_graph or (lambda m: graph if m == 1 else capture_job(micro_batch_job(job, m)))
    timing = {"cost_graph": 0.0, "solve": 0.0}
    solved: dict[int, tuple] = {}  # m -> (cost graph, OpGraph)
    merged: list[tuple[int, object]] = []
    bound = 0.0
    for k, m in enumerate(counts):
        share = (k / len(counts), 1 / len(counts))

        def sub(message, fraction, share=share):
            if progress is not None:
                progress(message, share[0] + share[1] * fraction)

        g_m = graph if m == 1 else graph_for(m)
        G, points, count_bound = _solve_count(g_m, job, cluster, num_devices, m, sub, timing)
        candidate = pareto_over_counts(merged + [(m, p) for p in points])
        if setting == "auto" and m > 1 and not any(c == m for c, _ in candidate):
            break  # this count adds no plan; more micro-batches only slow the step further
        merged, solved[m], bound = candidate, (G, g_m), max(bound, count_bound)
    t0 = time.perf_counter()
    epsilon = job.planner.epsilon
    if epsilon == "auto":  # a (1+b)-cover of a (1+c)-cover: within (1+b)(1+c) of every exact plan
        kept, thin_bound = thin_to_count([p for _, p in merged], job.planner.max_plans)
        bound = (1.0 + thin_bound) * (1.0 + bound) - 1.0
    else:
        kept, bound = thin_frontier([p for _, p in merged], split_epsilon(epsilon)), epsilon
    ids = {id(p) for p in kept}
    merged = [(m, p) for m, p in merged if id(p) in ids]
    timing["solve"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    units = PlanUnits.of(job, graph, cluster)
    frontier = frontier_over_counts(solved, merged, batch, num_devices, units)
    frontier.epsilon_bound = float(bound)
    timing["breakdown"] = time.perf_counter() - t0
    frontier.timing_s = timing
    pipeline_start = time.perf_counter()
    frontier = plan_pipelines(graph, job, cluster, num_devices, frontier,
                              {} if pipeline_graphs is None else pipeline_graphs, progress, micro_graph)
    if frontier.pipeline_search is not None:
        timing["pipeline"] = time.perf_counter() - pipeline_start
    attach_data_parallel(frontier, solved, batch, units)
    timing["cpu"] = time.process_time() - cpu_start  # this process's CPU (the machine may be shared)
    timing["wall"] = time.perf_counter() - wall_start
    return frontier


def attach_data_parallel(frontier: Frontier, solved: dict, global_batch_size: int,
                         units: PlanUnits | None = None) -> None:
    """Record the data-parallel plan (id ``d<P>-dp``) on ``frontier``, priced on the cost graph of the
    fewest micro-batches solved, with its configurations (:attr:`Frontier.data_parallel`): the plan
    selection prefers within the estimator's measured error. Nothing when a node has neither a batch
    split nor ``replicate`` (a hand-made configuration list).

    Example:
        >>> # see tests/planner/test_selection_margin.py (a planned job carries ``d2-dp``)
        >>> True
        True
    """
    from frontier.point import Point
    from tensoropt.data_parallel import data_parallel_assignment, plan_cost

    m = min(solved)
    G, _ = solved[m]
    try:
        assignment = data_parallel_assignment(G)
    except ValueError:
        return
    point = Point(cost=plan_cost(G, assignment), assignment=assignment)
    one = frontier_over_counts({m: solved[m]}, [(m, point)], global_batch_size, frontier.devices, units)
    plan = one.plans[0]
    plan.id = f"d{frontier.devices}-dp"
    for node, labels in one.configurations.items():
        frontier.configurations.setdefault(node, {}).update(
            {k: v for k, v in labels.items() if k not in frontier.configurations.get(node, {})})
    frontier.data_parallel = plan


def micro_batch_job(job: Job, micro_batches: int) -> Job:
    """``job`` with the global batch of one micro-batch (``B / m``): what its micro-batch graph is
    captured and priced with.

    Example:
        >>> job = Job(model={"name": "mlp"}, cluster="cpu-local", devices=[1],
        ...           training={"global_batch_size": 8, "micro_batches": "auto"})
        >>> micro_batch_job(job, 4).training.global_batch_size
        2
    """
    import dataclasses

    batch = job.training.global_batch_size // micro_batches
    training = dataclasses.replace(job.training, global_batch_size=batch, micro_batches=1)
    return dataclasses.replace(job, training=training)


def _solve_count(graph, job: Job, cluster, num_devices: int, micro_batches: int, progress: Progress,
                 timing: dict[str, float]) -> tuple:
    """(cost graph, frontier points, proven bound) of one micro-batch count."""
    import frontier as ft
    from tensoropt.accumulation import price_micro_batches

    start = time.perf_counter()
    label = _devices(num_devices) + (f", {micro_batches} micro-batches" if micro_batches > 1 else "")

    def graph_progress(done, total):
        progress(f"cost graph for {label}", 0.3 * done / max(1, total))

    sub_job = job if micro_batches == 1 else micro_batch_job(job, micro_batches)
    G = job_cost_graph(graph, sub_job, cluster, num_devices, graph_progress)
    G = price_micro_batches(G, micro_batches)
    timing["cost_graph"] += time.perf_counter() - start
    start = time.perf_counter()

    def solver_progress(*args):
        progress(f"solving {label}", 0.3 + 0.7 * _fraction(args))

    epsilon = job.planner.epsilon
    if epsilon == "auto":  # exact on small problems; large eliminations boxed, bound tracked
        solve_args = dict(step_epsilon=AUTO_STEP_EPSILON, box_min_candidates=AUTO_BOX_MIN_CANDIDATES)
    else:
        solve_args = dict(epsilon=split_epsilon(epsilon))
    report = ft.SolveReport()
    try:
        points = ft.solve(G, progress=solver_progress, report=report, **solve_args)
    except ValueError as e:
        raise PlanningError(f"solving the frontier for {num_devices} devices: {e}") from None
    except ft.SolverMemoryError as e:
        hint = "" if job.planner.hierarchical_for(num_devices) else " (or planner.space: hierarchical)"
        raise PlanningError(f"solving the frontier for {num_devices} devices: {e}{hint}") from None
    timing["solve"] += time.perf_counter() - start
    return G, points, (report.bound if epsilon == "auto" else 0.0)


#: Plans kept per stage frontier (a proven cover, :func:`thin_to_count`) before the DP across stages.
PIPELINE_STAGE_PLANS = 12


#: Models of more blocks than this build stage frontiers by the transfer-table sweep
#: (:func:`pipeline_chain_settings`); fewer solve each stage graph with a shared memo.
CHAIN_MIN_BLOCKS = 16


#: One set of three-objective stage tables for every in-flight count (exact, ``ChainSettings.in_flight``)
#: instead of two-objective tables per count. Off: even on the compiled three-objective kernel
#: (:mod:`frontier.staircase3`) an 8B block's transfer table for the counts 1..8 has 26 x the rows of
#: one count's (1.1 M against 42-62 k) and costs 2.6 x the CPU of all 8 two-objective ones
#: (docs/results.md, 2026-11-28 pp3obj; it was over 100 x one count's on the numpy kernel, pp70b).
PIPELINE_SHARED_IN_FLIGHT = False


def pipeline_chain_settings(in_flight: tuple[int, int] | None = None):
    """How the pipeline search builds stage frontiers of identical blocks
    (:class:`tensoropt.pipeline.chain_stages.StageChain`): the planner's ``epsilon: auto`` grid for
    the sweep steps and large eliminations, each stage frontier thinned to ``PIPELINE_STAGE_PLANS``;
    ``in_flight = (k1, k2)``: one set of three-objective tables for every in-flight count between.

    Example:
        >>> pipeline_chain_settings().max_plans == PIPELINE_STAGE_PLANS
        True
    """
    from tensoropt.pipeline.chain_stages import ChainSettings

    return ChainSettings(step_epsilon=AUTO_STEP_EPSILON, box_min_candidates=AUTO_BOX_MIN_CANDIDATES,
                         max_plans=PIPELINE_STAGE_PLANS, in_flight=in_flight)


def in_flight_range(candidates: list[tuple[int, str, int]], micro_batches: int) -> tuple[int, int]:
    """The least and most in-flight count of any stage of the candidates with ``micro_batches``
    (torch's schedule order, :func:`tensoropt.pipeline.schedules.in_flight_micro_batches`).

    Example:
        >>> in_flight_range([(2, "1F1B", 16), (8, "1F1B", 16)], 16)
        (1, 8)
    """
    from tensoropt.pipeline.schedules import in_flight_micro_batches

    counts = [k for p, schedule, m in candidates if m == micro_batches
              for k in in_flight_micro_batches(schedule, p, m)]
    return min(counts), max(counts)


def auto_micro_batches(num_stages: int, batch_size: int) -> int | None:
    """``planner.pipeline: auto``'s micro-batch count: the least divisor of the batch >= ``2 p`` (a
    bubble of at most (p - 1) / 2p), else the largest one >= ``p`` (1F1B's minimum), else None.

    Example:
        >>> auto_micro_batches(4, 64), auto_micro_batches(4, 4), auto_micro_batches(8, 4)
        (8, 4, None)
    """
    divisors = [m for m in range(1, batch_size + 1) if batch_size % m == 0]
    wide = [m for m in divisors if m >= 2 * num_stages]
    if wide:
        return wide[0]
    enough = [m for m in divisors if m >= num_stages]
    return enough[-1] if enough else None


#: The stage counts ``planner.pipeline: auto`` considers (each dividing the device count).
AUTO_STAGES = (2, 4, 8)


def auto_stage_counts(num_devices: int, devices_per_node: int, batch_size: int,
                      whole_nodes: bool = True) -> list[int]:
    """The stage counts ``planner.pipeline: auto`` proposes on ``num_devices``: those of
    ``AUTO_STAGES`` dividing it (with a micro-batch count, :func:`auto_micro_batches`) and, beyond
    one node with ``whole_nodes``, leaving every stage a whole number of nodes (a stage mesh a
    multiple of ``devices_per_node``: the pipeline crosses nodes, tensor and data parallelism stay
    inside, as Megatron and torchtitan cut), so that each stage mesh serves several device counts.

    Example:
        >>> [auto_stage_counts(d, 8, 64) for d in (8, 16, 32, 64)]
        [[2, 4, 8], [2], [2, 4], [2, 4, 8]]
        >>> auto_stage_counts(16, 8, 64, whole_nodes=False)
        [2, 4, 8]
    """
    stages = [p for p in AUTO_STAGES if num_devices % p == 0 and auto_micro_batches(p, batch_size)]
    if whole_nodes and num_devices > devices_per_node:
        stages = [p for p in stages if (num_devices // p) % devices_per_node == 0]
    return stages


def pipeline_candidates(job: Job, num_devices: int, cluster, fits_budget: bool) -> list[tuple[int, str, int]]:
    """The (stages, schedule, micro-batches) ``planner.pipeline`` asks for on ``num_devices``.

    ``off`` (the default): none. ``auto``: only beyond one node or when no plan without a pipeline
    fits the budget; then 2, 4 and 8 stages under 1F1B (:func:`auto_stage_counts`): beyond one node
    only those leaving every stage whole nodes (while a plan fits the budget; when none does, every
    count dividing the devices), all with one micro-batch count for every device count of the job
    (:func:`auto_micro_batches` of the most stages ``AUTO_STAGES`` allows: one capture, stage tables
    shared across device counts). A mapping: every combination, each checked
    (:func:`tensoropt.pipeline.schedules.check_pipeline`).

    Raises:
        PlanningError: an explicit request that cannot run (stage count, micro-batches).

    Example:
        >>> job = Job.from_dict({"model": {"name": "mlp"}, "cluster": "h100-4x8-ib", "devices": [16],
        ...                      "training": {"global_batch_size": 64},
        ...                      "planner": {"pipeline": "auto"}})
        >>> from estimators.profiles import load_cluster
        >>> pipeline_candidates(job, 16, load_cluster("h100-4x8-ib"), True)
        [(2, '1F1B', 16)]
        >>> pipeline_candidates(job, 16, load_cluster("h100-4x8-ib"), False)  # nothing fits: all counts
        [(2, '1F1B', 16), (4, '1F1B', 16), (8, '1F1B', 16)]
    """
    from tensoropt.pipeline.schedules import PipelineError, check_pipeline

    setting, batch = job.planner.pipeline, job.training.global_batch_size
    if setting == "off" or batch is None:
        return []
    if setting == "auto":
        if num_devices <= cluster.devices_per_node and fits_budget:
            return []
        possible = [p for p in AUTO_STAGES if auto_micro_batches(p, batch)]
        stages = auto_stage_counts(num_devices, cluster.devices_per_node, batch, whole_nodes=fits_budget)
        if not stages:
            return []
        m = auto_micro_batches(max(possible), batch)  # one micro-batch size: one capture for all counts
        return [(p, "1F1B", m) for p in stages]
    out = []
    for p in setting["stages"]:
        for schedule in setting["schedules"]:
            for m in setting["micro_batches"] or [auto_micro_batches(p, batch) or p]:
                try:
                    check_pipeline(schedule, p, m, num_devices, batch)
                except PipelineError as e:
                    raise PlanningError(f"{_devices(num_devices)}: {e}") from None
                out.append((p, schedule, m))
    return out


def plan_pipelines(graph, job: Job, cluster, num_devices: int, frontier: Frontier, graphs: dict,
                   progress: Progress | None = None,
                   micro_graph: Callable[[int], object] | None = None) -> Frontier:
    """Add the pipelined plans ``planner.pipeline`` asks for to ``frontier`` (issue 27).

    For each candidate (:func:`pipeline_candidates`) the model is captured at the micro-batch size
    (once per size, kept in ``graphs``; by ``micro_graph(m)`` where given, :func:`plan_job`'s, which
    reuses the model already built), priced on ``num_devices / p`` devices, each stage's
    frontier solved (:class:`tensoropt.pipeline.search.StageSolver`) and the stages combined by the
    exact DP (:func:`tensoropt.pipeline.search.pipelined_frontier`). The result is the Pareto set
    of the plans without a pipeline and the pipelined ones, by time, renumbered; under ``epsilon:
    auto`` thinned to ``planner.max_plans`` by the least cover, its factor folded into the bound
    (only the pipelined points kept are broken down into plans).

    Raises:
        PlanningError: an explicit request that cannot be planned (the field and the fix named).

    Example:
        >>> job = Job.from_dict({"model": {"name": "gpt", "kwargs": {"layers": 2, "width": 32, "heads": 2,
        ...     "seq_len": 8, "vocab_size": 64}}, "cluster": "cpu-local", "devices": [2],
        ...     "training": {"global_batch_size": 4}, "planner": {"pipeline": {"stages": [2]}}})
        >>> ff = plan_job(job)
        >>> any(p.pipeline for p in ff.frontiers[0].plans), ff.frontiers[0].pipeline_search["candidates"]
        (True, [[2, '1F1B', 4]])
    """

    import numpy as np

    import frontier as ft
    from frontier.cover import cover_to_count
    from frontier.pareto import pareto_select
    from tensoropt.pipeline.schedules import PipelineError, stages_per_rank
    from tensoropt.pipeline.search import StageSolver, pipelined_frontier, to_plan
    from tensoropt.pipeline.stages import find_blocks

    budget = job.memory_budget
    fits = budget is None or any(p.peak_memory_bytes <= budget for p in frontier.plans)
    candidates = pipeline_candidates(job, num_devices, cluster, fits)
    if not candidates:
        return frontier
    explicit = isinstance(job.planner.pipeline, dict)
    batch = job.training.global_batch_size
    stage_bound = 0.0
    memo: dict = {}  # combines shared by every stage solve of this device count (identical blocks)

    def solve(H):
        nonlocal stage_bound
        report = ft.SolveReport()
        points = ft.solve(H, report=report, step_epsilon=AUTO_STEP_EPSILON,
                          box_min_candidates=AUTO_BOX_MIN_CANDIDATES, memo=memo)
        points, bound = thin_to_count(points, PIPELINE_STAGE_PLANS)
        stage_bound = max(stage_bound, (1.0 + bound) * (1.0 + report.bound) - 1.0)
        return points

    plans, configurations, tried, solves, used = [], {}, [], 0, {}
    cpu = {"captures": 0.0, "cost_graphs": 0.0, "stages_and_dp": 0.0, "plans": 0.0}
    """This process's CPU seconds per part of the search (a shared machine: wall time is not the work)."""
    for p, schedule, m in candidates:
        if progress is not None:
            progress(f"{_devices(num_devices)}: pipeline of {p} stages, {m} micro-batches ({schedule})", 1.0)
        if m not in graphs:
            start = time.process_time()
            job_m = micro_batch_job(job, m)
            graph_m = graph if m == 1 else (micro_graph(m) if micro_graph is not None else capture_job(job_m))
            cpu["captures"] += time.process_time() - start
            try:
                blocks = find_blocks(graph_m)
            except PipelineError as e:
                if explicit:
                    raise PlanningError(str(e)) from None
                return frontier
            graphs[m] = (job_m, graph_m, blocks, {})
        job_m, graph_m, blocks, solvers = graphs[m]
        virtual = p * stages_per_rank(schedule)  # Interleaved1F1B: 2 virtual stages per rank
        if blocks.count < virtual:
            if explicit:
                raise PlanningError(f"planner.pipeline.stages: {p} stages ({virtual} virtual stages under "
                                    f"{schedule}) but the model has {blocks.count} blocks "
                                    f"(embedding, {blocks.container}.*, head)")
            continue
        key = (num_devices // p, m)
        if key not in solvers:
            start = time.process_time()
            G = job_cost_graph(graph_m, job_m, cluster, num_devices // p)
            cpu["cost_graphs"] += time.process_time() - start
            # the sweep pays on deep models (70B: 3 x the shared memo), not on a few blocks (8B with 4
            # layers: 1.3 x slower; docs/results.md, benchmarks/pipeline_stages.py)
            shared = in_flight_range(candidates, m) if PIPELINE_SHARED_IN_FLIGHT else None
            chain = pipeline_chain_settings(shared) if blocks.count > CHAIN_MIN_BLOCKS else None
            solvers[key] = StageSolver(G, graph_m, blocks, m, solve, chain=chain)
        solver = solvers[key]
        solver.solve = solve  # this device count's (its bound and memo)
        before = solver.solves
        base = ((solver.chain.eliminations, solver.chain.steps, dict(solver.chain.cpu_s))
                if solver.chain is not None else None)
        start = time.process_time()
        found, _ = pipelined_frontier(solver, p, schedule)
        cpu["stages_and_dp"] += time.process_time() - start
        solves += solver.solves - before
        if solver.chain is not None:
            stage_bound = max(stage_bound, solver.chain.bound)
            # the chain was perhaps used by an earlier device count (same stage mesh): count this one's
            used.setdefault(id(solver), (solver.chain, base))
        tried.append([p, schedule, m])
        plans += [(pp, solver) for pp in found]
    # the merged frontier, thinned as the one without pipelines (epsilon: auto, max_plans) before
    # the kept pipelined points become plans (their breakdowns are the costly part)
    unpiped = frontier.plans
    costs = np.array([[q.time_s, q.memory_bytes] for q in unpiped]
                     + [[pp.point.time_s, pp.point.memory_bytes] for pp, _ in plans]).reshape(-1, 2)
    keep = np.asarray(pareto_select(costs) if len(costs) else [], dtype=np.int64)
    thin = 0.0
    if job.planner.epsilon == "auto" and len(keep) > job.planner.max_plans:
        kept, thin = cover_to_count(costs[keep], job.planner.max_plans)
        keep = keep[kept]
    start = time.process_time()
    merged = []
    for i in keep:
        if i < len(unpiped):
            merged.append(unpiped[i])
            continue
        pp, solver = plans[i - len(unpiped)]
        plan, configs = to_plan(pp, solver, num_devices, batch)
        merged.append(plan)
        for n, c in configs.items():
            configurations.setdefault(n, {}).update(c)
    cpu["plans"] += time.process_time() - start
    merged = sorted(merged, key=lambda q: (q.time_s, q.memory_bytes))
    for i, q in enumerate(merged):
        q.id = plan_id(num_devices, i)
    for n, c in configurations.items():
        frontier.configurations.setdefault(n, {}).update(c)
    frontier.plans = merged
    # the DP across stages is exact: a stage option within 1 + b in t, d and w keeps T and M within it;
    # the merged set covers both frontiers within the larger bound, its thinning within 1 + thin of it
    frontier.epsilon_bound = (1.0 + thin) * (1.0 + max(frontier.epsilon_bound or 0.0, stage_bound)) - 1.0
    sweeps = ({"eliminations": sum(c.eliminations - b[0] for c, b in used.values()),
               "sweep_steps": sum(c.steps - b[1] for c, b in used.values()),
               "cpu_s": {part: sum(c.cpu_s[part] - b[2][part] for c, b in used.values())
                         for part in ("eliminations", "sweeps", "finish")}} if used else None)
    frontier.pipeline_search = {
        "candidates": tried, "stage_solves": solves, "stage_bound": stage_bound, "stage_chain": sweeps,
        "cpu_s": cpu,
        "unpipelined_fastest_s": min((q.time_s for q in unpiped), default=None),
        "unpipelined_leanest_bytes": min((q.memory_bytes for q in unpiped), default=None),
        "unpipelined_points": [[q.time_s, q.memory_bytes] for q in unpiped],
        "pipelined_plans": sum(1 for q in merged if q.pipeline),
    }
    return frontier


def job_cost_graph(graph, job: Job, cluster, num_devices: int,
                   progress: Callable[[int, int], None] | None = None):
    """The cost graph ``tensoropt plan`` solves for one device count of ``job``.

    Args:
        graph: the captured OpGraph (:func:`capture_job`).
        job: the (resolved) job: optimizer, precision, memory options, batch norm, compute mode.
        cluster: the loaded cluster profile.
        num_devices: device count.
        progress: called with (nodes priced, nodes in all).

    Returns:
        The networkx cost graph (``mesh``, per node ``configs``/``configurations``/``cost``).

    Raises:
        PlanningError: the tables alone outgrow the solver's memory, or pricing refused a node.

    Example:
        >>> job = Job.from_dict({"model": {"name": "mlp"}, "cluster": "cpu-local", "devices": [2],
        ...                      "training": {"global_batch_size": 8}})
        >>> from estimators.profiles import load_cluster
        >>> G = job_cost_graph(capture_job(job), job, load_cluster("cpu-local"), 2)
        >>> G.graph["mesh"].num_devices, "batch=2" in G.nodes["linear"]["configs"]
        (2, True)
    """
    from frontier.memory_limit import default_limit_bytes
    from tensoropt.configspace import configurations
    from tensoropt.configspace.configuration import Mesh
    from tensoropt.cost_graph import cost_graph
    from tensoropt.solver_size import check_table_size, table_size

    hierarchical = job.planner.hierarchical_for(num_devices)
    configs = configurations(graph, Mesh.for_cluster(num_devices, cluster.devices_per_node),
                             whole_levels=hierarchical)
    try:  # refused in seconds when the tables alone outgrow the solver's memory
        size = table_size(graph, configs, job.training.memory_options)
        check_table_size(size, num_devices, default_limit_bytes(), hierarchical)
    except MemoryError as e:
        raise PlanningError(f"cost graph for {_devices(num_devices)}: {e}") from None
    try:
        return cost_graph(graph, cluster, num_devices, batch_size=job.training.global_batch_size,
                          optimizer=job.training.optimizer, compute_mode=job.planner.compute,
                          progress=progress, memory_options=job.training.memory_options,
                          configurations=configs, precision=job.training.precision,
                          batch_norm_stats=job.training.batch_norm,
                          checkpoint_modules=job.training.checkpoint_modules,
                          loss_chunk_tokens=job.training.loss_chunk_tokens)
    except ValueError as e:
        raise PlanningError(f"cost graph for {num_devices} devices: {e}") from None


def split_epsilon(epsilon: float) -> float:
    """The epsilon for the solver and for :func:`thin_frontier`, so that together they meet ``epsilon``.

    The solver returns a (1+e)-cover of the true frontier and thinning keeps a (1+e)-cover of
    that, so every true Pareto point is within ``(1+e)^2 = 1 + epsilon`` of a returned plan.

    Example:
        >>> round(split_epsilon(0.0201), 6), split_epsilon(0.0)
        (0.01, 0.0)
    """
    return (1.0 + epsilon) ** 0.5 - 1.0 if epsilon > 0 else 0.0


def thin_frontier(points: list, epsilon: float) -> list:
    """The fewest points such that each dropped one is (1+epsilon)-covered by a kept one.

    ``points`` are sorted by time (objective 0) and mutually non-dominated, so memory falls along
    them; a kept point ``q`` covers ``p`` when ``q`` is within a factor ``1 + epsilon`` of ``p`` in
    time and in memory (:func:`frontier.cover.epsilon_cover`, a smallest such subset).
    ``epsilon == 0`` keeps everything.

    Example:
        >>> from types import SimpleNamespace as P
        >>> pts = [P(cost=(1.0, 100.0)), P(cost=(1.1, 99.5)), P(cost=(1.2, 90.0)), P(cost=(2.0, 89.9))]
        >>> [p.cost for p in thin_frontier(pts, 0.01)]
        [(1.0, 100.0), (1.2, 90.0), (2.0, 89.9)]
    """
    from frontier.cover import epsilon_cover

    if epsilon <= 0 or not points:
        return list(points)
    return [points[i] for i in epsilon_cover(_costs(points), epsilon)]


def thin_to_count(points: list, max_plans: int) -> tuple[list, float]:
    """At most ``max_plans`` of ``points`` covering all within the least factor that allows it.

    Returns:
        ``(kept, bound)``: every one of ``points`` is within a factor ``1 + bound`` in time and in
        memory of a kept point (:func:`frontier.cover.cover_to_count`); ``bound`` is 0 when
        nothing was dropped.

    Example:
        >>> from types import SimpleNamespace as P
        >>> pts = [P(cost=(1.0 + i / 100, 2.0 - i / 100)) for i in range(100)]
        >>> kept, bound = thin_to_count(pts, 10)
        >>> len(kept) <= 10, round(bound, 3) < 0.1
        (True, True)
    """
    from frontier.cover import cover_to_count

    if not points:
        return [], 0.0
    keep, bound = cover_to_count(_costs(points), max_plans)
    return [points[i] for i in keep], bound


def _costs(points: list):
    """(N, 2) time and memory of solver points."""
    import numpy as np

    return np.array([[float(p.cost[0]), float(p.cost[1])] for p in points])


def frontier_from_points(G, graph, points, global_batch_size: int) -> Frontier:
    """Turn solver points into plans (ids, labels, summary, breakdown) and record their configurations.

    Args:
        G: the cost graph the points were solved on (``mesh``, ``configs``, ``configurations``;
            ``micro_batches`` when :func:`tensoropt.accumulation.price_micro_batches` priced it).
        graph: the OpGraph (kinds and modules for the summary).
        points: ``frontier.solve``'s points, sorted by time.
        global_batch_size: for the throughput.

    Returns:
        The :class:`Frontier` of ``G.graph["num_devices"]`` devices.
    """
    m = int(G.graph.get("micro_batches", 1))
    return frontier_over_counts({m: (G, graph)}, [(m, p) for p in points], global_batch_size,
                                G.graph["mesh"].num_devices)


@dataclass(frozen=True)
class PlanUnits:
    """What turns a plan's step time into the user's units: tokens per sample (token inputs only),
    the step's training FLOPs and one device's peak FLOP/s in the compute dtype.

    Example:
        >>> units = PlanUnits(tokens_per_sample=1024, step_flops=6e12, peak_flops=1e12)
        >>> units.tokens_per_s_per_device(8, 2.0, 4), units.mfu(2.0, 4)
        (1024.0, 0.75)
    """

    tokens_per_sample: int | None = None
    step_flops: float | None = None
    peak_flops: float | None = None

    @staticmethod
    def of(job: Job, graph, cluster) -> PlanUnits:
        """The units of ``job``'s (resolved) model on ``cluster``; ``graph`` is the global batch's."""
        from tensoropt.job_model import tokens_per_sample
        from tensoropt.precision import get_precision

        flops = 3.0 * sum(float(d.get("flops", 0)) for _, d in graph.nx.nodes(data=True))
        peak = cluster.device.peak_flops(get_precision(job.training.precision).compute_dtype)
        return PlanUnits(tokens_per_sample(job), flops or None, peak or None)

    def tokens_per_s_per_device(self, global_batch_size: int, time_s: float, devices: int) -> float | None:
        """Tokens per second per device (None without token inputs)."""
        if not self.tokens_per_sample or not global_batch_size or time_s <= 0:
            return None
        return global_batch_size * self.tokens_per_sample / time_s / devices

    def mfu(self, time_s: float, devices: int) -> float | None:
        """The predicted model FLOPs utilisation of a step of ``time_s`` on ``devices``."""
        if not self.step_flops or not self.peak_flops or time_s <= 0:
            return None
        return self.step_flops / time_s / (devices * self.peak_flops)


def frontier_over_counts(solved: dict, points: list, global_batch_size: int, num_devices: int,
                         units: PlanUnits | None = None) -> Frontier:
    """Plans of ``(micro_batches, point)`` pairs, each read on its count's cost graph.

    Args:
        solved: micro-batch count -> (its cost graph, its OpGraph).
        points: ``(count, solver point)`` sorted by time (:func:`tensoropt.accumulation.pareto_over_counts`).
        global_batch_size: samples per step (the throughput).
        num_devices: the device count.
        units: tokens per sample and FLOPs for tokens/s per device and the predicted MFU.
    """
    units = units or PlanUnits()
    plans = []
    configurations: dict[str, dict[str, dict]] = {}
    mesh = None
    for i, (m, point) in enumerate(points):
        G, graph = solved[m]
        mesh = G.graph["mesh"]
        ops = {n: G.nodes[n]["configs"][c] for n, c in point.assignment.items()}
        for n, c in point.assignment.items():
            seen = configurations.setdefault(n, {})
            if ops[n] not in seen:  # once per (node, configuration), not per plan: 10^5 at Llama-3-8B
                seen[ops[n]] = G.nodes[n]["configurations"][c].to_json()
        time_s, memory_bytes = float(point.cost[0]), float(point.cost[1])
        layers, redistributions = plan_layers(G, graph, point.assignment)
        peak = plan_peak_bytes(G, graph, point.assignment, layers, redistributions) if m == 1 else None
        plans.append(Plan(
            id=plan_id(num_devices, i), time_s=time_s, memory_bytes=float(round(memory_bytes)), ops=ops,
            summary=plan_summary(graph, ops), layers=layers, redistributions=redistributions,
            throughput_samples_per_s=global_batch_size / time_s if time_s > 0 else None, micro_batches=m,
            tokens_per_s_per_device=units.tokens_per_s_per_device(global_batch_size, time_s, num_devices),
            mfu=units.mfu(time_s, num_devices), peak_tensor_bytes=peak,
        ))
    if mesh is None:
        mesh = next(iter(solved.values()))[0].graph["mesh"]
    return Frontier(devices=num_devices, mesh=mesh, plans=plans, configurations=configurations)


def plan_peak_bytes(G, graph, assignment: dict, layers: list, redistributions: list) -> float | None:
    """A plan's tensor peak per device walked in step order, from the captured graph (``graph.program``)
    and its rows: :func:`tensoropt.peak_transients.plan_tensor_peak_bytes`, the function the executor's
    ``predicted.peak_tensor_bytes`` is (None without an exported program, and for a plan with a recompute
    chain).

    Example:
        >>> import torch
        >>> from tensoropt.capture import capture
        >>> from tensoropt.cost_graph import cost_graph
        >>> from tensoropt.summary import plan_layers
        >>> g = capture(torch.nn.Linear(256, 256), (torch.randn(8, 256),))
        >>> G = cost_graph(g, "cpu-local", 1, configurations={})
        >>> rows, moves = plan_layers(G, g, dict.fromkeys(G, 0))
        >>> plan_peak_bytes(G, g, dict.fromkeys(G, 0), rows, moves) / 1024  # the optimizer step: 6 x 257 KiB
        1542.0
    """
    from tensoropt.peak_transients import StepPlan, plan_tensor_peak_bytes

    program = getattr(graph, "program", None)
    if program is None or not hasattr(program, "graph"):
        return None
    operands = {n: d.get("operands", []) for n, d in graph.nx.nodes(data=True)}
    placements = {n: G.nodes[n]["configurations"][c] for n, c in assignment.items()
                  if "configurations" in G.nodes[n]}
    plan = StepPlan(G.graph["mesh"], placements, tuple(layer.__dict__ for layer in layers),
                    tuple(r.to_json() for r in redistributions))
    cluster = G.graph.get("cluster")
    kind = getattr(getattr(cluster, "device", None), "kind", "gpu")
    optimizer = str(G.graph.get("optimizer", "adamw"))
    peak = plan_tensor_peak_bytes(program.graph, plan, operands, optimizer, kind)
    return None if peak is None else float(peak)


def _fraction(args: tuple) -> float:
    """Fraction done from a solver progress callback's arguments (done, total) or (fraction,)."""
    numbers = [a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)]
    if len(numbers) >= 2 and numbers[1]:
        return min(1.0, numbers[0] / numbers[1])
    if len(numbers) == 1:
        return min(1.0, float(numbers[0]))
    return 0.0


def plan_job(job: Job, progress: Progress | None = None) -> FrontierFile:
    """Plan a job: capture once, then a Pareto frontier for every device count.

    Args:
        job: the validated job (see :func:`tensoropt.config.load_job`).
        progress: ``progress(message, fraction)`` for a progress bar.

    Returns:
        The :class:`FrontierFile` (``selected`` not set; see :mod:`tensoropt.selector`).

    Raises:
        PlanningError: naming the stage (model, cluster, capture, cost graph, solve) that failed.

    Example:
        >>> from tensoropt.config import Job
        >>> job = Job(model={"name": "mlp"}, cluster="cpu-local", devices=[1, 2])
        >>> [f.devices for f in plan_job(job).frontiers]
        [1, 2]
    """
    from tensoropt.capture.runnable import UnrunnableOpError, check_runnable

    report = progress or (lambda message, fraction: None)
    start = time.perf_counter()
    report("building the model", 0.0)
    cluster = load_job_cluster(job)
    model, spec = build_job_model(job, "meta")
    job = resolve_job(job, spec, cluster)
    report("capturing the training step", 0.01)
    try:
        graph = capture_job(job, (model, spec))
    except Exception as e:
        from tensoropt.models.contract import ContractError

        cause = e
        while cause is not None and not isinstance(cause, ContractError):  # export wraps the model's errors
            cause = cause.__cause__ or cause.__context__
        if cause is not None:  # the job's model contract is broken: say which key, not export's advice
            raise PlanningError(str(cause)) from None
        if getattr(e, "kind", None) in ("size", "shapes"):  # the job's shapes are the cause: name them
            raise PlanningError(f"{input_shapes_line(job)}: capture of model "
                                f"{job.model.name or job.model.factory!r}: {e}") from None
        raise PlanningError(f"capture of model {job.model.name or job.model.factory!r}: {e}") from e
    try:  # an op without a kernel or a backward: say so now, not in every worker
        check_runnable(graph.program, cluster.device.kind)
    except UnrunnableOpError as e:
        raise PlanningError(f"model {job.model.name or job.model.factory!r}: {e}") from None
    capture_s = time.perf_counter() - start
    micro_graphs: dict[int, object] = {1: graph}

    def micro_graph(m: int):  # captured once per count, shared by every device count
        if m not in micro_graphs:
            micro_graphs[m] = capture_job(micro_batch_job(job, m), (model, spec))
        return micro_graphs[m]

    weights = [d * d for d in job.devices]  # solve time grows with the device count
    done, total = 0.05, sum(weights)
    frontiers = []
    pipeline_graphs: dict = {}
    with frozen_heap():  # the model, its graph and torch live to the end: collections skip them
        for d, w in zip(job.devices, weights):

            def sub(message, fraction, base=done, width=0.95 * w / total):
                report(message, base + width * fraction)

            sub(f"cost graph for {_devices(d)}", 0.0)
            frontiers.append(plan_devices(graph, job, cluster, d, sub, micro_graph, pipeline_graphs))
            done += 0.95 * w / total
            report(f"{_devices(d)}: {len(frontiers[-1].plans)} plans", done)
    from tensoropt.capture.fingerprint import fingerprint

    return FrontierFile(job=job.to_dict(), frontiers=frontiers,
                        timing_s={"capture": capture_s, "total": time.perf_counter() - start},
                        graph=fingerprint(graph, job))


@contextlib.contextmanager
def frozen_heap():
    """Exclude every object alive now from the garbage collector's scans until the block ends.

    Building a frontier allocates millions of small objects (rows of every plan); each full
    collection would walk the whole heap again, torch and the captured graph included (on
    Llama-3-8B's 1100 operators, over half of writing frontier.json's text). ``gc.freeze`` moves
    the live objects to a permanent generation; ``gc.unfreeze`` gives them back afterwards, so
    nothing is leaked when the caller drops them. Inside a frozen heap (the caller's, or an outer
    block) it does nothing, so the outer freeze is not undone early.

    Example:
        >>> import gc
        >>> with frozen_heap():
        ...     gc.get_freeze_count() > 0
        True
    """
    import gc

    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _devices(n: int) -> str:
    return f"{n} device" if n == 1 else f"{n} devices"
