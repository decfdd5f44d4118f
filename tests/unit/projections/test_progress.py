"""The progress line and what follows it print on separate lines, on a terminal and in a log."""

from __future__ import annotations

import io
import os
import shutil

import pytest

from runledger.projections.progress import ProgressLine


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def lines(text: str) -> list[str]:
    """What a terminal recording (or a CI log) shows: each line as its last redraw left it."""
    return [line.rsplit("\r", 1)[-1] for line in text.split("\n")]


def test_on_a_terminal_the_summary_is_a_line_of_its_own_below_the_last_progress_line() -> None:
    out = Terminal()
    progress = ProgressLine(out, interval=0.0)
    progress.update(events=10, position=10, lag=90, force=True)
    progress.update(events=100, position=100, lag=0, force=True)
    progress.say("following the stream into x.duckdb")
    progress.update(events=150, position=150, lag=0, force=True)
    progress.done("projected 150 events in 0.1s; position 150 of 150; x.duckdb")
    shown = lines(out.getvalue())
    assert shown[0].startswith("projected 100 events (") and shown[0].rstrip().endswith("lag 0")
    assert shown[1] == "following the stream into x.duckdb"
    assert shown[2].startswith("projected 150 events (") and "position 150" in shown[2]
    assert shown[3] == "projected 150 events in 0.1s; position 150 of 150; x.duckdb"
    assert shown[4] == ""  # the output ends with a newline: whatever comes next starts a line


def test_in_a_log_every_progress_report_is_a_line() -> None:
    out = io.StringIO()
    progress = ProgressLine(out, interval=0.0)
    progress.update(events=5, position=5, lag=0, force=True)
    progress.done("done")
    first, second = out.getvalue().splitlines()
    assert first.startswith("projected 5 events (") and second == "done"


def test_a_terminal_line_is_never_wider_than_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "get_terminal_size", lambda fallback=(80, 24): os.terminal_size((40, 24)))
    out = Terminal()
    ProgressLine(out, interval=0.0).update(events=12_345_678, position=12_345_678, lag=98_765_432, force=True)
    assert all(len(line.rsplit("\r", 1)[-1]) <= 39 for line in out.getvalue().split("\n"))
