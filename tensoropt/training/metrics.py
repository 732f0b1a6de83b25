"""What a run reports while it trains: ``metrics.jsonl``, TensorBoard scalars and a progress line.

Every ``metrics.log_every`` steps one JSON object per line, with exactly :data:`METRIC_KEYS` (a
contract: ``step``, ``loss`` the step's global mean over its micro-batches, ``lr`` the rate its
update used, ``grad_norm`` the total norm before clipping, ``time_s``, ``samples_per_s``,
``tokens_per_s`` (None without token inputs), ``mfu`` (against the cluster profile's peak for the
run's dtype) and ``peak_bytes``), written and flushed at once so the file is readable while the
run goes. ``metrics.tensorboard: DIR`` writes the same scalars with torch's ``SummaryWriter`` (the
``tensorboard`` optional extra). Validation lines go to the same writers under ``val/`` names
(:data:`VALIDATION_KEYS`, in ``validation.jsonl`` beside ``metrics.jsonl``).

Example:
    >>> import io, json
    >>> out = io.StringIO()
    >>> log = MetricsLogger(out)
    >>> log.log(step_record(step=1, loss=2.5, lr=1e-3, grad_norm=0.7, time_s=0.5, samples=8, tokens=1024,
    ...                     flops=1e12, peak_flops=1e13, devices=2, peak_bytes=2**20))
    >>> row = json.loads(out.getvalue()); row["samples_per_s"], row["tokens_per_s"], row["mfu"]
    (16.0, 2048.0, 0.1)
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, TextIO

__all__ = ["METRIC_KEYS", "VALIDATION_KEYS", "MetricsLogger", "ProgressLine", "TensorBoardWriter",
           "step_record", "writable_directory_error"]

METRIC_KEYS = ("step", "loss", "lr", "grad_norm", "time_s", "samples_per_s", "tokens_per_s", "mfu",
               "peak_bytes")
"""The keys of every training line of ``metrics.jsonl``, in this order (a contract)."""

VALIDATION_KEYS = ("step", "loss", "time_s")
"""The keys of every line of ``validation.jsonl``: the training step it follows, the held-out loss
(the mean over ``validation.steps`` batches) and the seconds it took."""


def step_record(*, step: int, loss: float, lr: float, grad_norm: float | None, time_s: float, samples: int,
                tokens: int | None, flops: float | None, peak_flops: float | None, devices: int,
                peak_bytes: int | None) -> dict[str, Any]:
    """One line of ``metrics.jsonl`` from what a step measured (rates derived here).

    Args:
        step: the step number (1 = the first update).
        loss, lr, grad_norm: the step's global loss, learning rate and pre-clipping norm.
        time_s: the step's wall time.
        samples, tokens: per step over all devices (tokens None: no token inputs).
        flops: the model's training FLOPs per step (None: unknown, then ``mfu`` is None).
        peak_flops: one device's peak FLOP/s for the run's dtype.
        devices: the run's device count.
        peak_bytes: the largest per-device peak memory so far (None: not measured).

    Example:
        >>> step_record(step=1, loss=1.0, lr=0.1, grad_norm=None, time_s=0.0, samples=4, tokens=None,
        ...             flops=None, peak_flops=None, devices=1, peak_bytes=None)["samples_per_s"] is None
        True
    """
    rate = (lambda n: n / time_s if n is not None and time_s > 0 else None)
    mfu = None
    if flops and peak_flops and time_s > 0:
        mfu = flops / time_s / (peak_flops * devices)
    values = {"step": int(step), "loss": _num(loss), "lr": _num(lr), "grad_norm": _num(grad_norm),
              "time_s": _num(time_s), "samples_per_s": rate(samples), "tokens_per_s": rate(tokens),
              "mfu": mfu,
              "peak_bytes": int(peak_bytes) if peak_bytes is not None else None}
    return {k: values[k] for k in METRIC_KEYS}


def _num(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


class MetricsLogger:
    """Writes one complete JSON object per line and flushes it (readable while the run goes).

    Args:
        sink: a path (created with its folder, appended to: a resumed run continues the file) or a
            text stream.
        keys: the keys every line carries (missing values are written as null; others refused).
        tensorboard: an optional :class:`TensorBoardWriter` that gets the same scalars.
        prefix: the TensorBoard tag prefix (``train/``, ``val/``).
        after_step: the step the run starts after (0 fresh, else the resumed checkpoint's): the
            file's lines of later steps, or not whole (a run killed while writing, or restarted
            before its first checkpoint), are dropped, so every step appears once.

    Example:
        >>> import io
        >>> out = io.StringIO(); MetricsLogger(out, keys=("step", "loss")).log({"step": 3, "loss": 0.5})
        >>> out.getvalue()
        '{"step": 3, "loss": 0.5}\\n'
        >>> import tempfile; path = Path(tempfile.mkdtemp()) / "m.jsonl"
        >>> _ = path.write_text('{"step": 1}\\n{"step": 2}\\n{"step": 3}\\n{"ste')
        >>> MetricsLogger(path, keys=("step",), after_step=2).close(); path.read_text()
        '{"step": 1}\\n{"step": 2}\\n'
    """

    def __init__(self, sink: str | os.PathLike | TextIO, keys: tuple[str, ...] = METRIC_KEYS,
                 tensorboard: TensorBoardWriter | None = None, prefix: str = "train/",
                 after_step: int | None = None):
        if isinstance(sink, (str, os.PathLike)):
            Path(sink).parent.mkdir(parents=True, exist_ok=True)
            if after_step is not None:
                _keep_steps_upto(Path(sink), after_step)
            self.stream, self._owned = open(sink, "a", buffering=1), True
        else:
            self.stream, self._owned = sink, False
        self.keys, self.tensorboard, self.prefix = tuple(keys), tensorboard, prefix

    def log(self, record: dict[str, Any]) -> None:
        """Write ``record`` (its keys among ``keys``) as one line, flushed; and to TensorBoard."""
        extra = set(record) - set(self.keys)
        if extra:
            raise ValueError(f"metrics line with keys {sorted(extra)} beyond the contract {list(self.keys)}")
        row = {k: record.get(k) for k in self.keys}
        self.stream.write(json.dumps(row) + "\n")
        self.stream.flush()
        if self.tensorboard is not None:
            self.tensorboard.scalars(row, self.prefix)

    def close(self) -> None:
        """Close the file (a stream given by the caller is left open) and the TensorBoard writer."""
        if self._owned:
            self.stream.close()
        if self.tensorboard is not None:
            self.tensorboard.close()


def _keep_steps_upto(path: Path, step: int) -> None:
    """Rewrite ``path`` (atomically) keeping its whole JSON lines of steps <= ``step``."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
            kept.append(line + "\n")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(kept))
    tmp.replace(path)


class TensorBoardWriter:
    """The metrics as TensorBoard scalars (torch's ``SummaryWriter``; ``pip install tensoropt[tensorboard]``).

    Example:
        >>> import tempfile
        >>> tb = TensorBoardWriter(tempfile.mkdtemp())  # doctest: +SKIP
    """

    def __init__(self, directory: str | os.PathLike):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError(f"metrics.tensorboard: {e}; install the extra: "
                              "pip install 'tensoropt[tensorboard]'") from None
        self.writer = SummaryWriter(str(directory))

    def scalars(self, row: dict[str, Any], prefix: str = "train/") -> None:
        """``add_scalar`` of every numeric value but the step, at ``row["step"]``."""
        for k, v in row.items():
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                self.writer.add_scalar(prefix + k, v, row["step"])
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()


def writable_directory_error(path: str | os.PathLike, key: str) -> str | None:
    """None when ``path`` is (or can be made) a writable directory, else a one-line error naming ``key``.

    Example:
        >>> writable_directory_error("/proc/no/such", "metrics.tensorboard")[:41]
        'metrics.tensorboard: cannot write to /pro'
    """
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / f".tensoropt-write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        return f"{key}: cannot write to {p} ({e.strerror or e}); give a writable directory"
    return None


class ProgressLine:
    """The progress line of a run: ``step 120/200 [######....] 60%  ETA 1m12s  loss 3.412  lr 2.9e-04``.

    On a terminal it redraws one line; otherwise (logs) each call prints a line.

    Example:
        >>> import io
        >>> out = io.StringIO(); bar = ProgressLine(10, stream=out, width=10)
        >>> bar.update(5, loss=2.0, lr=1e-3); "step 5/10 [#####.....]  50%" in out.getvalue()
        True
    """

    def __init__(self, total_steps: int, stream: TextIO | None = None, width: int = 20, first_step: int = 0):
        import sys

        self.total, self.width = int(total_steps), width
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start, self.first_step = time.perf_counter(), first_step

    def update(self, step: int, loss: float | None = None, lr: float | None = None) -> None:
        """Draw the line for ``step`` steps done (ETA from the steps done since this line started)."""
        fraction = min(1.0, step / max(1, self.total))
        filled = int(round(fraction * self.width))
        elapsed, done = time.perf_counter() - self.start, step - self.first_step
        eta = elapsed / done * (self.total - step) if done > 0 else None
        bar = "#" * filled + "." * (self.width - filled)
        parts = [f"step {step}/{self.total} [{bar}] {fraction * 100:3.0f}%",
                 f"ETA {_duration(eta)}" if eta is not None else "ETA -"]
        if loss is not None:
            parts.append(f"loss {loss:.4f}")
        if lr is not None:
            parts.append(f"lr {lr:.3g}")
        line = "  ".join(parts)
        self.stream.write("\r\x1b[2K" + line if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the line on a terminal."""
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _duration(seconds: float) -> str:
    """``1h02m``, ``3m07s`` or ``12s``.

    Example:
        >>> _duration(3725), _duration(187), _duration(12.4)
        ('1h02m', '3m07s', '12s')
    """
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"
