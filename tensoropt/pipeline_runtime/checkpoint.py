"""DCP checkpoints of a pipelined run under the model's own names, readable at any stage count.

Each rank contributes its stage's ``state_dict`` (keys such as ``blocks.0.attn.q.weight``, as the
stage modules keep the model's names) and its optimizer state flattened per parameter name
(``StateDictOptions(flatten_optimizer_state_dict=True)``: ``state.blocks.0.attn.q.weight.exp_avg``,
``param_groups.blocks.0.attn.q.weight.lr``), so no key depends on the stage layout; replicas of a
stage write the same keys and DCP keeps one. Loading builds the same state dict of the *new*
layout (the optimizer state created by a zero-learning-rate step, as DCP loads only into state
that exists) and reads every key it holds. ``STEP_FILE`` records the steps done.

Each checkpoint is a folder ``step-<n>`` under the run's checkpoint directory, its ``STEP_FILE``
written last: a run killed while writing leaves an incomplete folder that
:func:`latest_pipelined_checkpoint` skips, and the one before it stands.

Example:
    >>> # not run here: collective over the run's process group
    >>> save_checkpoint("ckpt", module, optimizer, 4)  # doctest: +SKIP
    >>> load_checkpoint("ckpt", module, optimizer)  # doctest: +SKIP
    4
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

STEP_FILE = "pipeline_step.json"
"""The file (beside DCP's) holding ``{"step": steps done}``."""

OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def _state(module, optimizer) -> dict:
    model_sd, optim_sd = get_state_dict(module, optimizer, options=OPTIONS)
    return {"model": model_sd, "optim": optim_sd}


CHECKPOINT_PREFIX = "step-"
"""A checkpoint's folder name: ``step-<steps done>``."""


def latest_pipelined_checkpoint(directory: str | Path | None) -> Path | None:
    """The newest complete checkpoint under ``directory`` (a ``step-<n>`` folder holding
    ``STEP_FILE``), or ``directory`` itself when it holds one; None when there is none.

    Example:
        >>> import tempfile; d = Path(tempfile.mkdtemp())
        >>> (d / "step-2").mkdir(); (d / "step-4").mkdir()
        >>> _ = (d / "step-2" / STEP_FILE).write_text('{"step": 2}')
        >>> latest_pipelined_checkpoint(d).name, latest_pipelined_checkpoint(d / "nothing")
        ('step-2', None)
    """
    if directory is None or not Path(directory).is_dir():
        return None
    directory = Path(directory)
    if (directory / STEP_FILE).is_file():
        return directory
    done = [p for p in directory.glob(CHECKPOINT_PREFIX + "*") if (p / STEP_FILE).is_file()]
    return max(done, key=lambda p: int(p.name.removeprefix(CHECKPOINT_PREFIX)), default=None)


def save_checkpoint(directory: str | Path, module, optimizer, step: int) -> Path:
    """Write this rank's stage and optimizer state to ``directory/step-<step>`` (collective);
    returns that folder.

    Example:
        >>> # not run here: collective
        >>> save_checkpoint("ckpt", module, optimizer, 4)  # doctest: +SKIP
    """
    path = Path(directory) / f"{CHECKPOINT_PREFIX}{step}"
    if dist.get_rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dcp.save(_state(module, optimizer), checkpoint_id=str(path))
    if dist.get_rank() == 0:
        (path / STEP_FILE).write_text(json.dumps({"step": step}))
    dist.barrier()
    return path


def load_checkpoint(path: str | Path, module, optimizer) -> int:
    """Load the newest checkpoint under ``path`` (:func:`latest_pipelined_checkpoint`) into this
    rank's stage and optimizer (collective); returns the steps done.

    Example:
        >>> # not run here: collective
        >>> load_checkpoint("ckpt", module, optimizer)  # doctest: +SKIP
        4
    """
    found = latest_pipelined_checkpoint(path)
    if found is None:
        raise FileNotFoundError(f"resume_from {path}: no complete checkpoint ({CHECKPOINT_PREFIX}<n>/"
                                f"{STEP_FILE}); not a pipelined run's checkpoint directory")
    path = found
    step_file = path / STEP_FILE
    _create_optimizer_state(module, optimizer)
    state = _state(module, optimizer)
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=OPTIONS)
    return int(json.loads(step_file.read_text())["step"])


def _create_optimizer_state(module, optimizer) -> None:
    """A step at learning rate 0 with zero gradients: the optimizer's state exists, nothing moves
    (AdamW's decoupled decay is ``lr * weight_decay``, 0 too)."""
    saved = [g["lr"] for g in optimizer.param_groups]
    for p in module.parameters():
        p.grad = torch.zeros_like(p)
    for g in optimizer.param_groups:
        g["lr"] = 0.0
    optimizer.step()
    for g, lr in zip(optimizer.param_groups, saved):
        g["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
