"""Subcommands of the ``tensoropt`` CLI, one module each (see :mod:`tensoropt.cli`).

Each module defines ``add_parser(subparsers)`` (adds its subparser) and ``run(args) -> int``
(the exit code).
"""


class CommandError(ValueError):
    """Bad command-line input; the CLI prints ``tensoropt <command>: error: <message>`` and exits 1.

    Example:
        >>> str(CommandError("--devices must be >= 1, got 0"))
        '--devices must be >= 1, got 0'
    """
