"""The checkpoint layout both trainers write, so a run resumes across runtimes.

``tensoropt run``'s loop (:mod:`tensoropt.training.loop`, a parallelized model) and the pipelined
runtime (:mod:`tensoropt.pipeline_runtime.checkpoint`, one stage per rank) write the same folder:
``step-<n>/`` with DCP's shards of ``{"model": ..., "optim": ...}`` under the model's own parameter
names, the optimizer state *flattened per parameter name* (:data:`FLAT_OPTIMIZER`:
``optim.state.<name>.exp_avg``, ``optim.param_groups.<name>.lr``: no key depends on how the
parameters are grouped or which stage holds them), and :data:`TRAINER_STATE` written last. So a
checkpoint of a pipelined plan resumes under a plan without stages, at another device count, and
the other way round.

Checkpoints of the loop written before this layout keep the optimizer's groups by index
(``optim.param_groups.0.lr``); :func:`optimizer_options` tells which layout a folder holds, and
loading reads either. Both runtimes keep the newest ``--keep-checkpoints`` complete folders
(:func:`prune_checkpoints`) by the rule the executor's worker keeps its own by
(:mod:`tensoropt.checkpoint.prune`).

Example:
    >>> from tensoropt.checkpoint.trainer_format import FLAT_OPTIMIZER
    >>> FLAT_OPTIMIZER.flatten_optimizer_state_dict
    True
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from tensoropt.checkpoint.prune import STEP_PREFIX, StepLayout, prune_step_folders

TRAINER_STATE = "trainer.json"
"""Inside each checkpoint folder, beside the DCP shards: the step, the scheduler's state (null when
the schedule is a function of the step alone, as a pipelined run writes it), the data position and
fp16-mixed's loss scale (written last: a folder without it is incomplete and ignored)."""

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

# FLAT_OPTIMIZER, the ``get_state_dict`` / ``set_state_dict`` options of the shared layout, is made on
# first use (:func:`flat_optimizer`): ``torch.distributed.checkpoint`` loads only in a run that saves
# or resumes.


@functools.cache
def flat_optimizer() -> StateDictOptions:
    """:data:`FLAT_OPTIMIZER`: the optimizer state flattened per parameter name (one object).

    Example:
        >>> from tensoropt.checkpoint.trainer_format import FLAT_OPTIMIZER
        >>> flat_optimizer() is FLAT_OPTIMIZER, FLAT_OPTIMIZER.flatten_optimizer_state_dict
        (True, True)
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def __getattr__(name: str):
    if name == "FLAT_OPTIMIZER":
        return flat_optimizer()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_GROUPS = "optim.param_groups."

_MANIFEST = "manifest.json"  # the executor's worker's checkpoints (step-00000004/): not this layout's


def optimizer_options(folder: str | Path) -> StateDictOptions:
    """The ``get_state_dict`` / ``set_state_dict`` options that read ``folder``'s optimizer state:
    :data:`FLAT_OPTIMIZER`, or the default ones for a folder whose groups are kept by index.

    Example:
        >>> import tempfile, torch, torch.distributed.checkpoint as dcp
        >>> from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
        >>> m = torch.nn.Linear(2, 2); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        >>> folders = [tempfile.mkdtemp(), tempfile.mkdtemp()]
        >>> for folder, options in zip(folders, (StateDictOptions(), flat_optimizer())):
        ...     model_sd, optim_sd = get_state_dict(m, opt, options=options)
        ...     _ = dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder)
        >>> [optimizer_options(f).flatten_optimizer_state_dict for f in folders]
        [False, True]
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    keys = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    groups = [k.removeprefix(_GROUPS).split(".") for k in keys if k.startswith(_GROUPS)]
    by_index = bool(groups) and all(len(g) == 2 and g[0].isdigit() for g in groups)
    return StateDictOptions() if by_index else flat_optimizer()


def trainer_layout(complete_files: tuple[str, ...] = (TRAINER_STATE,)) -> StepLayout:
    """The trainers' folders for :func:`tensoropt.checkpoint.prune.prune_step_folders`: ``step-<n>``
    (no leading zeros, no ``manifest.json``: the executor's worker's folders are another layout),
    complete when one of ``complete_files`` is written.

    Example:
        >>> layout = trainer_layout()
        >>> [layout.folder_step(Path(name)) for name in ("step-12", "step-00000012", "step-x")]
        [12, None, None]
    """

    def folder_step(path: Path) -> int | None:
        digits = path.name.removeprefix(STEP_PREFIX)
        if digits.isdigit() and str(int(digits)) == digits and not (path / _MANIFEST).exists():
            return int(digits)
        return None

    def is_complete(path: Path) -> bool:
        return any((path / name).is_file() for name in complete_files)

    return StepLayout("trainer", folder_step, is_complete)


def prune_checkpoints(directory: str | Path, step: int, keep: int,
                      complete_files: tuple[str, ...] = (TRAINER_STATE,)) -> list[Path]:
    """Once ``step``'s checkpoint is complete, delete the ``step-<n>`` folders of earlier steps
    beyond the newest ``keep`` complete ones (holding one of ``complete_files``), and the incomplete
    ones of earlier steps (a save cut short); ``keep`` 0 keeps every folder. Rank 0 calls it after
    writing :data:`TRAINER_STATE`. The rule is the one :func:`tensoropt.checkpoint.save_checkpoint`
    prunes the executor's worker's checkpoints by (:func:`tensoropt.checkpoint.prune.prune_step_folders`
    with :func:`trainer_layout`). Folders of another layout (zero-padded names, a ``manifest.json``)
    are left alone. Returns the folders deleted.

    Example:
        >>> import tempfile; d = Path(tempfile.mkdtemp())
        >>> for n in (1, 2, 3, 4):
        ...     (d / f"step-{n}").mkdir(); _ = (d / f"step-{n}" / TRAINER_STATE).write_text("{}")
        >>> (d / "step-0").mkdir()  # incomplete: a save cut short
        >>> [p.name for p in prune_checkpoints(d, 4, keep=2)], sorted(p.name for p in d.iterdir())
        (['step-0', 'step-1', 'step-2'], ['step-3', 'step-4'])
    """
    return prune_step_folders(directory, step, keep, trainer_layout(complete_files))
