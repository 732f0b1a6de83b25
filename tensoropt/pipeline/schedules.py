"""Pipeline schedules: how many micro-batches of activations each stage holds, from torch's order.

torch.distributed.pipelining builds every schedule's action list (``_get_pipeline_order``: per
rank, forwards ``F`` and backwards ``B`` of numbered micro-batches, ``None`` for idle steps) from
the stage and micro-batch counts alone. A stage's activations of a micro-batch are alive from its
forward to its backward, so the most it holds at once is the peak of (forwards done - backwards
done) along its own list: 1F1B gives ``min(p - s, m)``, GPipe ``m``. Reading the count off torch's
order (not a formula) keeps the planner in step with the runtime that will drive the stages.
``_get_pipeline_order`` is private: :func:`in_flight_micro_batches` checks the order it returns
(each stage runs ``m`` forwards and ``m`` backwards, never a backward before its forward) and raises
if torch changed it. Counts, not indices: torch 2.13's 1F1B order numbers the last stage's forwards
1..m (a labelling slip of its visualiser order; the runtime runs 0..m-1), which changes no count.
``Interleaved1F1B`` (two virtual stages per rank) builds its order in its constructor; the same
computation (``_calculate_single_rank_operations``) is run here without stages, and each virtual
stage's count is the peak along its rank's list of its own actions: with ``p = 4, m = 8``
``[8, 8, 7, 5, 4, 4, 3, 1]`` (rank 0 warms up ``(v - 1) p + 2 (p - 1) = 10`` chunks).
"""

from __future__ import annotations

from types import SimpleNamespace

SCHEDULES = ("1F1B", "GPipe", "Interleaved1F1B")
"""Schedules the planner prices, by the names ``planner.pipeline`` takes. ``Interleaved1F1B`` holds
:data:`INTERLEAVED_CHUNKS` virtual stages per rank (rank ``r``: stages ``r`` and ``r + p``)."""

INTERLEAVED_CHUNKS = 2
"""Virtual stages per rank of ``Interleaved1F1B`` plans (Megatron's ``v``)."""


def stages_per_rank(schedule: str) -> int:
    """Virtual stages each rank holds under ``schedule`` (a plan's ``blocks`` lists ``p`` times this).

    Example:
        >>> stages_per_rank("1F1B"), stages_per_rank("Interleaved1F1B")
        (1, 2)
    """
    _schedule_class(schedule)
    return INTERLEAVED_CHUNKS if schedule == "Interleaved1F1B" else 1


class PipelineError(ValueError):
    """A pipeline request that cannot be planned (stage count, micro-batches, schedule, cuts).

    Example:
        >>> str(PipelineError("planner.pipeline.stages: 3 does not divide 8 devices"))
        'planner.pipeline.stages: 3 does not divide 8 devices'
    """


def _schedule_class(schedule: str):
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    classes = {"1F1B": Schedule1F1B, "GPipe": ScheduleGPipe, "Interleaved1F1B": ScheduleInterleaved1F1B}
    if schedule not in classes:
        raise PipelineError(
            f"planner.pipeline.schedules: unknown schedule {schedule!r}; "
            f"the planner prices {', '.join(SCHEDULES)}"
        )
    return classes[schedule]


def min_micro_batches(schedule: str, num_stages: int) -> int:
    """The fewest micro-batches ``schedule`` runs with on ``num_stages`` stages (1F1B: ``p``; GPipe: 1).

    Example:
        >>> min_micro_batches("1F1B", 4), min_micro_batches("GPipe", 4)
        (4, 1)
    """
    _schedule_class(schedule)
    return num_stages if schedule == "1F1B" else 1


def check_pipeline(
    schedule: str, num_stages: int, micro_batches: int, num_devices: int, batch_size: int
) -> None:
    """Raise :class:`PipelineError` naming the field when the pipeline cannot run.

    The stage count must divide the devices, the micro-batches must reach the schedule's minimum
    (torch's 1F1B raises below ``p``) and divide the global batch. ``Interleaved1F1B`` runs its
    micro-batches in rounds of ``m / max(1, m // p)``: torch 2.13 raises unless
    ``m % max(1, m // p) == 0`` (any multiple of ``p`` passes, and any ``m <= p``).

    Example:
        >>> try:
        ...     check_pipeline("1F1B", 4, 2, 8, 16)
        ... except PipelineError as e:
        ...     print(e)
        planner.pipeline.micro_batches: 1F1B on 4 stages needs at least 4 micro-batches, got 2
    """
    if num_stages < 1 or num_devices % num_stages:
        raise PipelineError(
            f"planner.pipeline.stages: {num_stages} stages do not divide {num_devices} devices; "
            "use a divisor of every device count"
        )
    least = min_micro_batches(schedule, num_stages)
    if micro_batches < least:
        raise PipelineError(
            f"planner.pipeline.micro_batches: {schedule} on {num_stages} stages needs at least "
            f"{least} micro-batches, got {micro_batches}"
        )
    if schedule == "Interleaved1F1B" and num_stages < 2:
        raise PipelineError(
            "planner.pipeline.stages: Interleaved1F1B needs at least 2 stages (ranks), got "
            f"{num_stages}; use 1F1B or GPipe there (planner.pipeline.schedules)"
        )
    rounds = max(1, micro_batches // num_stages)
    if schedule == "Interleaved1F1B" and micro_batches % rounds:
        raise PipelineError(
            f"planner.pipeline.micro_batches: Interleaved1F1B on {num_stages} stages runs the micro-batches "
            f"in {rounds} rounds, which {micro_batches} micro-batches do not fill evenly (torch needs "
            f"m % max(1, m // p) == 0); use a multiple of {num_stages} (planner.pipeline.schedules)"
        )
    if batch_size % micro_batches:
        raise PipelineError(
            f"planner.pipeline.micro_batches: {micro_batches} micro-batches do not divide the "
            f"global batch of {batch_size} (training.global_batch_size)"
        )


def pipeline_order(schedule: str, num_stages: int, micro_batches: int) -> dict[int, list]:
    """torch's action list per rank for ``schedule`` (``num_stages`` ranks; each action names its
    stage, ``r`` or ``r + p`` for ``Interleaved1F1B``).

    Example:
        >>> order = pipeline_order("1F1B", 2, 2)
        >>> [str(a) for a in order[0] if a is not None][:3]
        ['0F0', '0F1', '0B0']
        >>> [str(a) for a in pipeline_order("Interleaved1F1B", 2, 2)[0] if a is not None][:4]
        ['0F0', '0F1', '2F0', '2F1']
    """
    cls = _schedule_class(schedule)
    if schedule == "Interleaved1F1B":
        order = _interleaved_order(cls, num_stages, micro_batches)
    else:
        shape = SimpleNamespace(_num_stages=num_stages, _n_microbatches=micro_batches)
        order = cls._get_pipeline_order(shape)
    if not isinstance(order, dict) or sorted(order) != list(range(num_stages)):
        raise RuntimeError(
            f"torch's {cls.__name__}._get_pipeline_order changed: got {type(order).__name__}; "
            "update tensoropt/pipeline/schedules.py"
        )
    return order


def _interleaved_order(cls, num_ranks: int, micro_batches: int) -> dict[int, list]:
    """``ScheduleInterleaved1F1B``'s own per-rank computation order, without stages or processes:
    its constructor's rounds and ``_calculate_single_rank_operations`` (private: guarded)."""
    schedule = object.__new__(cls)
    schedule.n_local_stages, schedule.pp_group_size = INTERLEAVED_CHUNKS, num_ranks
    schedule._n_microbatches = micro_batches
    schedule.number_of_rounds = max(1, micro_batches // num_ranks)
    schedule.microbatches_per_round = micro_batches // schedule.number_of_rounds
    try:
        return {r: schedule._calculate_single_rank_operations(r) for r in range(num_ranks)}
    except (AttributeError, TypeError) as e:
        raise RuntimeError(f"torch's {cls.__name__}._calculate_single_rank_operations changed ({e}); "
                           "update tensoropt/pipeline/schedules.py") from None


def in_flight_micro_batches(schedule: str, num_stages: int, micro_batches: int) -> list[int]:
    """``k_s``: the most micro-batches of activations stage ``s`` holds at once, from torch's order
    (``Interleaved1F1B``: one count per virtual stage, ``2 p`` of them in chain order).

    Example:
        >>> in_flight_micro_batches("1F1B", 4, 8), in_flight_micro_batches("GPipe", 4, 8)
        ([4, 3, 2, 1], [8, 8, 8, 8])
        >>> in_flight_micro_batches("Interleaved1F1B", 2, 4)
        [4, 3, 2, 1]
    """
    check_pipeline(schedule, num_stages, micro_batches, num_stages, micro_batches)
    order = pipeline_order(schedule, num_stages, micro_batches)
    chunks = stages_per_rank(schedule)
    peaks = [0] * (num_stages * chunks)
    for stage in range(num_stages * chunks):
        rank = stage % num_stages
        alive, peak, forwards, backwards = 0, 0, 0, 0
        for action in order[rank]:
            if action is None or (chunks > 1 and action.stage_index != stage):
                continue
            kind = str(
                action.computation_type.value
                if hasattr(action.computation_type, "value")
                else action.computation_type
            )
            if kind == "F":
                alive += 1
                forwards += 1
            elif kind in ("B", "I"):  # a full backward, or the input half: the activations are freed
                alive -= 1
                backwards += 1
            if alive < 0:
                break
            peak = max(peak, alive)
        if forwards != micro_batches or backwards != micro_batches or alive < 0:
            raise RuntimeError(
                f"torch's {schedule} order for stage {stage} does not run every micro-batch "
                "forward and backward once; update tensoropt/pipeline/schedules.py"
            )
        peaks[stage] = peak
    return peaks
