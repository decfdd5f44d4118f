"""The progress line of long projections: events/s, position and lag, on stderr.

Every line it prints is a line of its own: the last progress line drawn on a terminal is ended with
a newline before anything else is printed (the summary, a message while following, a query's rows),
so a terminal, a terminal recording and a CI log all show the counts and the progress text on
separate lines. A drawn line is cut to the terminal's width, since a line that wraps cannot be
redrawn in place (``\\r`` returns only to the start of its last row).
"""

from __future__ import annotations

import shutil
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
        self._drawn = False  # ever drawn in place (a terminal)
        self._open = False  # a drawn line not yet ended by a newline
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
            width = max(shutil.get_terminal_size((80, 24)).columns - 1, 20)
            self.stream.write("\r" + text[:width].ljust(min(width, 78)))
            self._drawn = self._open = True
        else:
            self.stream.write(text + "\n")
            self._printed = True
        self.stream.flush()

    def end_line(self) -> None:
        """End a line drawn in place, so what is printed next starts a line of its own."""
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False

    def say(self, text: str) -> None:
        """Print ``text`` on a line of its own, below the progress line (even when disabled)."""
        self.end_line()
        self.stream.write(text + "\n")
        self.stream.flush()

    def done(self, text: str) -> None:
        """The summary, on a line of its own below the last progress line."""
        if not self.enabled:
            return
        self.say(text)
