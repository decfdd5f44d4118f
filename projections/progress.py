"""The progress line of long projections: events/s, position and lag, on stderr."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressLine:
    """Rewrites one line on a terminal (``\\r``); prints a line every few seconds otherwise."""

    def __init__(self, stream: TextIO | None = None, *, interval: float = 0.5, enabled: bool = True) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = self.stream.isatty()
        self.interval = interval if self.tty else max(interval, 5.0)
        self.started = time.monotonic()
        self._last = 0.0
        self._drawn = False
        self._printed = False

    @property
    def shown(self) -> bool:
        """Whether anything was printed yet (short work prints nothing)."""
        return self._drawn or self._printed

    def update(self, *, events: int, position: int, lag: int, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        elapsed = max(now - self.started, 1e-9)
        text = f"projected {events:,} events ({events / elapsed:,.0f} ev/s), position {position:,}, lag {lag:,}"
        if self.tty:
            self.stream.write("\r" + text.ljust(78))
            self._drawn = True
        else:
            self.stream.write(text + "\n")
            self._printed = True
        self.stream.flush()

    def done(self, text: str) -> None:
        if not self.enabled:
            return
        if self._drawn:
            self.stream.write("\r" + " " * 78 + "\r")
        self.stream.write(text + "\n")
        self.stream.flush()
