"""A dependency-free progress bar for the command line (written to stderr)."""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

__all__ = ["ProgressBar"]


class ProgressBar:
    """``label [########------------]  40%  2/5`` redrawn in place, at most 20 times a second
    on a terminal and once a second otherwise (logs stay short).

    Call :meth:`update` with the amount done (and optionally a new total), then
    :meth:`close`. Also usable as a context manager.
    """

    def __init__(self, label: str, total: int, *, unit: str = "", width: int = 30,
                 stream: Optional[TextIO] = None) -> None:
        self.label = label
        self.total = max(0, total)
        self.unit = unit
        self.width = width
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self._last_draw = 0.0
        self._interval = 0.05 if self.stream.isatty() else 1.0
        self._closed = False

    def __enter__(self) -> "ProgressBar":
        self._draw()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, done: int, total: Optional[int] = None) -> None:
        """Sets the amount done (and the total, if it changed)."""
        if total is not None:
            self.total = max(0, total)
        self.done = max(0, done)
        now = time.monotonic()
        if now - self._last_draw >= self._interval:
            self._draw()

    def _format(self, n: int) -> str:
        if self.unit == "B":
            return f"{n / 1e6:.1f} MB"
        return f"{n}{self.unit}"

    def _draw(self) -> None:
        fraction = min(1.0, self.done / self.total) if self.total else 0.0
        filled = int(round(fraction * self.width))
        bar = "#" * filled + "-" * (self.width - filled)
        self._last_draw = time.monotonic()
        self.stream.write(
            f"\r{self.label} [{bar}] {fraction * 100:3.0f}%  {self._format(self.done)}/{self._format(self.total)}"
        )
        self.stream.flush()

    def close(self) -> None:
        """Draws the final state and ends the line."""
        if not self._closed:
            self._draw()
            self.stream.write("\n")
            self.stream.flush()
            self._closed = True
