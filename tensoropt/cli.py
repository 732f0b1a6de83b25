"""The ``tensoropt`` command line: subcommands from the modules of ``tensoropt/commands/``.

Each command module defines ``add_parser(subparsers)`` and ``run(args) -> int`` (the exit
code). A module that does not exist yet is skipped; one that fails to import still shows in
``--help`` and explains the failure when invoked, so one broken command never breaks the others.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from types import ModuleType

COMMANDS = ("plan", "select", "explain", "run", "export", "calibrate", "plot", "ui")
"""Command modules, in the order ``--help`` lists them."""

EXIT_ERROR = 1
"""Exit code for bad input (job file, plan file, arguments)."""


def _load_command(name: str) -> tuple[ModuleType | None, str | None]:
    """Import ``tensoropt.commands.<name>``: (module, None), (None, None) if absent, (None, error)."""
    module_name = f"tensoropt.commands.{name}"
    try:
        return importlib.import_module(module_name), None
    except ModuleNotFoundError as e:
        if e.name == module_name:
            return None, None
        return None, f"{type(e).__name__}: {e}"
    except Exception as e:  # a broken command must not break the others
        return None, f"{type(e).__name__}: {e}"


def command_available(name: str) -> bool:
    """Whether ``tensoropt <name>`` exists and imports.

    Example:
        >>> command_available("select"), command_available("no-such-command")
        (True, False)
    """
    return _load_command(name)[0] is not None


def _unavailable(name: str, error: str):
    def run(args: argparse.Namespace) -> int:
        print(f"tensoropt {name}: this command is unavailable here ({error})", file=sys.stderr)
        return EXIT_ERROR

    return run


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available subcommand.

    Example:
        >>> "plan" in build_parser().format_help()
        True
    """
    from tensoropt import __version__

    parser = argparse.ArgumentParser(
        prog="tensoropt",
        description="Multi-objective auto-parallel planner for PyTorch training: plan the time/memory "
                    "Pareto frontier of parallel plans, select one under a memory budget, run it.",
    )
    parser.add_argument("--version", action="version", version=f"tensoropt {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module, error = _load_command(name)
        before = set(subparsers.choices)
        if module is not None:
            try:
                module.add_parser(subparsers)
            except Exception as e:  # noqa: BLE001 - reported when the command is used
                error = f"{type(e).__name__} in add_parser: {e}"
        added = set(subparsers.choices) - before
        if error is not None and name not in subparsers.choices:
            sub = subparsers.add_parser(name, help=f"(unavailable: {error})", add_help=False)
            sub.add_argument("rest", nargs=argparse.REMAINDER)
            sub.set_defaults(_run=_unavailable(name, error))
        else:
            for cmd in added:
                subparsers.choices[cmd].set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Console entry point (``tensoropt = tensoropt.cli:main``); returns the exit code.

    Bad input (job file, plan file, a device count that was not planned) prints one
    ``tensoropt: error: ...`` line and returns 1; no feasible plan returns 2.

    Example:
        >>> main(["select", "no/such/frontier.json"])  # its one error line goes to stderr
        1
    """
    from tensoropt.commands import CommandError
    from tensoropt.config import ConfigError
    from tensoropt.plans import PlanFileError
    from tensoropt.selector import EXIT_NO_FEASIBLE_PLAN, DeviceCountNotPlanned, NoFeasiblePlan

    parser = build_parser()
    args = parser.parse_args(argv)
    run = getattr(args, "_run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    try:
        return int(run(args) or 0)
    except NoFeasiblePlan as e:
        print(f"tensoropt {args.command}: {e}", file=sys.stderr)
        return EXIT_NO_FEASIBLE_PLAN
    except (CommandError, ConfigError, PlanFileError, DeviceCountNotPlanned) as e:
        print(f"tensoropt {args.command}: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:  # e.g. `tensoropt explain plan.json | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"tensoropt {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
