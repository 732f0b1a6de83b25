"""pytest, repository-wide: the docstrings' ``Example:`` blocks of tensoropt/, frontier/ and
estimators/ run as doctests (as ``--doctest-modules`` would, but only there: the tests' helper
modules and their several ``conftest.py`` files are no doctest modules). An example that cannot
run here says why beside its ``# doctest: +SKIP``. Fixtures every test folder may use:
:func:`one_process_group`."""

from __future__ import annotations

from pathlib import Path

import pytest
from _pytest.doctest import DoctestModule

PACKAGES = tuple(Path(__file__).resolve().parent / name for name in ("tensoropt", "frontier", "estimators"))


def pytest_collect_file(file_path: Path, parent):
    """Collect each module of the three packages as a doctest module."""
    if file_path.suffix == ".py" and any(file_path.is_relative_to(p) for p in PACKAGES):
        return DoctestModule.from_parent(parent, path=file_path)
    return None


@pytest.fixture(scope="module")
def one_process_group(tmp_path_factory):
    """A gloo process group of this one process, for a test module's plans on a one-device mesh (their
    parameters and gradients are DTensors, as on every rank of a run)."""
    import torch.distributed as dist

    from tensoropt.executor.state.worker import end_process_group

    store = tmp_path_factory.mktemp("group") / "store"
    dist.init_process_group("gloo", store=dist.FileStore(str(store), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        end_process_group()
