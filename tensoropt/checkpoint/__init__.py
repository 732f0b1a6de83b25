"""Atomic distributed checkpoints (torch.distributed.checkpoint) that reshard into any plan.

Example:
    >>> from tensoropt.checkpoint import job_hash, latest_checkpoint
    >>> latest_checkpoint("/nonexistent", job_hash({"model": "mlp"})) is None
    True
"""

from tensoropt.checkpoint.dcp_io import broadcast, load_checkpoint, resume, save_checkpoint, state_module
from tensoropt.checkpoint.manifest import (
    MANIFEST,
    CheckpointMismatch,
    CheckpointWarning,
    Found,
    Manifest,
    job_hash,
    latest_checkpoint,
    list_checkpoints,
    read_manifest,
    step_dir,
    write_manifest,
)

__all__ = [
    "MANIFEST", "CheckpointMismatch", "CheckpointWarning", "Found", "Manifest", "broadcast", "job_hash",
    "latest_checkpoint", "list_checkpoints", "load_checkpoint", "read_manifest", "resume", "save_checkpoint",
    "state_module", "step_dir", "write_manifest",
]
