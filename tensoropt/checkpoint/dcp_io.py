"""Save and restore a trainer's state with ``torch.distributed.checkpoint`` (DCP).

The trainer's parameters (DTensors laid out by its plan, or plain tensors on one process),
buffers and optimizer state go through ``get_state_dict`` / ``dcp.save``. Loading builds the
state dict of the *new* trainer (its plan's placements, possibly another world size), lets
``get_state_dict`` create the optimizer state (a zero-learning-rate step: DCP can only load
into state that exists), then ``dcp.load`` reshards every tensor into those placements and
``set_state_dict`` puts them back into the parameters and the optimizer.

Every function here is collective: call it on every rank.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from tensoropt.checkpoint.manifest import (
    MANIFEST_LAYOUT,
    CheckpointWarning,
    Found,
    Manifest,
    list_checkpoints,
    step_dir,
    write_manifest,
)
from tensoropt.checkpoint.prune import prune_step_folders


def state_module(params: dict[str, torch.Tensor],
                 buffers: dict[str, torch.Tensor] | None = None) -> nn.Module:
    """An ``nn.Module`` holding the given tensors under their state-dict keys (``"body.0.weight"``).

    The tensors are registered as they are (no copy), so loading into the module loads into them.

    Example:
        >>> m = state_module({"fc.weight": nn.Parameter(torch.zeros(2, 3))},
        ...                  {"bn.running_mean": torch.zeros(2)})
        >>> sorted(m.state_dict())
        ['bn.running_mean', 'fc.weight']
    """
    root = nn.Module()

    def owner(key: str) -> tuple[nn.Module, str]:
        *path, leaf = key.split(".")
        module = root
        for name in path:
            if name not in module._modules:
                module.add_module(name, nn.Module())
            module = module._modules[name]
        return module, leaf

    for key, p in params.items():
        module, leaf = owner(key)
        module.register_parameter(leaf, p if isinstance(p, nn.Parameter) else nn.Parameter(p))
    for key, b in (buffers or {}).items():
        module, leaf = owner(key)
        module.register_buffer(leaf, b)
    return root


def _world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def broadcast(obj):
    """Rank 0's ``obj`` on every rank (identity without a process group).

    Example:
        >>> broadcast({"step": 3})
        {'step': 3}
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _state(trainer) -> tuple[nn.Module, dict]:
    # zero1/zero2 parameters are saved and loaded through the shard the optimizer steps
    params = trainer.checkpoint_params() if hasattr(trainer, "checkpoint_params") else trainer.params
    holder = state_module(params, trainer.buffers)
    model_sd, optim_sd = get_state_dict(holder, trainer.optimizer)
    return holder, {"model": model_sd, "optim": optim_sd}


def save_checkpoint(trainer, root: str | Path, step: int, job_hash: str, job: dict, keep: int = 2) -> Path:
    """Write the trainer's state after ``step`` steps to ``root/step-<step>``, then its manifest.

    Args:
        trainer: a :class:`tensoropt.training.trainer.Trainer` (params, buffers, optimizer, plan).
        root: the checkpoint directory.
        step: global steps done (the step training resumes at).
        job_hash: :func:`tensoropt.checkpoint.job_hash` of the job.
        job: the job description recorded in the manifest.
        keep: complete checkpoints to keep (older ones, and incomplete ones of earlier steps, are
            deleted once this one is complete); 0 keeps all.

    Returns:
        The step directory.

    Example:
        >>> # not run here: needs a Trainer on a process group
        >>> save_checkpoint(trainer, "ckpt", 4, job_hash(spec_json), spec_json)  # doctest: +SKIP
    """
    rank, world = _world()
    path = step_dir(root, step)
    if rank == 0:
        if path.exists():  # a leftover of an interrupted save (or an older run): replace it
            shutil.rmtree(path)
        path.mkdir(parents=True)
    _barrier()
    _, state = _state(trainer)
    dcp.save(state, checkpoint_id=str(path))
    _barrier()
    if rank == 0:
        write_manifest(path, Manifest(step=step, plan_id=trainer.plan.plan_id, world_size=world,
                                      job_hash=job_hash, job=job))
        # older complete checkpoints beyond `keep`, and leftovers of failed saves: the trainers' rule
        prune_step_folders(root, step, keep, MANIFEST_LAYOUT)
    _barrier()
    return path


def load_checkpoint(trainer, found: Found) -> None:
    """Load a checkpoint into the trainer's parameters, buffers and optimizer, resharded.

    The trainer may run another plan at another world size than the one that wrote it.

    Example:
        >>> # not run here: needs a Trainer on a process group
        >>> load_checkpoint(trainer, latest_checkpoint("ckpt"))  # doctest: +SKIP
    """
    holder, state = _state(trainer)
    dcp.load(state, checkpoint_id=str(found.path))
    set_state_dict(holder, trainer.optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    if hasattr(trainer, "after_load"):
        trainer.after_load()  # all-gather the loaded zero1/zero2 shards into the parameters


def resume(trainer, root: str | Path, job_hash: str, verify_checksums: bool = True) -> Manifest | None:
    """Restore the newest usable checkpoint of this job under ``root``; None when there is none.

    Rank 0 lists the checkpoints (skipping incomplete or corrupt ones with a warning naming
    them; refusing another job's) and tells the other ranks. A checkpoint that DCP then fails
    to read is skipped the same way and the previous one is tried.

    Raises:
        CheckpointMismatch: the directory holds another job's checkpoint (on every rank).
        RuntimeError: every complete checkpoint failed to load.

    Example:
        >>> # not run here: needs a Trainer on a process group
        >>> manifest = resume(trainer, "ckpt", job_hash(spec_json))  # doctest: +SKIP
    """
    rank, _ = _world()
    listing: list[Found] | Exception = []
    if rank == 0:
        try:
            listing = list_checkpoints(root, job_hash, verify_checksums)
        except Exception as e:  # noqa: BLE001 - re-raised on every rank below
            listing = e
    listing = broadcast(listing)
    if isinstance(listing, Exception):
        raise listing
    failures = []
    for found in reversed(listing):
        try:
            load_checkpoint(trainer, found)
            return found.manifest
        except Exception as e:  # noqa: BLE001 - DCP raises the same error on every rank
            failures.append(f"{found.path}: {type(e).__name__}: {e}")
            if rank == 0:
                warnings.warn(f"skipping checkpoint {found.path}: it failed to load ({type(e).__name__}: "
                              f"{str(e)[:300]}); using the previous one", CheckpointWarning, stacklevel=2)
    if failures:
        listed = "\n  ".join(failures)
        raise RuntimeError(f"no checkpoint under {root} could be loaded:\n  {listed}")
    return None
