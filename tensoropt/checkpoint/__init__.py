"""Atomic distributed checkpoints (torch.distributed.checkpoint) that reshard into any plan.

The names are imported when first used: a worker that never saves (or only hashes its job) does
not import ``torch.distributed.checkpoint``.

Example:
    >>> from tensoropt.checkpoint import job_hash, latest_checkpoint
    >>> latest_checkpoint("/nonexistent", job_hash({"model": "mlp"})) is None
    True
"""

from __future__ import annotations

import importlib

_LAZY = {
    **dict.fromkeys(("broadcast", "load_checkpoint", "resume", "save_checkpoint", "state_module"),
                    "tensoropt.checkpoint.dcp_io"),
    **dict.fromkeys(("MANIFEST", "CheckpointMismatch", "CheckpointWarning", "Found", "Manifest", "job_hash",
                     "latest_checkpoint", "list_checkpoints", "read_manifest", "step_dir", "write_manifest"),
                    "tensoropt.checkpoint.manifest"),
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tensoropt.checkpoint' has no attribute {name!r}")


__all__ = sorted(_LAZY)
