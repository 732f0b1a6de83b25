"""The resource-aware selector: pick one plan from the frontiers under a memory budget.

Rules (``memory_bytes <= budget`` and, when given, ``time_s <= max_time_s`` for every rule):

* ``fastest``: the fastest plan on exactly ``devices`` devices (on any planned count when
  ``devices`` is None).
* ``fewest_devices``: the fewest devices (at most ``devices``) that have a plan meeting the
  limits; the fastest such plan.
* ``best_per_device``: the highest throughput per device, i.e. the smallest
  ``time_s * devices``, over counts of at most ``devices``.

When nothing qualifies, :class:`NoFeasiblePlan` says the smallest memory any plan needs on
that device count and the device count that would fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensoropt.config import SELECT_RULES, format_size
from tensoropt.plans import Frontier, FrontierFile, Plan

EXIT_NO_FEASIBLE_PLAN = 2
"""Exit code of the CLI when no plan fits."""


class DeviceCountNotPlanned(LookupError):
    """The frontier file has no frontier for the requested device count.

    Example:
        >>> str(DeviceCountNotPlanned(3, [1, 2, 4])).split(";")[0]
        'no frontier for 3 devices in the frontier file (planned: 1, 2, 4)'
    """

    def __init__(self, devices: int, planned: list[int]):
        self.devices, self.planned = devices, planned
        listed = ", ".join(map(str, planned)) or "none"
        super().__init__(f"no frontier for {devices} devices in the frontier file (planned: {listed}); "
                         f"add {devices} to the job's devices and re-run tensoropt plan")


class NoFeasiblePlan(Exception):
    """No plan meets the memory budget (and time limit).

    Attributes:
        devices: the device count asked for (None: any planned count).
        memory_budget_bytes: the budget per device.
        max_time_s: the step-time limit, or None.
        min_memory_bytes: the smallest memory any plan needs on that device count (or counts).
        fitting_devices: the smallest planned device count with a plan meeting the limits, or None.
    """

    def __init__(self, message: str, *, devices: int | None, memory_budget_bytes: float | None,
                 max_time_s: float | None, min_memory_bytes: float | None, fitting_devices: int | None):
        super().__init__(message)
        self.devices, self.memory_budget_bytes, self.max_time_s = devices, memory_budget_bytes, max_time_s
        self.min_memory_bytes, self.fitting_devices = min_memory_bytes, fitting_devices


@dataclass
class Selection:
    """The selected plan and the frontier it belongs to."""

    plan: Plan
    """The chosen plan."""
    frontier: Frontier
    """Its frontier (device count and mesh)."""
    rule: str
    """The rule that chose it."""


def select(frontier_file: FrontierFile, *, memory_budget_bytes: float | None = None,
           devices: int | None = None, rule: str = "fastest", max_time_s: float | None = None) -> Selection:
    """Select a plan by ``rule`` among plans with memory <= budget and time <= max_time_s.

    Args:
        frontier_file: the planned frontiers.
        memory_budget_bytes: per-device budget (None: no memory limit).
        devices: device count (``fastest``: exactly this many; the other rules: at most this
            many); None: every planned count.
        rule: fastest | fewest_devices | best_per_device.
        max_time_s: optional step-time limit.

    Returns:
        The :class:`Selection`.

    Raises:
        NoFeasiblePlan: nothing meets the limits (message: the smallest memory needed there and
            the device count that would fit).
        DeviceCountNotPlanned: ``rule == "fastest"`` and ``devices`` has no frontier.
        ValueError: unknown rule.

    Example:
        >>> from tensoropt.configspace.configuration import Mesh
        >>> f = Frontier(2, Mesh((2,), ("gpu",)), [Plan("d2-p0", 1.0, 900, {}), Plan("d2-p1", 2.0, 500, {})])
        >>> select(FrontierFile({}, [f]), memory_budget_bytes=600, devices=2).plan.id
        'd2-p1'
    """
    if rule not in SELECT_RULES:
        raise ValueError(f"unknown selection rule {rule!r}; expected one of {' | '.join(SELECT_RULES)}")
    candidates = _candidate_frontiers(frontier_file, devices, rule)

    def fits(plan: Plan) -> bool:
        return ((memory_budget_bytes is None or plan.memory_bytes <= memory_budget_bytes)
                and (max_time_s is None or plan.time_s <= max_time_s))

    feasible = [(f, p) for f in candidates for p in f.plans if fits(p)]
    if not feasible:
        raise _infeasible(frontier_file, candidates, devices, memory_budget_bytes, max_time_s, fits)
    if rule == "fastest":
        key = lambda fp: (fp[1].time_s, fp[1].memory_bytes, fp[0].devices)
    elif rule == "fewest_devices":
        key = lambda fp: (fp[0].devices, fp[1].time_s, fp[1].memory_bytes)
    else:
        key = lambda fp: (fp[1].time_s * fp[0].devices, fp[1].time_s, fp[1].memory_bytes)
    frontier, plan = min(feasible, key=key)
    return Selection(plan=plan, frontier=frontier, rule=rule)


def _candidate_frontiers(frontier_file: FrontierFile, devices: int | None, rule: str) -> list[Frontier]:
    planned = [f.devices for f in frontier_file.frontiers]
    if devices is None:
        return list(frontier_file.frontiers)
    if rule == "fastest":
        frontier = frontier_file.frontier(devices)
        if frontier is None:
            raise DeviceCountNotPlanned(devices, planned)
        return [frontier]
    out = [f for f in frontier_file.frontiers if f.devices <= devices]
    if not out:
        raise DeviceCountNotPlanned(devices, planned)
    return out


def _infeasible(frontier_file, candidates, devices, budget, max_time_s, fits) -> NoFeasiblePlan:
    """Build the message: what was asked, the least memory needed, and what would fit."""
    limits = f"{format_size(budget)} per device" if budget is not None else "no memory limit"
    if max_time_s is not None:
        limits += f" and {max_time_s:g} s per step"
    where = f"{devices} devices" if devices is not None else "any planned device count"
    if devices is not None and len(candidates) > 1:
        where = f"at most {devices} devices"
    plans = [(f, p) for f in candidates for p in f.plans]
    lines = [f"no plan fits {limits} on {where}."]
    min_memory = None
    if plans:
        f_min, p_min = min(plans, key=lambda fp: (fp[1].memory_bytes, fp[1].time_s))
        min_memory = p_min.memory_bytes
        lines.append(f"The smallest memory any plan needs there is {format_size(min_memory)} "
                     f"({min_memory:.0f} bytes; plan {p_min.id} on {f_min.devices} devices, "
                     f"{p_min.time_s:.4g} s/step).")
        if max_time_s is not None:
            f_fast, p_fast = min(plans, key=lambda fp: fp[1].time_s)
            lines.append(f"The fastest plan there takes {p_fast.time_s:.4g} s/step ({p_fast.id}).")
    others = sorted((f for f in frontier_file.frontiers if any(fits(p) for p in f.plans)),
                    key=lambda f: f.devices)
    fitting = others[0].devices if others else None
    if fitting is not None:
        best = min((p for p in others[0].plans if fits(p)), key=lambda p: p.time_s)
        lines.append(f"{fitting} devices would fit: plan {best.id} needs {format_size(best.memory_bytes)} "
                     f"per device and {best.time_s:.4g} s/step (use --devices {fitting}).")
    else:
        planned = ", ".join(str(f.devices) for f in frontier_file.frontiers)
        lines.append(f"No planned device count fits (planned: {planned}); raise the memory budget"
                     + (" or the time limit" if max_time_s is not None else "")
                     + " or plan for more devices.")
    return NoFeasiblePlan(" ".join(lines), devices=devices, memory_budget_bytes=budget, max_time_s=max_time_s,
                          min_memory_bytes=min_memory, fitting_devices=fitting)
