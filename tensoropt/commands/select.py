"""``tensoropt select DIR/frontier.json --devices N --memory-budget 16GiB``: pick and write a plan.

Prints the chosen plan, writes it to PLAN.json (default: ``plan.json`` beside the frontier
file) and records it as ``selected`` in the frontier file. Exit code 2 when no plan fits.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tensoropt.commands import CommandError, command_parser
from tensoropt.config import SELECT_RULES, SIZE_FORM, format_size, parse_size
from tensoropt.plans import load_frontier_file, write_selection
from tensoropt.selector import Selection, margin_line, select
from tensoropt.tables import format_time, throughput


def add_parser(subparsers) -> None:
    """Add the ``select`` subcommand."""
    p = command_parser(subparsers, "select", __doc__,
                       help="select a plan from a frontier file under a memory budget")
    p.add_argument("frontier", help="frontier.json written by `tensoropt plan` (or its folder)")
    p.add_argument("--devices", default=None,
                   help="device count N, or 'auto' (visible GPUs, else --nproc); default: any planned count")
    p.add_argument("--nproc", type=int, default=None,
                   help="local process count used by --devices auto where there is no GPU")
    p.add_argument("--memory-budget", default=None,
                   help="per-device budget, e.g. 16GiB or 17179869184 (default: the job's memory_budget)")
    p.add_argument("--rule", choices=SELECT_RULES, default=None,
                   help="selection rule (default: the job's select)")
    p.add_argument("--max-time-s", type=float, default=None, help="step-time limit in seconds")
    p.add_argument("--margin", default="auto",
                   help="keep the simpler plan (data parallelism first, then fewer redistributions) "
                        "unless the rule's plan predicts a larger gain over it than this fraction; "
                        "'auto' (default): the estimator's measured step-time error for the model's "
                        "family (configs/time_errors.yaml); 0: off")
    p.add_argument("-o", "--output", default=None,
                   help="plan file to write (default: plan.json beside the frontier file)")


def resolve_devices(value: str | int | None, nproc: int | None) -> int | None:
    """``--devices``: an integer, ``auto`` (visible GPUs, else ``nproc``), or None.

    Example:
        >>> resolve_devices("8", None), resolve_devices(None, None)
        (8, None)
    """
    if value is None:
        return None
    if str(value) == "auto":
        try:
            import torch

            gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        except ImportError:
            gpus = 0
        if gpus > 0:
            return gpus
        if nproc is None:
            raise CommandError("--devices auto found no GPU here; give the local process "
                             "count with --nproc N (or --devices N)")
        return nproc
    try:
        devices = int(value)
    except ValueError:
        raise CommandError(f"--devices must be a positive integer or 'auto', got {value!r}") from None
    if devices < 1:
        raise CommandError(f"--devices must be >= 1, got {devices}")
    return devices


def budget_bytes(value: str | None, job: dict) -> int | None:
    """``--memory-budget`` parsed, else the job's ``memory_budget`` (None: no limit)."""
    if value is None:
        return job.get("memory_budget")
    try:
        return parse_size(value)
    except ValueError as e:
        raise CommandError(f"--memory-budget: {e} (expected {SIZE_FORM})") from None


def frontier_path(arg: str) -> Path:
    """The frontier file named by an argument that may be the file or its folder."""
    path = Path(arg)
    return path / "frontier.json" if path.is_dir() else path


def margin_arg(value: str | float | None) -> str | float:
    """``--margin``: ``auto`` or a fraction in [0, 1).

    Example:
        >>> margin_arg("auto"), margin_arg("0.05"), margin_arg(None)
        ('auto', 0.05, 'auto')
    """
    if value is None or str(value) == "auto":
        return "auto"
    try:
        fraction = float(value)
    except ValueError:
        fraction = -1.0
    if not 0 <= fraction < 1:
        raise CommandError(f"--margin must be 'auto' or a fraction in [0, 1) (e.g. 0.05), got {value!r}")
    return fraction


def describe(selection: Selection, global_batch_size: int | None) -> str:
    """Lines on a selected plan (id, devices, mesh, time, memory, throughput; split; the margin)."""
    p, f = selection.plan, selection.frontier
    tput = throughput(p, global_batch_size)
    mesh = "x".join(map(str, f.mesh.shape)) or "1"
    line = (f"selected {p.id} ({selection.rule}) on {f.devices} devices (mesh {mesh}): "
            f"{format_time(p.time_s)}/step, {format_size(p.memory_bytes)} per device")
    if tput is not None:
        line += f", {tput:,.1f} samples/s"
    line += f"\n  split: {p.summary}" if p.summary else ""
    return line + f"\n  {margin_line(selection.to_json())}"


def run(args: argparse.Namespace) -> int:
    """Select, print, write plan.json, record ``selected``."""
    path = frontier_path(args.frontier)
    ff = load_frontier_file(path)
    devices = resolve_devices(args.devices, args.nproc)
    budget = budget_bytes(args.memory_budget, ff.job)
    rule = args.rule or ff.job.get("select", "fastest")
    selection = select(ff, memory_budget_bytes=budget, devices=devices, rule=rule, max_time_s=args.max_time_s,
                       margin=margin_arg(getattr(args, "margin", "auto")))
    plan_path = Path(args.output) if args.output else path.parent / "plan.json"
    write_selection(ff, selection.plan.id, path, plan_path, selection.to_json())
    print(describe(selection, ff.job.get("training", {}).get("global_batch_size")))
    print(f"wrote {plan_path}; recorded as selected in {path}")
    return 0
