"""Shared benchmark helpers: a throwaway server, percentiles, a table."""

from __future__ import annotations

import contextlib
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ledger.server import EmbeddedServer, ServerState


@contextlib.contextmanager
def server(sync_always: bool = True) -> Iterator[ServerState]:
    with tempfile.TemporaryDirectory(prefix="runledger-bench-") as tmp:
        srv = EmbeddedServer(home=Path(tmp) / "home")
        state = srv.start(data_dir=Path(tmp) / "data", sync_always=sync_always)
        try:
            yield state
        finally:
            srv.stop()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": statistics.median(values),
        "p99": pct(values, 0.99),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
