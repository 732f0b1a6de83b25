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


def command_parser(subparsers, name: str, doc: str | None, help: str):
    """Add subcommand ``name`` whose ``--help`` shows the module docstring ``doc`` as written.

    Example:
        >>> import argparse
        >>> sub = argparse.ArgumentParser().add_subparsers()
        >>> command_parser(sub, "demo", "Demo.", help="a demo").prog.endswith("demo")
        True
    """
    import argparse

    return subparsers.add_parser(name, help=help, description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
