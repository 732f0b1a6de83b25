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
"""

from __future__ import annotations

from types import SimpleNamespace

SCHEDULES = ("1F1B", "GPipe")
"""Schedules the planner prices (one stage per rank), by the names ``planner.pipeline`` takes."""


class PipelineError(ValueError):
    """A pipeline request that cannot be planned (stage count, micro-batches, schedule, cuts).

    Example:
        >>> str(PipelineError("planner.pipeline.stages: 3 does not divide 8 devices"))
        'planner.pipeline.stages: 3 does not divide 8 devices'
    """


def _schedule_class(schedule: str):
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    classes = {"1F1B": Schedule1F1B, "GPipe": ScheduleGPipe}
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
    (torch's 1F1B raises below ``p``) and divide the global batch.

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
    if batch_size % micro_batches:
        raise PipelineError(
            f"planner.pipeline.micro_batches: {micro_batches} micro-batches do not divide the "
            f"global batch of {batch_size} (training.global_batch_size)"
        )


def pipeline_order(schedule: str, num_stages: int, micro_batches: int) -> dict[int, list]:
    """torch's action list per rank (one stage per rank) for ``schedule``.

    Example:
        >>> order = pipeline_order("1F1B", 2, 2)
        >>> [str(a) for a in order[0] if a is not None][:3]
        ['0F0', '0F1', '0B0']
    """
    cls = _schedule_class(schedule)
    order = cls._get_pipeline_order(SimpleNamespace(_num_stages=num_stages, _n_microbatches=micro_batches))
    if not isinstance(order, dict) or sorted(order) != list(range(num_stages)):
        raise RuntimeError(
            f"torch's {cls.__name__}._get_pipeline_order changed: got {type(order).__name__}; "
            "update tensoropt/pipeline/schedules.py"
        )
    return order


def in_flight_micro_batches(schedule: str, num_stages: int, micro_batches: int) -> list[int]:
    """``k_s``: the most micro-batches of activations stage ``s`` holds at once, from torch's order.

    Example:
        >>> in_flight_micro_batches("1F1B", 4, 8), in_flight_micro_batches("GPipe", 4, 8)
        ([4, 3, 2, 1], [8, 8, 8, 8])
    """
    check_pipeline(schedule, num_stages, micro_batches, num_stages, micro_batches)
    order = pipeline_order(schedule, num_stages, micro_batches)
    peaks = []
    for rank in range(num_stages):
        alive, peak, forwards, backwards = 0, 0, 0, 0
        for action in order[rank]:
            if action is None:
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
                f"torch's {schedule} order for stage {rank} does not run every micro-batch "
                "forward and backward once; update tensoropt/pipeline/schedules.py"
            )
        peaks.append(peak)
    return peaks
