"""``tensoropt plan JOB.yaml --out DIR``: plan every device count, select, write the files.

Captures the model, builds a cost graph and solves the exact time/memory Pareto frontier for
every device count of the job (a progress bar on stderr), selects a plan by the job's rule
under its memory budget, prints a table per frontier and writes ``DIR/frontier.json``,
``DIR/plan.json`` (the selected plan) and ``DIR/pareto.html`` (the interactive plot). Exit
code 2 when no plan fits the budget (frontier.json and the plot are still written).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tensoropt.commands import CommandError, command_parser
from tensoropt.config import SELECT_RULES, Job, load_job
from tensoropt.plans import FrontierFile, frontier_file_text, plan_file_text, write_text_atomic
from tensoropt.selector import EXIT_NO_FEASIBLE_PLAN, NoFeasiblePlan, Selection, select
from tensoropt.tables import frontier_table


def add_parser(subparsers) -> None:
    """Add the ``plan`` subcommand."""
    p = command_parser(subparsers, "plan", __doc__,
                       help="plan the Pareto frontier of a job for every device count")
    p.add_argument("job", help="job YAML (see docs/user-guide.md)")
    p.add_argument("--out", default=None, help="output folder (default: out/<job file name>)")
    p.add_argument("--devices", default=None, help="override the job's device counts, e.g. 1,2,4,8")
    p.add_argument("--memory-budget", default=None, help="override the job's memory_budget, e.g. 16GiB")
    p.add_argument("--rule", choices=SELECT_RULES, default=None, help="override the job's select rule")
    p.add_argument(
        "--epsilon",
        type=_epsilon,
        default=None,
        help="override planner.epsilon (auto = at most planner.max_plans plans per device count; "
        "0 = exact; e.g. 0.01 for a (1+eps)-approximate frontier)",
    )
    p.add_argument("--rows", type=int, default=12, help="plans shown per frontier table (0 = all)")
    p.add_argument("--no-plot", action="store_true", help="do not write pareto.html")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _epsilon(text: str) -> str | float:
    """``--epsilon``'s value: ``auto`` or a number."""
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or a number, got {text!r}") from None


def bound_line(ff: FrontierFile) -> str:
    """What the listed plans are: the exact frontier, or within the proven bound of it.

    Example:
        >>> from tensoropt.plans import Frontier, FrontierFile
        >>> from tensoropt.configspace.configuration import Mesh
        >>> f = Frontier(2, Mesh((2,), ("gpu",)), [], epsilon_bound=0.008)
        >>> bound_line(FrontierFile(job={}, frontiers=[f]))
        'plans (every exact Pareto-optimal plan within 0.8 % of a listed one in time and memory)'
    """
    bounds = [f.epsilon_bound for f in ff.frontiers if f.epsilon_bound is not None]
    if not bounds:
        epsilon = ff.job.get("planner", {}).get("epsilon", 0.0)
        return "Pareto-optimal plans" if not epsilon else f"plans ((1+{epsilon:g})-approximate frontiers)"
    if max(bounds) == 0:
        return "Pareto-optimal plans (the exact frontiers)"
    return (f"plans (every exact Pareto-optimal plan within {100 * max(bounds):.2g} % of a listed one "
            "in time and memory)")


def job_with_overrides(path: str, args: argparse.Namespace) -> Job:
    """Load the job and apply the command-line overrides (validated like the file)."""
    job = load_job(path)
    if args.devices is None and args.memory_budget is None and args.rule is None and args.epsilon is None:
        return job
    data = job.to_dict()
    if args.devices is not None:
        try:
            data["devices"] = [int(d) for d in str(args.devices).split(",") if d.strip()]
        except ValueError:
            raise CommandError(
                f"--devices: expected comma-separated integers, got {args.devices!r}"
            ) from None
    if args.memory_budget is not None:
        data["memory_budget"] = args.memory_budget
    if args.rule is not None:
        data["select"] = args.rule
    if args.epsilon is not None:
        data["planner"]["epsilon"] = args.epsilon
    return Job.from_dict(data, f"{path} (with command-line overrides)")


def select_for_job(ff: FrontierFile) -> tuple[Selection | None, NoFeasiblePlan | None]:
    """Select by the resolved job's rule, budget and time limit over every planned device count."""
    job = ff.job
    try:
        selection = select(
            ff,
            memory_budget_bytes=job.get("memory_budget"),
            rule=job.get("select", "fastest"),
            max_time_s=job.get("max_time_s"),
        )
    except NoFeasiblePlan as e:
        return None, e
    return selection, None


def write_outputs(ff: FrontierFile, out: Path, job_path: str, plot: bool) -> list[Path]:
    """Write frontier.json, plan.json (when a plan is selected) and pareto.html; return the paths."""
    from tensoropt.planner import frozen_heap

    with frozen_heap():  # the plans' rows are many small objects: no full collection walks them all
        data = ff.to_json(shared=True)  # the file's form: rows the plans share stored once
        text = frontier_file_text(data)
    written = [out / "frontier.json"]
    write_text_atomic(written[0], text)
    plan_path = out / "plan.json"
    if ff.selected is not None:
        write_text_atomic(plan_path, plan_file_text(data, ff.selected))
        written.append(plan_path)
    elif plan_path.exists():
        plan_path.unlink()  # a stale plan of an earlier run must not be taken for this one
    if plot:
        try:
            from tensoropt.plot import pareto_html
        except ImportError:
            pareto_html = None
        if pareto_html is not None:
            html_path = out / "pareto.html"
            write_text_atomic(html_path, pareto_html(data, ff.job.get("memory_budget"), job_path))
            written.append(html_path)
    return written


def run(args: argparse.Namespace) -> int:
    """Plan, select, print the tables, write the files."""
    from tensoropt.commands.select import describe
    from tensoropt.planner import PlanningError, plan_job
    from tensoropt.progress import ProgressBar

    job = job_with_overrides(args.job, args)
    out = Path(args.out) if args.out else Path("out") / Path(args.job).stem
    bar = ProgressBar(enabled=not args.quiet)
    start = time.perf_counter()
    try:
        ff = plan_job(job, progress=bar)
    except PlanningError as e:
        bar.close()
        raise CommandError(f"{args.job}: {e}") from None
    bar.close()
    elapsed = time.perf_counter() - start
    selection, infeasible = select_for_job(ff)
    ff.selected = selection.plan.id if selection else None
    batch = ff.job["training"]["global_batch_size"]
    for frontier in ff.frontiers:
        print(frontier_table(frontier, batch, ff.selected, max_rows=args.rows or None))
        print()
    plans = sum(len(f.plans) for f in ff.frontiers)
    print(f"planned {len(ff.frontiers)} device counts, {plans} {bound_line(ff)} in {elapsed:.1f} s")
    written = write_outputs(ff, out, args.job, plot=not args.no_plot)
    if selection is not None:
        print(describe(selection, batch))
    print("wrote " + ", ".join(str(p) for p in written))
    if infeasible is not None:
        print(f"tensoropt plan: {infeasible}", file=sys.stderr)
        return EXIT_NO_FEASIBLE_PLAN
    return 0
