"""The trained model back out: one consolidated ``model.safetensors`` (and HF ``config.json``).

:func:`save_model` gathers each tensor of a parallel model's state dict in turn (a collective:
every rank calls it), and rank 0 streams it into the file: the safetensors header (every key's
dtype, shape and byte range, known from the DTensors' global metadata before any data moves) is
written first, then the tensors one by one, so no rank ever holds more than one full tensor.
:func:`export_checkpoint` does the same offline, in one process, from a ``tensoropt run
--checkpoint-dir`` checkpoint (DCP), reading one tensor at a time.

Both write into a temporary directory beside the target and rename it into place at the end:
a failure leaves the target as it was (nothing half-written). Tied parameters are written under
each of their keys (``load_state_dict`` is strict; ``from_pretrained`` re-ties them).

Example:
    >>> import tempfile, safetensors.torch
    >>> out = Path(tempfile.mkdtemp()) / "model"
    >>> write_safetensors(out, {"w": torch.ones(2, 2)}, lambda key: torch.ones(2, 2))
    >>> safetensors.torch.load_file(str(out / "model.safetensors"))["w"].tolist()
    [[1.0, 1.0], [1.0, 1.0]]
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import uuid
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

MODEL_FILE = "model.safetensors"

_DTYPE_NAMES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
                torch.uint8: "U8", torch.bool: "BOOL"}


class SaveError(OSError):
    """The model could not be written; the target directory is left as it was."""


def _header(meta: dict[str, tuple[torch.dtype, tuple[int, ...]]]) -> bytes:
    entries, offset = {"__metadata__": {"format": "pt"}}, 0
    for key, (dtype, shape) in meta.items():
        if dtype not in _DTYPE_NAMES:
            raise SaveError(f"save_model: tensor {key!r} has dtype {dtype}, which safetensors cannot hold")
        size = dtype.itemsize * int(torch.Size(shape).numel())
        entries[key] = {"dtype": _DTYPE_NAMES[dtype], "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _bytes(t: torch.Tensor) -> memoryview:
    t = t.detach().to("cpu").contiguous().reshape(-1)
    return memoryview(t.view(torch.uint8).numpy())


def write_safetensors(directory: Path, meta: dict[str, tuple], tensor: Callable[[str], torch.Tensor | None],
                      extra: Callable[[Path], None] | None = None) -> None:
    """Write ``directory/model.safetensors`` atomically, streaming ``tensor(key)`` for each key of
    ``meta`` (key -> (dtype, shape) or a tensor of that dtype and shape); ``extra(tmp_dir)`` may
    add files (``config.json``). One process; :func:`save_model` is the collective form.

    Example:
        >>> import tempfile
        >>> out = Path(tempfile.mkdtemp()) / "m"
        >>> write_safetensors(out, {"b": torch.zeros(3)}, lambda k: torch.arange(3.0))
        >>> sorted(p.name for p in out.iterdir())
        ['model.safetensors']
    """
    meta = {k: (v.dtype, tuple(v.shape)) if isinstance(v, torch.Tensor) else v for k, v in meta.items()}
    tmp = _temporary(Path(directory))
    try:
        with open(tmp / MODEL_FILE, "wb") as f:
            f.write(_header(meta))
            for key, (dtype, shape) in meta.items():
                value = tensor(key).to(dtype)
                if tuple(value.shape) != tuple(shape):
                    raise SaveError(f"save_model: tensor {key!r} is {list(value.shape)}, announced "
                                    f"{list(shape)}")
                f.write(_bytes(value))
            f.flush()
            os.fsync(f.fileno())
        if extra is not None:
            extra(tmp)
        _commit(tmp, Path(directory))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _temporary(directory: Path) -> Path:
    """A fresh empty directory beside ``directory`` (raises :class:`SaveError` naming the place)."""
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = directory.parent / f".{directory.name}.tmp-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
    except OSError as err:
        raise SaveError(f"save_model: cannot write to {directory} ({err.strerror or err}); choose a writable "
                        "directory") from None
    return tmp


def _commit(tmp: Path, directory: Path) -> None:
    """Rename ``tmp`` to ``directory``; an existing ``directory`` is replaced (moved aside, then removed)."""
    old = None
    if directory.exists():
        old = directory.parent / f".{directory.name}.old-{uuid.uuid4().hex[:8]}"
        directory.rename(old)
    try:
        tmp.rename(directory)
    except OSError:
        if old is not None:
            old.rename(directory)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _agree(ok: bool, message: str) -> None:
    """Every rank learns whether rank 0 succeeded (a collective); all raise its message if not."""
    rank, world = _world()
    if world == 1:
        if not ok:
            raise SaveError(message)
        return
    box = [message if rank == 0 else None]
    flag = torch.tensor([1 if ok else 0])
    dist.broadcast(flag, src=0)
    if not int(flag.item()):
        dist.broadcast_object_list(box, src=0)
        raise SaveError(box[0])


def save_model(pm, directory, dtype: torch.dtype | None = None) -> Path:
    """Write the parallel model ``pm`` as one consolidated ``model.safetensors`` in ``directory``.

    Collective: call it on every rank. The model's state dict (its own keys; tied parameters under
    each key) is gathered tensor by tensor and streamed by rank 0. With an HF ``config`` on the
    model, ``config.json`` is written beside it, so ``Model.from_pretrained(directory)`` reads it;
    ``model.load_state_dict(safetensors.torch.load_file(directory / "model.safetensors"))`` does too.

    Args:
        pm: a :class:`~tensoropt.parallel.model.ParallelModel` (or any module: plain tensors work too).
        directory: the output directory (created; replaced as a whole if it exists).
        dtype: cast floating-point tensors to this dtype (e.g. ``torch.bfloat16``); None keeps them.

    Raises:
        SaveError: the directory cannot be written (on every rank); nothing is left half-written.

    Example:
        >>> import tempfile, safetensors.torch
        >>> out = save_model(torch.nn.Linear(2, 1), Path(tempfile.mkdtemp()) / "lin")
        >>> sorted(safetensors.torch.load_file(str(out / "model.safetensors")))
        ['bias', 'weight']
    """
    directory = Path(directory)
    rank, _ = _world()
    state = pm.state_dict()
    meta = {}
    for key, t in state.items():
        cast = dtype if dtype is not None and t.is_floating_point() else t.dtype
        meta[key] = (cast, tuple(t.shape))
    tmp, ok, message = None, True, ""
    if rank == 0:
        try:
            tmp = _temporary(directory)
            header = _header(meta)
        except SaveError as err:
            ok, message = False, str(err)
    _agree(ok, message)
    handle, gathered = None, {}
    try:
        if rank == 0:
            try:
                handle = open(tmp / MODEL_FILE, "wb")
                handle.write(header)
            except OSError as err:
                ok, message = False, f"save_model: cannot write {directory} ({err.strerror or err})"
        for key, t in state.items():
            value = gathered.get(id(t))
            if value is None:
                value = t.full_tensor() if isinstance(t, DTensor) else t
                gathered = {id(t): value}  # a tied key's twin follows it at once; keep one tensor only
            if rank == 0 and ok:
                try:
                    handle.write(_bytes(value.to(meta[key][0])))
                except OSError as err:
                    ok, message = False, f"save_model: cannot write {directory} ({err.strerror or err})"
        if rank == 0 and ok:
            try:
                handle.flush()
                os.fsync(handle.fileno())
                handle.close()
                handle = None
                config = getattr(pm, "config", None)
                if config is not None and callable(getattr(config, "to_json_file", None)):
                    config.to_json_file(str(tmp / "config.json"))
                _commit(tmp, directory)
                tmp = None
            except OSError as err:
                ok, message = False, f"save_model: cannot write {directory} ({err.strerror or err})"
    finally:
        if handle is not None:
            handle.close()
        if rank == 0 and tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    _agree(ok, message)
    return directory


def export_checkpoint(checkpoint_dir, out, dtype: torch.dtype | None = None) -> Path:
    """Write the model of a ``tensoropt run --checkpoint-dir`` checkpoint as ``out/model.safetensors``.

    Offline, one process: ``checkpoint_dir`` is the checkpoint root (its newest complete step is
    taken) or one ``step-*`` directory; each parameter and buffer is read alone from the DCP files
    (``model.<key>``; a job's training step's ``model.`` prefix is dropped, so the keys are the
    user model's) and streamed into the file. With an HF model in the checkpoint's job, its
    ``config.json`` is written beside it.

    Raises:
        ValueError: no complete checkpoint there.
        SaveError: ``out`` cannot be written (nothing is left half-written).

    Example:
        >>> export_checkpoint("out/ckpt", "out/model")  # doctest: +SKIP
    """
    import torch.distributed.checkpoint as dcp

    from tensoropt.checkpoint.manifest import MANIFEST, list_checkpoints

    root = Path(checkpoint_dir)
    if (root / MANIFEST).exists():
        step_dir, manifest = root, json.loads((root / MANIFEST).read_text())
    else:
        found = list_checkpoints(root) if root.is_dir() else []
        if not found:
            raise ValueError(f"export: {root} holds no complete checkpoint (a --checkpoint-dir of "
                             "`tensoropt run`, or one of its step-* directories)")
        step_dir, manifest = found[-1].path, found[-1].manifest.to_json() \
            if hasattr(found[-1].manifest, "to_json") else {}
    reader = dcp.FileSystemReader(str(step_dir))
    stored = reader.read_metadata().state_dict_metadata
    prefix = _user_prefix(manifest)
    keys = {}
    for name, md in stored.items():
        if not name.startswith("model.") or not hasattr(md, "size"):
            continue
        user = name[len("model."):]
        keys[user.removeprefix(prefix)] = (name, md)
    if not keys:
        raise ValueError(f"export: {step_dir} holds no model tensors (model.<key>)")
    meta = {}
    for k, (_, md) in keys.items():
        stored_dtype = md.properties.dtype
        cast = dtype if dtype is not None and stored_dtype.is_floating_point else stored_dtype
        meta[k] = (cast, tuple(md.size))

    def tensor(key: str) -> torch.Tensor:
        name, md = keys[key]
        value = torch.empty(tuple(md.size), dtype=md.properties.dtype)
        dcp.load({name: value}, storage_reader=reader, no_dist=True)
        return value

    config = _hf_config(manifest)
    write_safetensors(Path(out), meta, tensor,
                      extra=(lambda tmp: config.to_json_file(str(tmp / "config.json"))) if config else None)
    return Path(out)


def _user_prefix(manifest: dict) -> str:
    """``model.`` where the checkpoint's job wraps the user's model in a training step (its loss)."""
    job = (manifest.get("job") or {}).get("job") or manifest.get("job") or {}
    model = job.get("model") if isinstance(job, dict) else None
    if isinstance(model, dict) and model.get("factory") and not model.get("task"):
        return "model."
    return ""


def _hf_config(manifest: dict):
    """The HF config of the checkpoint's job model, when it is a transformers model (else None)."""
    job = (manifest.get("job") or {}).get("job") or manifest.get("job") or {}
    try:
        from tensoropt.config import Job
        from tensoropt.job_model import build_job_model

        model = build_job_model(Job.from_dict(job), device="meta")[0]
    except Exception:  # noqa: BLE001 - no job, or a model that cannot be built here: no config.json
        return None
    model = getattr(model, "model", model)
    config = getattr(model, "config", None)
    return config if callable(getattr(config, "to_json_file", None)) else None
