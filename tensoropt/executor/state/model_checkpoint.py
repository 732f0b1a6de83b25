"""Initial weights from the job's ``model.checkpoint``, one tensor at a time.

Three formats, chosen by the path:

* a directory: a torch distributed checkpoint (DCP), keys as in the model's state dict, or
  ``model.<key>`` as ``tensoropt run --checkpoint-dir`` writes them; each tensor is read alone;
  or a HuggingFace ``save_pretrained`` directory (``model.safetensors``, sharded
  ``model-0000x-of-0000y.safetensors`` with their index, or ``pytorch_model.bin``), whose keys
  are the user model's (a job's training step's ``model.`` prefix is matched without it);
* ``*.safetensors``: read one tensor at a time (``safetensors.safe_open``);
* anything else: a ``torch.save`` of a state dict (or of ``{"state_dict": ...}`` / ``{"model": ...}``),
  opened with ``mmap=True`` so only the tensor being read is paged in.

Each parameter's value goes to the same ``keep(keys, value)`` callback as the seeded init
(:func:`tensoropt.executor.job.materialize.materialize`), which keeps the rank's shard. A tied
parameter is found under any of its keys (HuggingFace files often hold only one).

Example:
    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "w.pt")
    >>> torch.save({"weight": torch.ones(1, 2), "bias": torch.zeros(1)}, path)
    >>> got = {}
    >>> with torch.device("meta"):
    ...     lin = torch.nn.Linear(2, 1)
    >>> load_values(path, lin, lambda keys, v: got.update({keys[0]: v}))
    >>> got["weight"].tolist(), got["bias"].tolist()
    ([[1.0, 1.0]], [0.0])
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn


def load_values(path: str, module: nn.Module, keep: Callable[[list[str], torch.Tensor], None]) -> None:
    """Call ``keep(keys, value)`` for every parameter of ``module`` with its value in ``path``.

    Args:
        path: the checkpoint (a DCP directory, a ``.safetensors`` file or a ``torch.save`` file).
        module: the model (parameters may be on meta; only names, shapes and dtypes are read).
        keep: receives each parameter's state-dict keys and its full value (cast to its dtype).

    Raises:
        ValueError: the file is missing, or lacks a parameter, or holds it with another shape.

    Example:
        >>> # not run here: needs a weights file
        >>> load_values("weights.safetensors", skeleton.module, keep)  # doctest: +SKIP
    """
    groups: dict[int, tuple[list[str], nn.Parameter]] = {}
    for key, p in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), ([], p))[0].append(key)
    with _reader(path) as read:
        for keys, p in groups.values():
            value = read(keys, tuple(p.shape), p.dtype)
            if value is None:
                raise ValueError(f"model.checkpoint {path}: no tensor named {' or '.join(map(repr, keys))} "
                                 "(the model's state-dict keys); save the model's state_dict() there")
            keep(keys, value)


def buffer_values(path: str, buffers: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The buffers of ``buffers`` (key -> current value) that ``path`` holds, cast to their dtypes.

    Example:
        >>> # not run here: needs a weights file
        >>> buffer_values("weights.pt", {"bn.running_mean": torch.zeros(4)})  # doctest: +SKIP
    """
    out = {}
    with _reader(path) as read:
        for key, b in buffers.items():
            value = read([key], tuple(b.shape), b.dtype)
            if value is not None:
                out[key] = value
    return out


Reader = Callable[[list[str], tuple, torch.dtype], "torch.Tensor | None"]


@contextmanager
def _reader(path: str) -> Iterator[Reader]:
    """A function (keys, shape, dtype) -> the first of ``keys`` in the checkpoint, or None."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"model.checkpoint: {path} does not exist (a state-dict file, a .safetensors file "
                         "or a distributed-checkpoint directory)")
    if p.is_dir() and not (p / ".metadata").exists() and _pretrained_files(p):
        with _pretrained_reader(p) as read:
            yield read
    elif p.is_dir():
        yield _dcp_reader(p)
    elif p.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(p), framework="pt", device="cpu") as f:
            names = set(f.keys())
            yield _checked(path, lambda k: f.get_tensor(k) if k in names else None)
    else:
        data = torch.load(p, map_location="cpu", mmap=True, weights_only=True)
        for nest in ("state_dict", "model"):
            if isinstance(data, dict) and isinstance(data.get(nest), dict):
                data = data[nest]
        if not isinstance(data, dict):
            raise ValueError(f"model.checkpoint {path}: holds a {type(data).__name__}, not a state dict")
        yield _checked(path, lambda k: data[k].clone() if k in data else None)


def _pretrained_files(directory: Path) -> list[Path]:
    """The weight files of a ``save_pretrained`` directory (empty: it is not one)."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        import json

        names = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        return [directory / n for n in names]
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (directory / name).exists():
            return [directory / name]
    return []


@contextmanager
def _pretrained_reader(directory: Path) -> Iterator[Reader]:
    """A reader over a ``save_pretrained`` directory's files, one tensor at a time."""
    from contextlib import ExitStack

    files = _pretrained_files(directory)
    with ExitStack() as stack:
        where: dict[str, object] = {}
        for f in files:
            if f.suffix == ".safetensors":
                from safetensors import safe_open

                handle = stack.enter_context(safe_open(str(f), framework="pt", device="cpu"))
                where.update(dict.fromkeys(handle.keys(), handle))
            else:
                data = torch.load(f, map_location="cpu", mmap=True, weights_only=True)
                where.update({k: data for k in data})

        def get(key: str) -> torch.Tensor | None:
            for name in (key, key.removeprefix("model.")):  # a job's training step wraps the model
                source = where.get(name)
                if source is not None:
                    return source[name].clone() if isinstance(source, dict) else source.get_tensor(name)
            return None

        yield _checked(str(directory), get)


def _checked(path: str, get: Callable[[str], torch.Tensor | None]) -> Reader:
    def read(keys: list[str], shape: tuple, dtype: torch.dtype) -> torch.Tensor | None:
        for key in keys:
            value = get(key)
            if value is None:
                continue
            if tuple(value.shape) != shape:
                raise ValueError(f"model.checkpoint {path}: {key!r} has shape {tuple(value.shape)}, the "
                                 f"model's {shape}; the checkpoint is of another model or configuration")
            return value.to(dtype)
        return None

    return read


def _dcp_reader(directory: Path) -> Reader:
    import torch.distributed.checkpoint as dcp

    reader = dcp.FileSystemReader(str(directory))
    stored = set(reader.read_metadata().state_dict_metadata)

    def read(keys: list[str], shape: tuple, dtype: torch.dtype) -> torch.Tensor | None:
        for key in keys:
            name = key if key in stored else f"model.{key}" if f"model.{key}" in stored else None
            if name is None:
                continue
            value = torch.empty(shape, dtype=dtype)
            dcp.load({name: value}, storage_reader=reader, no_dist=True)
            return value
        return None

    return read
