"""``tensoropt explain PLAN.json``: the per-operator table of a plan, its memory per device layer by
layer (:mod:`tensoropt.commands.explain_memory`) and its redistributions.

Also ``tensoropt explain DIR/frontier.json --id d8-p3`` for any plan of a frontier file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from tensoropt.commands import CommandError, command_parser
from tensoropt.commands.explain_memory import memory_table
from tensoropt.config import format_size
from tensoropt.plans import FrontierFile, PlanFile, PlanFileError, plan_file_text
from tensoropt.tables import format_time, layers_table, redistributions_table


def add_parser(subparsers) -> None:
    """Add the ``explain`` subcommand."""
    p = command_parser(subparsers, "explain", __doc__,
                       help="per-operator table of a plan (configs, times, memory)")
    p.add_argument("plan", help="plan.json (from `tensoropt plan` or `select`), or a frontier.json with --id")
    p.add_argument("--id", dest="plan_id", default=None, help="plan id when PLAN is a frontier.json")
    p.add_argument("--sort", choices=("graph", "time", "memory"), default="graph",
                   help="row order: graph order (default), or by descending time or memory")


def load_plan(path: str, plan_id: str | None) -> PlanFile:
    """A plan file, or plan ``plan_id`` (default: the selected one) of a frontier file."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or "frontiers" not in data:
        return PlanFile.from_json(data, path)
    ff = FrontierFile.from_json(data, path)
    if plan_id is None:
        if ff.selected is None:
            example = ff.frontiers[0].plans[0].id if ff.frontiers and ff.frontiers[0].plans else "d1-p0"
            raise CommandError(f"{path}: a frontier file with no selected plan; add --id {example}")
        plan_id = ff.selected
    return PlanFile.from_json(json.loads(plan_file_text(data, plan_id)), f"{path} ({plan_id})")


def plan_units_line(plan) -> str:
    """The plan's step in the user's units: micro-batches, samples/s, tokens/s per device, MFU.

    Example:
        >>> from tensoropt.plans import Plan
        >>> plan_units_line(Plan("d8-p0", 0.5, 8, {}, throughput_samples_per_s=32.0, micro_batches=4,
        ...                      tokens_per_s_per_device=8192.0, mfu=0.4))
        'micro-batches: 4 per step; 32.0 samples/s, 8,192 tokens/s per device, predicted MFU 40.0%'
    """
    parts = [f"micro-batches: {plan.micro_batches} per step"]
    if plan.throughput_samples_per_s is not None:
        parts.append(f"; {plan.throughput_samples_per_s:,.1f} samples/s")
    if plan.tokens_per_s_per_device is not None:
        parts.append(f", {plan.tokens_per_s_per_device:,.0f} tokens/s per device")
    if plan.mfu is not None:
        parts.append(f", predicted MFU {100 * plan.mfu:.1f}%")
    return "".join(parts)


def explain_text(plan_file: PlanFile, sort: str = "graph") -> str:
    """The full explanation: header, per-operator table, totals, redistributions.

    Example:
        >>> from tensoropt.plans import Plan
        >>> from tensoropt.configspace.configuration import Mesh
        >>> "d1-p0" in explain_text(PlanFile(Plan("d1-p0", 1.0, 8, {}), 1, Mesh((), ()), {}, {}))
        True
    """
    plan = plan_file.plan
    if sort in ("time", "memory"):
        layer_key = (lambda x: -(x.compute_s + x.comm_s)) if sort == "time" else (lambda x: -x.memory_bytes)
        redist_key = (lambda r: -r.time_s) if sort == "time" else (lambda r: -r.memory_bytes)
        plan = dataclasses.replace(plan, layers=sorted(plan.layers, key=layer_key),
                                   redistributions=sorted(plan.redistributions, key=redist_key))
        plan_file = dataclasses.replace(plan_file, plan=plan)
    mesh = "x".join(map(str, plan_file.mesh.shape)) or "1"
    lines = [f"plan {plan.id} on {plan_file.devices} devices (mesh {mesh}, levels "
             f"{','.join(plan_file.mesh.levels) or '-'}): {format_time(plan.time_s)}/step, "
             f"{format_size(plan.memory_bytes)} per device"]
    lines.append(plan_units_line(plan))
    if plan.summary:
        lines.append(f"split: {plan.summary}")
    if plan_file.selection:  # how a selector chose it: the rule, the margin and the gain
        from tensoropt.selector import margin_line

        rule = plan_file.selection.get("rule", "?")
        lines.append(f"selected by rule {rule}: {margin_line(plan_file.selection)}")
    if plan.pipeline:  # issue 27: the stages, their devices, in-flight micro-batches and memory
        from tensoropt.pipeline.search import stages_text

        lines.append(stages_text(plan))
    lines.append("")
    if plan.layers:
        lines.append(layers_table(plan_file))
        compute = sum(x.compute_s for x in plan.layers)
        comm = sum(x.comm_s for x in plan.layers)
        memory = sum(x.memory_bytes for x in plan.layers)
        lines.append(f"operators: {len(plan.layers)}; compute {format_time(compute)}, communication inside "
                     f"operators {format_time(comm)}, memory {format_size(memory)}")
        lines.append("")
        lines.append(memory_table(plan_file))
    else:
        lines.append("(this plan has no per-operator breakdown)")
    lines.append("")
    if plan.redistributions:
        lines.append(f"redistributions between operators ({len(plan.redistributions)}):")
        lines.append(redistributions_table(plan_file))
        lines.append(f"total redistribution time {format_time(sum(r.time_s for r in plan.redistributions))}")
    else:
        lines.append("redistributions between operators: none (every consumer reads its producer's layout)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Print the explanation of a plan."""
    try:
        plan_file = load_plan(args.plan, args.plan_id)
    except OSError as e:
        raise PlanFileError(f"{args.plan}: cannot read: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise PlanFileError(f"{args.plan}: invalid JSON ({e})") from None
    print(explain_text(plan_file, args.sort))
    return 0
