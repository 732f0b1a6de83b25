"""A plain progress bar on stderr (no dependency), for long computations.

On a terminal it redraws one line; otherwise (logs, CI) it prints a line when the message
changes, and at most every ``log_every_s`` seconds while it does not, so logs stay short.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    """Callable ``(message, fraction)`` that draws ``[#####.....]  42%  12.3s  message``.

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> bar = ProgressBar(stream=out, width=10)
        >>> bar("solving d8", 0.5); bar.close()
        >>> "[#####.....]  50%" in out.getvalue()
        True
    """

    def __init__(
        self, stream: TextIO | None = None, width: int = 30, enabled: bool = True, log_every_s: float = 5.0
    ):
        self.stream = stream if stream is not None else sys.stderr
        self.width, self.enabled, self.log_every_s = width, enabled, log_every_s
        self.start = time.perf_counter()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_message: str | None = None
        self._last_print_s = 0.0
        self._drawn = False

    def __call__(self, message: str, fraction: float) -> None:
        """Report that ``fraction`` (0..1) of the work is done, now doing ``message``."""
        if not self.enabled:
            return
        fraction = min(1.0, max(0.0, fraction))
        now = time.perf_counter()
        if not self.tty and message == self._last_message and now - self._last_print_s < self.log_every_s:
            return
        self._last_message, self._last_print_s = message, now
        filled = int(round(fraction * self.width))
        line = (
            f"[{'#' * filled}{'.' * (self.width - filled)}] {fraction * 100:3.0f}%  "
            f"{time.perf_counter() - self.start:6.1f}s  {message}"
        )
        if self.tty:
            self.stream.write("\r\x1b[2K" + line[:200])
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """End the bar's line (on a terminal)."""
        if self.enabled and self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
        self._drawn = False
