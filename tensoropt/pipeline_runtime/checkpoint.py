"""DCP checkpoints of a pipelined run under the model's own names, readable at any stage count.

Each rank contributes its stage's ``state_dict`` (keys such as ``blocks.0.attn.q.weight``, as the
stage modules keep the model's names) and its optimizer state flattened per parameter name
(``StateDictOptions(flatten_optimizer_state_dict=True)``: ``state.blocks.0.attn.q.weight.exp_avg``,
``param_groups.blocks.0.attn.q.weight.lr``), so no key depends on the stage layout; replicas of a
stage write the same keys and DCP keeps one. Loading builds the same state dict of the *new*
layout (the optimizer state created by a zero-learning-rate step, as DCP loads only into state
that exists) and reads every key it holds. ``STEP_FILE`` records the steps done, and
``trainer.json`` (:data:`tensoropt.checkpoint.trainer_format.TRAINER_STATE`) the trainer's state in
the layout ``tensoropt run``'s loop writes (:mod:`tensoropt.checkpoint.trainer_format`): a
pipelined run's checkpoint resumes under a plan without stages, and the loop's under a pipelined
plan.

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

import dataclasses
import json
from pathlib import Path

import torch
import torch.distributed as dist

from tensoropt.checkpoint.trainer_format import (
    TRAINER_STATE,
    flat_optimizer,
    optimizer_options,
    prune_checkpoints,
)

STEP_FILE = "pipeline_step.json"
"""The file (beside DCP's) holding ``{"step": steps done}``."""


def __getattr__(name: str):
    if name == "OPTIONS":  # the layout's options (trainer_format.FLAT_OPTIMIZER), made on first use
        return flat_optimizer()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _state(module, optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(module, optimizer, options=flat_optimizer())
    return {"model": model_sd, "optim": optim_sd}


CHECKPOINT_PREFIX = "step-"
"""A checkpoint's folder name: ``step-<steps done>``."""


def latest_pipelined_checkpoint(directory: str | Path | None) -> Path | None:
    """The newest complete checkpoint under ``directory`` (a ``step-<n>`` folder holding
    ``STEP_FILE``, or the loop's ``trainer.json``), or ``directory`` itself when it holds one; None
    when there is none.

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
    if _steps_done(directory) is not None:
        return directory
    done = [p for p in directory.glob(CHECKPOINT_PREFIX + "*") if _steps_done(p) is not None]
    return max(done, key=lambda p: int(p.name.removeprefix(CHECKPOINT_PREFIX)), default=None)


def save_checkpoint(directory: str | Path, module, optimizer, step: int, plan_id: str | None = None,
                    keep: int = 0) -> Path:
    """Write this rank's stage and optimizer state to ``directory/step-<step>`` (collective);
    returns that folder. ``plan_id``: the plan that wrote it, recorded in ``trainer.json``. Then the
    newest ``keep`` complete checkpoints are kept (0: all;
    :func:`tensoropt.checkpoint.trainer_format.prune_checkpoints`), as the loop keeps its own.

    Example:
        >>> # not run here: collective
        >>> save_checkpoint("ckpt", module, optimizer, 4)  # doctest: +SKIP
    """
    import torch.distributed.checkpoint as dcp  # here: a run that never saves does not load DCP

    path = Path(directory) / f"{CHECKPOINT_PREFIX}{step}"
    if dist.get_rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dcp.save(_state(module, optimizer), checkpoint_id=str(path))
    if dist.get_rank() == 0:
        (path / STEP_FILE).write_text(json.dumps({"step": step}))
        # the loop's trainer state: the schedule is a function of the step (no scheduler state)
        (path / TRAINER_STATE).write_text(json.dumps({
            "step": step, "scheduler": None, "data_position": step, "loss_scale": None,
            "world_size": dist.get_world_size(), "plan_id": plan_id, "pipelined": True}))
        prune_checkpoints(directory, step, keep, complete_files=(STEP_FILE, TRAINER_STATE))
    dist.barrier()
    return path


def _steps_done(folder: Path) -> int | None:
    """The steps a complete checkpoint folder holds (its ``STEP_FILE``, else the loop's
    ``trainer.json``); None when it holds neither."""
    for name in (STEP_FILE, TRAINER_STATE):
        if (folder / name).is_file():
            return int(json.loads((folder / name).read_text())["step"])
    return None


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
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    options = optimizer_options(found)
    _create_optimizer_state(module, optimizer)
    model_sd, optim_sd = get_state_dict(module, optimizer, options=options)
    absent = _buffers_not_saved(found, module, model_sd)
    if absent:  # constant buffers the checkpoint's run did not save (a causal mask): kept as built
        options = dataclasses.replace(options, strict=False)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(found))
    set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=options)
    return _steps_done(found)


def _buffers_not_saved(folder: Path, module, model_sd: dict) -> list[str]:
    """Drop from ``model_sd`` (and return) the buffers of ``module`` that the checkpoint lacks: a
    plan without stages keeps a model's constant buffers (a causal mask) out of its checkpoint, and
    a stage module rebuilds them. A missing *parameter* is an error naming it."""
    import torch.distributed.checkpoint as dcp

    saved = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    buffers = {name for name, _ in module.named_buffers()}
    absent = [k for k in model_sd if f"model.{k}" not in saved]
    lost = [k for k in absent if k not in buffers]
    if lost:
        raise ValueError(f"checkpoint {folder} lacks the parameters {lost[:4]}"
                         f"{' ...' if len(lost) > 4 else ''}: it was written for another model")
    for key in absent:
        model_sd.pop(key)
    return absent


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
