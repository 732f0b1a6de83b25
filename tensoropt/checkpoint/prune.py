"""The one rule that deletes old checkpoints (``--keep-checkpoints K``), whatever layout wrote them.

Every runtime writes one ``step-<n>`` folder per checkpoint under one directory; the layouts differ
only in how a folder is named and how it shows that its save finished (a :class:`StepLayout`):

* the executor's worker (:mod:`tensoropt.checkpoint.dcp_io`): ``step-00000012/``, complete when its
  ``manifest.json`` is readable and matches its files
  (:data:`tensoropt.checkpoint.manifest.MANIFEST_LAYOUT`);
* the trainer's loop and the pipelined runtime (:mod:`tensoropt.checkpoint.trainer_format`):
  ``step-12/``, complete once ``trainer.json`` is written
  (:func:`~tensoropt.checkpoint.trainer_format.trainer_layout`).

Once step ``s``'s checkpoint is complete, :func:`prune_step_folders` keeps the newest ``K`` complete
folders of steps ``<= s`` and deletes every other folder of an earlier step (older complete ones,
and incomplete ones: saves cut short). Folders of later steps, and folders of another layout, are
left alone. Imports no torch, so a worker pays nothing for it.

Example:
    >>> import tempfile; d = Path(tempfile.mkdtemp())
    >>> layout = StepLayout("demo", lambda p: int(p.name[5:]) if p.name[5:].isdigit() else None,
    ...                     lambda p: (p / "done").is_file())
    >>> for n in (1, 2, 3):
    ...     (d / f"step-{n}").mkdir(); _ = (d / f"step-{n}" / "done").write_text("")
    >>> [p.name for p in prune_step_folders(d, 3, 1, layout)], [n for n, _ in step_folders(d, layout)]
    (['step-1', 'step-2'], [3])
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

STEP_PREFIX = "step-"
"""Every layout's folder names start so."""


@dataclass(frozen=True)
class StepLayout:
    """How one runtime names its checkpoint folders and tells a complete one."""

    name: str
    """Said in messages: ``"manifest"``, ``"trainer"``."""
    folder_step: Callable[[Path], int | None]
    """The step a ``step-*`` folder holds, or None when the folder is not of this layout."""
    is_complete: Callable[[Path], bool]
    """Whether the folder's save finished (it may be loaded)."""


def step_folders(directory: str | Path, layout: StepLayout) -> list[tuple[int, Path]]:
    """The folders of ``layout`` under ``directory`` (complete or not), as (step, path) by step.

    Example:
        >>> step_folders("/nonexistent", StepLayout("x", lambda p: 0, lambda p: True))
        []
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for path in directory.glob(STEP_PREFIX + "*"):
        step = layout.folder_step(path) if path.is_dir() else None
        if step is not None:
            found.append((step, path))
    return sorted(found)


def prune_step_folders(directory: str | Path, step: int, keep: int, layout: StepLayout) -> list[Path]:
    """Once ``step``'s checkpoint is complete, delete ``layout``'s folders of earlier steps beyond the
    newest ``keep`` complete ones of steps ``<= step``, and its incomplete ones of earlier steps;
    ``keep`` 0 keeps every folder. Returns the folders deleted (see the module's example).

    Args:
        directory: the checkpoint directory.
        step: the step whose checkpoint was just completed.
        keep: complete checkpoints to keep (``--keep-checkpoints``); 0 keeps all.
        layout: which folders count, and which are complete.
    """
    if keep <= 0:
        return []
    folders = step_folders(directory, layout)
    complete = [path for n, path in folders if n <= step and layout.is_complete(path)]
    kept = set(complete[-keep:])
    deleted = [path for n, path in folders if n < step and path not in kept]
    for path in deleted:
        shutil.rmtree(path, ignore_errors=True)
    return deleted
