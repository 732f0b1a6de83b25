"""Checkpoint directories, their manifests, and which checkpoint counts.

A checkpoint directory ``D`` holds one sub-directory per saved step::

    D/step-00000012/            the torch.distributed.checkpoint files (``.metadata``, ``*.distcp``)
    D/step-00000012/manifest.json

``manifest.json`` is written last, atomically, by rank 0 once every rank has finished writing:
``{"step", "plan_id", "world_size", "job_hash", "job", "files": {name: {"bytes", "crc32"}},
"complete": true}``. A step directory without a readable, complete manifest, or whose files do
not match the sizes and checksums the manifest lists, is incomplete or corrupt: it is skipped
with a warning naming it, and the previous checkpoint is used.
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from estimators.files import write_text_atomic
from tensoropt.checkpoint.prune import StepLayout

MANIFEST = "manifest.json"
"""Name of the manifest file inside a step directory."""

_STEP_DIR = re.compile(r"^step-(\d+)$")

IGNORED_IN_HASH = ("steps", "job")
"""Keys of a training description left out of the job hash (only ``job["model"]`` counts)."""


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped (incomplete or corrupt)."""


class CheckpointMismatch(RuntimeError):
    """The checkpoint directory holds a checkpoint written by another job.

    Example:
        >>> str(CheckpointMismatch("ckpt/step-00000004 belongs to another job")).startswith("ckpt")
        True
    """


def job_hash(job: dict) -> str:
    """A short stable hash of what makes checkpoints of a job interchangeable.

    ``job`` is the training description (``TrainSpec.to_json()``: model, inputs, batch,
    optimizer, learning rate, seed, dtype, dataset). Its total ``steps`` and, of the planner
    ``job`` it came from, everything but the ``model`` section (device counts, memory budget,
    selection rule) are left out, so a run may be extended, re-planned or moved to another
    device count and still resume.

    Example:
        >>> job_hash({"model": "mlp", "steps": 3}) == job_hash({"model": "mlp", "steps": 10, "job": {}})
        True
        >>> len(job_hash({"model": "mlp"}))
        16
    """
    core = {k: v for k, v in job.items() if k not in IGNORED_IN_HASH}
    if isinstance(job.get("job"), dict) and "model" in job["job"]:
        core["job.model"] = job["job"]["model"]  # the model is built from it
    text = json.dumps(core, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def step_dir(root: str | Path, step: int) -> Path:
    """The directory of the checkpoint taken after ``step`` steps.

    Example:
        >>> step_dir("ckpt", 12).name
        'step-00000012'
    """
    return Path(root) / f"step-{step:08d}"


@dataclass(frozen=True)
class Manifest:
    """What a complete checkpoint records about itself.

    Attributes:
        step: global steps done when it was taken (training resumes at this step).
        plan_id: the plan it was trained under.
        world_size: processes that wrote it.
        job_hash: :func:`job_hash` of the job that wrote it.
        job: the job description (for error messages).
        files: file name -> {"bytes", "crc32"} of every file of the checkpoint.
        complete: always True in a written manifest.
    """

    step: int
    plan_id: str
    world_size: int
    job_hash: str
    job: dict = field(default_factory=dict)
    files: dict[str, dict] = field(default_factory=dict)
    complete: bool = True

    def to_json(self) -> dict:
        """JSON form (the content of manifest.json)."""
        return {"step": self.step, "plan_id": self.plan_id, "world_size": self.world_size,
                "job_hash": self.job_hash, "job": self.job, "files": self.files, "complete": self.complete}

    @staticmethod
    def from_json(data: dict) -> Manifest:
        """Inverse of :meth:`to_json` (KeyError/TypeError/ValueError on a malformed one).

        Example:
            >>> m = Manifest(3, "d2-p0", 2, "abc")
            >>> Manifest.from_json(m.to_json()) == m
            True
        """
        return Manifest(step=int(data["step"]), plan_id=str(data["plan_id"]),
                        world_size=int(data["world_size"]), job_hash=str(data["job_hash"]),
                        job=dict(data.get("job", {})), files=dict(data.get("files", {})),
                        complete=data["complete"] is True)


def file_record(path: Path) -> dict:
    """Size and CRC-32 of a file (read in 1 MiB blocks).

    Example:
        >>> import tempfile, os
        >>> p = Path(tempfile.mkdtemp()) / "f"; _ = p.write_bytes(b"abc")
        >>> file_record(p)
        {'bytes': 3, 'crc32': 891568578}
    """
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            crc = zlib.crc32(block, crc)
    return {"bytes": path.stat().st_size, "crc32": crc}


def write_manifest(directory: str | Path, manifest: Manifest) -> None:
    """Record every file of ``directory`` in ``manifest`` and write it atomically, last.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); _ = (d / "a.distcp").write_bytes(b"x")
        >>> write_manifest(d, Manifest(1, "d1-p0", 1, "h")); read_manifest(d).files["a.distcp"]["bytes"]
        1
    """
    directory = Path(directory)
    files = {p.name: file_record(p) for p in sorted(directory.iterdir())
             if p.is_file() and p.name != MANIFEST and not p.name.startswith(f".{MANIFEST}")}
    data = Manifest(**{**manifest.__dict__, "files": files, "complete": True}).to_json()
    write_text_atomic(directory / MANIFEST, json.dumps(data, indent=1) + "\n")


def read_manifest(directory: str | Path) -> Manifest:
    """The manifest of a step directory (OSError / ValueError when missing or malformed)."""
    path = Path(directory) / MANIFEST
    try:
        return Manifest.from_json(json.loads(path.read_text()))
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"malformed manifest ({type(e).__name__}: {e})") from None


def check_files(directory: Path, manifest: Manifest, verify_checksums: bool = True) -> str | None:
    """Why the files of a checkpoint do not match its manifest, or None when they do."""
    if not manifest.complete:
        return "its manifest does not say complete"
    if not manifest.files:
        return "its manifest lists no files"
    for name, record in manifest.files.items():
        path = directory / name
        if not path.is_file():
            return f"file {name} is missing"
        size = path.stat().st_size
        if size != record.get("bytes"):
            return f"file {name} has {size} bytes, the manifest says {record.get('bytes')} (truncated?)"
        if verify_checksums and "crc32" in record and file_record(path)["crc32"] != record["crc32"]:
            return f"file {name} does not match its CRC-32 (corrupt)"
    return None


@dataclass(frozen=True)
class Found:
    """A complete checkpoint found in a directory."""

    path: Path
    """Its step directory."""
    manifest: Manifest
    """Its manifest."""


def step_dirs(root: str | Path) -> list[tuple[int, Path]]:
    """Every ``step-N`` directory under ``root`` (complete or not) as (N, path), by step.

    Example:
        >>> step_dirs("/nonexistent")
        []
    """
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in root.iterdir()
                  if p.is_dir() and (m := _STEP_DIR.match(p.name)))


def list_checkpoints(root: str | Path, expected_job_hash: str | None = None,
                     verify_checksums: bool = True) -> list[Found]:
    """The complete checkpoints under ``root``, oldest first; warn about the ones skipped.

    Args:
        root: the checkpoint directory (may not exist yet: no checkpoints).
        expected_job_hash: when given, a complete checkpoint of another job raises
            :class:`CheckpointMismatch`.
        verify_checksums: also compare the files' CRC-32 with the manifest (reads every file).

    Raises:
        CheckpointMismatch: a complete checkpoint was written by another job.

    Example:
        >>> list_checkpoints("/nonexistent")
        []
    """
    found = []
    for step, path in step_dirs(root):
        manifest, problem = _checked(path, step, verify_checksums)
        if problem is not None:
            _skip(path, problem)
            continue
        if expected_job_hash is not None and manifest.job_hash != expected_job_hash:
            raise CheckpointMismatch(
                f"refusing checkpoint {path}: it was written by another job (job hash {manifest.job_hash}, "
                f"{_describe(manifest.job)}); this run's job hash is {expected_job_hash}. "
                "Use another --checkpoint-dir for this job, or delete the old checkpoints."
            )
        found.append(Found(path, manifest))
    return found


def _checked(path: Path, step: int, verify_checksums: bool) -> tuple[Manifest | None, str | None]:
    """The manifest of the step folder ``path`` of ``step``, and why it is unusable (None when usable)."""
    try:
        manifest = read_manifest(path)
    except FileNotFoundError:
        return None, "it has no manifest (the save did not finish)"
    except (OSError, ValueError) as e:
        return None, f"its manifest is unreadable: {e}"
    problem = check_files(path, manifest, verify_checksums)
    if problem is None and manifest.step != step:
        problem = f"its manifest says step {manifest.step}"
    return manifest, problem


def _manifest_folder_step(path: Path) -> int | None:
    """The step of a folder named as :func:`step_dir` names it (``step-00000012``), else None."""
    m = _STEP_DIR.match(path.name)
    return int(m.group(1)) if m and step_dir(path.parent, int(m.group(1))).name == path.name else None


MANIFEST_LAYOUT = StepLayout(
    "manifest", _manifest_folder_step,
    lambda path: _checked(path, _manifest_folder_step(path), verify_checksums=False)[1] is None)
"""The executor's worker's checkpoints for :func:`tensoropt.checkpoint.prune.prune_step_folders`:
``step-00000012/`` folders, complete when the manifest matches its files' sizes (checksums are not
read: pruning must stay cheap)."""


def latest_checkpoint(root: str | Path, expected_job_hash: str | None = None,
                      verify_checksums: bool = True) -> Found | None:
    """The newest complete checkpoint under ``root``, or None (see :func:`list_checkpoints`).

    Example:
        >>> latest_checkpoint("/nonexistent") is None
        True
    """
    found = list_checkpoints(root, expected_job_hash, verify_checksums)
    return found[-1] if found else None


def _skip(path: Path, why: str) -> None:
    warnings.warn(f"skipping checkpoint {path}: {why}; using the previous one", CheckpointWarning,
                  stacklevel=3)


def _describe(job: dict) -> str:
    keys = ("model", "model_kwargs", "global_batch_size", "optimizer", "lr", "seed")
    shown = ", ".join(f"{k}={job[k]}" for k in keys if k in job)
    return shown or "no job description"
