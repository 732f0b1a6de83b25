"""The resource-aware selector: pick one plan from the frontiers under a memory budget.

Rules (``peak_memory_bytes <= budget`` and, when given, ``time_s <= max_time_s`` for every rule; a plan's
peak is its additive memory plus its largest transient, :attr:`tensoropt.plans.Plan.peak_memory_bytes`:
a plan whose memory fits but whose recompute transient, a checkpointed block's activations during its
backward, does not, is refused):

* ``fastest``: the fastest plan on exactly ``devices`` devices (on any planned count when
  ``devices`` is None).
* ``fewest_devices``: the fewest devices (at most ``devices``) that have a plan meeting the
  limits; the fastest such plan.
* ``best_per_device``: the highest throughput per device, i.e. the smallest
  ``time_s * devices``, over counts of at most ``devices``.

When nothing qualifies, :class:`NoFeasiblePlan` says the smallest memory any plan needs on
that device count and the device count that would fit.

The margin (issue 29): a plan the rule picks is kept only where its predicted gain over a simpler
plan of the same device count exceeds the estimator's measured step-time error for the model's
family on the job's cluster (:mod:`estimators.time_errors`; ``margin`` overrides it, 0 turns it
off). Otherwise the simplest plan within that margin is selected: the data-parallel plan
(:attr:`Frontier.data_parallel`, or a frontier plan with its labels) first, then the fewest
redistributions, then the fastest. The gain of the rule's plan over a plan ``p`` is
``(p.time_s - time_s) / p.time_s``.
"""

from __future__ import annotations

from dataclasses import dataclass

from estimators.time_errors import load_time_errors, model_family
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


@dataclass(frozen=True)
class Margin:
    """The gain a plan must predict over a simpler one to be selected instead of it."""

    fraction: float
    """The margin, a fraction of the simpler plan's step time."""
    family: str = ""
    """The model family it was measured for ("" when given by hand)."""
    cluster: str = ""
    """The cluster it was measured on."""
    source: str = ""
    """Where it comes from (the table and its measurement, or ``--margin``)."""

    def describe(self) -> str:
        """One phrase: the margin and where it comes from.

        Example:
            >>> Margin(0.08, "lm", "cpu-local", "the table").describe()
            "8.0 % (the estimator's measured step-time error for lm models on cpu-local: the table)"
            >>> Margin(0.0, source="--margin").describe()
            '0.0 % (--margin)'
        """
        if self.family:
            return (f"{100 * self.fraction:.1f} % (the estimator's measured step-time error for "
                    f"{self.family} models on {self.cluster}: {self.source})")
        return f"{100 * self.fraction:.1f} % ({self.source})"


@dataclass
class Selection:
    """The selected plan and the frontier it belongs to."""

    plan: Plan
    """The chosen plan."""
    frontier: Frontier
    """Its frontier (device count and mesh)."""
    rule: str
    """The rule that chose it."""
    margin: Margin | None = None
    """The margin applied (None: none)."""
    rule_plan: Plan | None = None
    """The plan the rule alone picks (the fastest for ``fastest``); ``plan`` where the margin kept it."""

    @property
    def gain(self) -> float | None:
        """The rule's plan's predicted gain over the selected plan, a fraction of its step time
        (None when the rule's plan was selected).

        Example:
            >>> from tensoropt.configspace.configuration import Mesh
            >>> f = Frontier(2, Mesh((2,), ("gpu",)), [])
            >>> Selection(Plan("d2-dp", 1.0, 8, {}), f, "fastest", None, Plan("d2-p0", 0.98, 8, {})).gain
            0.02
        """
        if self.rule_plan is None or self.rule_plan.id == self.plan.id or self.plan.time_s <= 0:
            return None
        return round((self.plan.time_s - self.rule_plan.time_s) / self.plan.time_s, 12)

    def to_json(self) -> dict:
        """The ``selection`` record of frontier.json and plan.json (issue 29's extension): the rule,
        the margin and where it comes from, the rule's plan and the predicted gain.

        Example:
            >>> from tensoropt.configspace.configuration import Mesh
            >>> f = Frontier(2, Mesh((2,), ("gpu",)), [])
            >>> sorted(Selection(Plan("d2-p0", 1.0, 8, {}), f, "fastest").to_json())
            ['margin', 'plan', 'rule', 'rule_plan', 'rule_plan_time_s']
        """
        m, rule_plan = self.margin, self.rule_plan or self.plan
        out = {"plan": self.plan.id, "rule": self.rule, "rule_plan": rule_plan.id,
               "rule_plan_time_s": rule_plan.time_s,
               "margin": None if m is None else {"fraction": m.fraction, "family": m.family,
                                                 "cluster": m.cluster, "source": m.source}}
        if self.gain is not None:
            out["gain"] = self.gain
        return out


def margin_line(selection: dict) -> str:
    """The margin of a ``selection`` record (:meth:`Selection.to_json`) in words, for select and explain.

    Example:
        >>> margin_line({"plan": "d2-dp", "rule": "fastest", "rule_plan": "d2-p0", "rule_plan_time_s": 0.98,
        ...              "gain": 0.02, "margin": {"fraction": 0.08, "family": "lm", "cluster": "cpu-local",
        ...                                       "source": "configs/time_errors.yaml"}}).split("; ")[1]
        'the fastest plan d2-p0 is predicted 2.0 % faster than d2-dp, within the margin: the simpler plan...'

    """
    m = selection.get("margin")
    if not m:
        return "margin: none (the rule's plan is selected as is)"
    margin = Margin(m["fraction"], m.get("family", ""), m.get("cluster", ""), m.get("source", ""))
    text = f"margin {margin.describe()}"
    if selection.get("gain") is not None:
        return (text + f"; the {selection['rule']} plan {selection['rule_plan']} is predicted "
                f"{100 * selection['gain']:.1f} % faster than {selection['plan']}, within the margin: "
                f"the simpler plan {selection['plan']} is selected")
    return text + f"; no simpler plan within it: {selection['plan']} is kept"


def select(frontier_file: FrontierFile, *, memory_budget_bytes: float | None = None,
           devices: int | None = None, rule: str = "fastest", max_time_s: float | None = None,
           margin: float | str | None = "auto") -> Selection:
    """Select a plan by ``rule`` among plans with memory <= budget and time <= max_time_s.

    Args:
        frontier_file: the planned frontiers.
        memory_budget_bytes: per-device budget (None: no memory limit).
        devices: device count (``fastest``: exactly this many; the other rules: at most this
            many); None: every planned count.
        rule: fastest | fewest_devices | best_per_device.
        max_time_s: optional step-time limit.
        margin: ``"auto"``: the estimator's measured step-time error for the model's family on the
            job's cluster (:func:`frontier_margin`); a fraction (0: off); None: off.

    Returns:
        The :class:`Selection`.

    Raises:
        NoFeasiblePlan: nothing meets the limits (message: the smallest memory needed there and
            the device count that would fit).
        DeviceCountNotPlanned: ``rule == "fastest"`` and ``devices`` has no frontier.
        ValueError: unknown rule, or a margin that is not "auto" nor a fraction in [0, 1).

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
        return ((memory_budget_bytes is None or plan.peak_memory_bytes <= memory_budget_bytes)
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
    applied = _margin(frontier_file, margin)
    if applied is None:
        return Selection(plan=plan, frontier=frontier, rule=rule)
    chosen = simplest_within(plan, [p for p in frontier.all_plans() if fits(p)], applied.fraction,
                             frontier.data_parallel)
    return Selection(plan=chosen, frontier=frontier, rule=rule, margin=applied, rule_plan=plan)


def is_data_parallel(plan: Plan, data_parallel: Plan | None) -> bool:
    """Whether ``plan`` is the data-parallel plan (its id ``d<P>-dp``, or the same labels).

    Example:
        >>> dp = Plan("d2-dp", 1.0, 8, {"fc": "batch=2"})
        >>> is_data_parallel(Plan("d2-p1", 1.0, 8, {"fc": "batch=2"}), dp), is_data_parallel(dp, None)
        (True, True)
    """
    return plan.id.endswith("-dp") or (data_parallel is not None and plan.ops == data_parallel.ops)


def simplicity(plan: Plan, data_parallel: Plan | None = None) -> tuple:
    """Sort key, simplest first: the data-parallel plan, then fewer redistributions, then faster.

    Example:
        >>> from tensoropt.plans import Redistribution
        >>> move = Redistribution("a", "b", ["S(0)"], ["R"], 1e-3)
        >>> moved = Plan("d2-p0", 0.9, 8, {}, redistributions=[move])
        >>> simplicity(Plan("d2-dp", 1.0, 8, {})) < simplicity(Plan("d2-p1", 1.0, 8, {})) < simplicity(moved)
        True
    """
    return (not is_data_parallel(plan, data_parallel), len(plan.redistributions), plan.time_s,
            plan.memory_bytes)


def simplest_within(rule_plan: Plan, candidates: list[Plan], margin: float,
                    data_parallel: Plan | None = None) -> Plan:
    """The simplest of ``candidates`` over which ``rule_plan``'s predicted gain does not exceed
    ``margin`` (``(p.time_s - rule_plan.time_s) / p.time_s <= margin``); ``rule_plan`` when none is
    simpler.

    Example:
        >>> fast, dp = Plan("d2-p0", 0.97, 8, {"fc": "out=2"}), Plan("d2-dp", 1.0, 8, {"fc": "batch=2"})
        >>> simplest_within(fast, [fast, dp], 0.05).id, simplest_within(fast, [fast, dp], 0.02).id
        ('d2-dp', 'd2-p0')
    """
    within = [p for p in candidates if p.time_s <= 0 or (p.time_s - rule_plan.time_s) / p.time_s <= margin]
    return min([rule_plan, *within], key=lambda p: simplicity(p, data_parallel))


def frontier_margin(frontier_file: FrontierFile) -> Margin:
    """The estimator's measured step-time error for the frontier's model family on its job's cluster
    (:mod:`estimators.time_errors`; the family read off the graph fingerprint's operators).

    Example:
        >>> nodes = [["x", "input", [8, 3], "f32", {}], ["fc", "aten.linear.default", [8, 2], "f32", {}]]
        >>> m = frontier_margin(FrontierFile({"cluster": "cpu-local"}, [], graph={"nodes": nodes}))
        >>> m.family, m.cluster, 0 <= m.fraction < 1
        ('mlp', 'cpu-local', True)
    """
    nodes = (frontier_file.graph or {}).get("nodes") or []
    family = model_family(row[1] for row in nodes if isinstance(row, (list, tuple)) and len(row) > 1)
    cluster = cluster_name(frontier_file.job.get("cluster"))
    found = load_time_errors().error(cluster, family)
    launches = [s for s in found.source.split("; ") if s]
    source = (found.source if len(launches) < 2 else
              f"{found.plans} plans over {len(launches)} launches, the newest {launches[-1]}")
    return Margin(found.error, family, cluster, source)


def cluster_name(cluster) -> str:
    """The name of a job's ``cluster`` entry: a profile name, a YAML path's stem, or a mapping's ``name``.

    Example:
        >>> cluster_name("cpu-local"), cluster_name("clusters/h100x8.yaml"), cluster_name({"name": "x"})
        ('cpu-local', 'h100x8', 'x')
    """
    if isinstance(cluster, dict):
        return str(cluster.get("name", ""))
    text = str(cluster or "")
    return text.rsplit("/", 1)[-1].removesuffix(".yaml").removesuffix(".yml")


def _margin(frontier_file: FrontierFile, margin: float | str | None) -> Margin | None:
    if margin is None:
        return None
    if margin == "auto":
        return frontier_margin(frontier_file)
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1:
        raise ValueError(f"margin must be 'auto' or a fraction in [0, 1), got {margin!r}")
    return Margin(float(margin), source="--margin") if margin > 0 else None


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


def _with_transient(plan: Plan) -> str:
    """``, X of memory + Y transient`` where a plan's peak exceeds its memory, else nothing."""
    if plan.largest_transient_bytes <= 0:
        return ""
    return (f", its peak: {format_size(plan.memory_bytes)} of memory + its largest transient "
            f"{format_size(plan.largest_transient_bytes)}")


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
        f_min, p_min = min(plans, key=lambda fp: (fp[1].peak_memory_bytes, fp[1].time_s))
        min_memory = p_min.peak_memory_bytes
        lines.append(f"The smallest memory any plan needs there is {format_size(min_memory)} "
                     f"({min_memory:.0f} bytes; plan {p_min.id} on {f_min.devices} devices, "
                     f"{p_min.time_s:.4g} s/step{_with_transient(p_min)}).")
        if budget is not None:
            by_memory = [p for _, p in plans if p.memory_bytes <= budget < p.peak_memory_bytes]
            if by_memory:
                p = min(by_memory, key=lambda q: q.time_s)
                lines.append(f"{len(by_memory)} plan(s) fit by their memory alone but not at their peak: "
                             f"{p.id} needs {format_size(p.memory_bytes)} + its largest transient "
                             f"{format_size(p.largest_transient_bytes)} (a recompute chain's or a "
                             f"checkpointed block's activations rebuilt during backward, a loss chunk, or a "
                             f"communication buffer) = "
                             f"{format_size(p.peak_memory_bytes)}.")
        if max_time_s is not None:
            f_fast, p_fast = min(plans, key=lambda fp: fp[1].time_s)
            lines.append(f"The fastest plan there takes {p_fast.time_s:.4g} s/step ({p_fast.id}).")
    others = sorted((f for f in frontier_file.frontiers if any(fits(p) for p in f.plans)),
                    key=lambda f: f.devices)
    fitting = others[0].devices if others else None
    if fitting is not None:
        best = min((p for p in others[0].plans if fits(p)), key=lambda p: p.time_s)
        peak = format_size(best.peak_memory_bytes)
        lines.append(f"{fitting} devices would fit: plan {best.id} needs {peak} "
                     f"per device at its peak and {best.time_s:.4g} s/step (use --devices {fitting}).")
    else:
        planned = ", ".join(str(f.devices) for f in frontier_file.frontiers)
        lines.append(f"No planned device count fits (planned: {planned}); raise the memory budget"
                     + (" or the time limit" if max_time_s is not None else "")
                     + " or plan for more devices.")
    return NoFeasiblePlan(" ".join(lines), devices=devices, memory_budget_bytes=budget, max_time_s=max_time_s,
                          min_memory_bytes=min_memory, fitting_devices=fitting)
