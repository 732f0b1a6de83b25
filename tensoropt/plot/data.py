"""What the Pareto page shows, read from a frontier.json dict (torch-free, plotly-free).

The page needs, per plan: its id, device count, step time, memory per device, throughput
(global batch / step time), the one-line summary, whether it fits the memory budget, and the
per-layer rows of the detail panel. :func:`page_points` extracts exactly that, validating the
fields it reads so a malformed file fails with the plan and key that are wrong.

Example:
    >>> fj = {"version": 1, "job": {"training": {"global_batch_size": 64}},
    ...       "frontiers": [{"devices": 2, "mesh": [2], "plans": [
    ...           {"id": "d2-p0", "time_s": 0.5, "memory_bytes": 2**30, "ops": {}}]}]}
    >>> p = page_points(fj, budget_bytes=None)[0]
    >>> p.plan_id, p.devices, p.memory_gib, p.throughput
    ('d2-p0', 2, 1.0, 128.0)
"""

from __future__ import annotations

from dataclasses import dataclass, field

GIB = 2**30
"""Bytes per GiB (the page's memory unit unless every plan needs less than 1 GiB)."""
MIB = 2**20



@dataclass(frozen=True)
class PlotPoint:
    """One plan as the page draws it.

    Attributes:
        plan_id: the plan's id in frontier.json, e.g. ``"d8-p3"``.
        devices: device count of the plan's frontier.
        time_s: estimated step time.
        memory_bytes: estimated peak memory per device.
        throughput: samples per second (global batch / step time), None if the batch is unknown.
        summary: one line on how the plan splits the model.
        fits: True if ``peak_memory_bytes`` is within the budget (True when there is no budget): the
            budget is checked against the peak, as the selector and the planner check it.
        layers: the plan's per-layer rows (dicts with node, op, module, config, compute_s,
            comm_s, memory_bytes), as in frontier.json.
        micro_batches: micro-batches per step (gradient accumulation; 1 in older files).
        tokens_per_s_per_device: for token inputs, tokens per second per device (else None).
        mfu: the predicted model FLOPs utilisation (None when the file has none).
    """

    plan_id: str
    devices: int
    time_s: float
    memory_bytes: float
    throughput: float | None
    summary: str
    fits: bool
    layers: list[dict] = field(default_factory=list)
    micro_batches: int = 1
    tokens_per_s_per_device: float | None = None
    mfu: float | None = None
    peak_memory_bytes: float | None = None
    """``memory_bytes`` plus the plan's largest transient (a recompute chain's rebuilt tensors, a
    communication buffer, one chunk of a chunked loss): :attr:`tensoropt.plans.Plan.peak_memory_bytes`."""

    @property
    def memory_gib(self) -> float:
        """Memory per device in GiB."""
        return self.memory_bytes / GIB


def job_budget_bytes(frontier_json: dict) -> int | None:
    """The per-device memory budget of the resolved job (``job.memory_budget``, bytes), if any.

    Example:
        >>> job_budget_bytes({"job": {"memory_budget": 1024}}), job_budget_bytes({"job": {}})
        (1024, None)
    """
    value = frontier_json.get("job", {}).get("memory_budget")
    if value is None:
        return None
    from tensoropt.sizes import parse_size

    try:
        return parse_size(value)
    except ValueError as e:
        raise ValueError(f"frontier.json: job.memory_budget: {e} (expected bytes or a size such as 40GiB)") \
            from None


def memory_unit(points: list[PlotPoint]) -> tuple[str, int]:
    """The memory unit of the page: GiB, or MiB when every plan needs less than 1 GiB.

    Example:
        >>> memory_unit([PlotPoint("d1-p0", 1, 1.0, 5 * MIB, None, "", True)])
        ('MiB', 1048576)
    """
    return ("GiB", GIB) if any(p.memory_bytes >= GIB for p in points) else ("MiB", MIB)


def global_batch_size(frontier_json: dict) -> int | None:
    """The job's global batch (``job.training.global_batch_size``), or None when absent.

    Example:
        >>> global_batch_size({"job": {"training": {"global_batch_size": 32}}})
        32
    """
    value = frontier_json.get("job", {}).get("training", {}).get("global_batch_size")
    return int(value) if value else None


def page_points(frontier_json: dict, budget_bytes: int | None) -> list[PlotPoint]:
    """All plans of all frontiers as :class:`PlotPoint`, frontiers by device count.

    Args:
        frontier_json: the parsed frontier.json (schema of issue 5 with summary and layers).
        budget_bytes: memory budget per device; None draws no budget and dims nothing.

    Returns:
        One point per plan, in file order within each device count.

    Raises:
        ValueError: naming ``frontiers[i].plans[j].<key>`` for a missing or non-numeric field.

    Example:
        >>> fj = {"job": {}, "frontiers": [{"devices": 1, "plans": [
        ...     {"id": "d1-p0", "time_s": 1.0, "memory_bytes": 3 * GIB, "summary": "all: replicate"}]}]}
        >>> page_points(fj, budget_bytes=2 * GIB)[0].fits
        False
    """
    from tensoropt.plans import largest_transient_of_rows, unpack_frontier_json

    batch = global_batch_size(frontier_json)
    frontiers = frontier_json.get("frontiers")
    if not isinstance(frontiers, list):
        raise ValueError("frontier.json: 'frontiers' must be a list of frontiers (see issue 5 schema)")
    frontiers = unpack_frontier_json(frontier_json)["frontiers"]  # the file's shared rows resolved
    points = []
    for i, fr in sorted(enumerate(frontiers), key=lambda t: int(t[1].get("devices", 0))):
        devices = _number(fr, "devices", f"frontiers[{i}]")
        for j, plan in enumerate(fr.get("plans", [])):
            where = f"frontiers[{i}].plans[{j}]"
            time_s = _number(plan, "time_s", where)
            memory_bytes = _number(plan, "memory_bytes", where)
            peak_bytes = plan.get("peak_tensor_bytes")  # the step-order peak (Plan.peak_memory_bytes)
            if not isinstance(peak_bytes, (int, float)):
                peak_bytes = memory_bytes + largest_transient_of_rows(plan.get("layers", []))
            if "id" not in plan:
                raise ValueError(f"frontier.json: {where}.id is missing")
            points.append(
                PlotPoint(
                    plan_id=str(plan["id"]),
                    devices=int(devices),
                    time_s=float(time_s),
                    memory_bytes=float(memory_bytes),
                    throughput=_throughput(plan, batch, time_s),
                    summary=str(plan.get("summary", "")),
                    fits=budget_bytes is None or peak_bytes <= budget_bytes,
                    layers=list(plan.get("layers", [])),
                    micro_batches=int(plan.get("micro_batches", 1)),
                    tokens_per_s_per_device=_optional(plan, "tokens_per_s_per_device", where),
                    mfu=_optional(plan, "mfu", where),
                    peak_memory_bytes=peak_bytes,
                )
            )
    return points


def _number(obj: dict, key: str, where: str) -> float:
    """obj[key] as a number, or a ValueError naming the field."""
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"frontier.json: {where}.{key} must be a number, got {value!r}")
    return value


def _optional(obj: dict, key: str, where: str) -> float | None:
    """obj[key] as a float when present (None when absent or null)."""
    return None if obj.get(key) is None else float(_number(obj, key, where))


def _throughput(plan: dict, batch: int | None, time_s: float) -> float | None:
    """The plan's recorded samples/s, else global batch / step time."""
    recorded = plan.get("throughput_samples_per_s")
    if isinstance(recorded, (int, float)) and not isinstance(recorded, bool):
        return float(recorded)
    return batch / time_s if batch and time_s > 0 else None
