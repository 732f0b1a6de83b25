"""pytest, repository-wide: the docstrings' ``Example:`` blocks of tensoropt/, frontier/ and
estimators/ run as doctests (as ``--doctest-modules`` would, but only there: the tests' helper
modules and their several ``conftest.py`` files are no doctest modules). An example that cannot
run here says why beside its ``# doctest: +SKIP``."""

from __future__ import annotations

from pathlib import Path

from _pytest.doctest import DoctestModule

PACKAGES = tuple(Path(__file__).resolve().parent / name for name in ("tensoropt", "frontier", "estimators"))


def pytest_collect_file(file_path: Path, parent):
    """Collect each module of the three packages as a doctest module."""
    if file_path.suffix == ".py" and any(file_path.is_relative_to(p) for p in PACKAGES):
        return DoctestModule.from_parent(parent, path=file_path)
    return None
