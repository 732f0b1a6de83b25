"""docs/user-guide.md stays the reference of what exists: its job-file table names every key
tensoropt.config accepts and no other, and every option of every command is in the guide."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

from tensoropt import config
from tensoropt.cli import build_parser

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "user-guide.md"

NOT_OURS = {"--help", "--standalone", "--rdzv-id"}
"""Options the guide names that are not a tensoropt command's: ``tensoropt --help`` and torchrun's own."""


def _sections() -> dict[str, type]:
    """Job field -> the dataclass of its section (model, training, ..., lr_scheduler: LrSchedulerConfig)."""
    return {f.name: cls for f in dataclasses.fields(config.Job)
            for cls in [getattr(config, "".join(w.capitalize() for w in f.name.split("_")) + "Config", None)]
            if cls is not None}


def _schema_keys() -> set[str]:
    """Every key a job file may hold, as dotted paths (``training.seed``)."""
    sections = _sections()
    keys = set()
    for f in dataclasses.fields(config.Job):
        keys.add(f.name)
        if f.name in sections:
            keys |= {f"{f.name}.{g.name}" for g in dataclasses.fields(sections[f.name])}
    return keys


def _reference_keys() -> set[str]:
    """The keys of the guide's job-file table (the first table under "The job file (reference)",
    its first column)."""
    text = GUIDE.read_text()
    start = text.index("| key | form | default | meaning |", text.index("## The job file (reference)"))
    table = text[start:text.index("\n\n", start)]
    keys = set()
    for line in table.splitlines()[2:]:
        keys |= set(re.findall(r"`([a-z_.]+)`", line.split(" | ")[0]))
    return keys


def test_the_job_reference_table_names_every_key_and_no_other():
    documented, accepted = _reference_keys(), _schema_keys()
    sections = set(_sections())
    # a section may be documented as a whole (``data``: {factory, kwargs}) or key by key
    missing = {k for k in accepted - documented
               if not (k in sections and any(d.startswith(k + ".") for d in documented))
               and k.split(".")[0] not in documented}
    assert not missing, f"docs/user-guide.md's job-file table lacks {sorted(missing)}"
    stale = documented - accepted
    assert not stale, f"docs/user-guide.md's job-file table names keys config.py refuses: {sorted(stale)}"


def _command_options() -> dict[str, set[str]]:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: {s for a in sub._actions for s in a.option_strings if s.startswith("--") and s != "--help"}
            for name, sub in subparsers.choices.items()}


def test_every_command_option_is_in_the_guide_and_the_guide_names_no_other():
    text = GUIDE.read_text()
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))
    options = _command_options()
    missing = {f"{cmd} {o}" for cmd, opts in options.items() for o in opts if o not in named}
    assert not missing, f"docs/user-guide.md does not mention {sorted(missing)}"
    stale = named - set().union(*options.values()) - NOT_OURS
    assert not stale, f"docs/user-guide.md names options no tensoropt command has: {sorted(stale)}"
