"""Shared benchmark helpers: a throwaway server, percentiles, a table."""

from __future__ import annotations

import base64
import contextlib
import math
import os
import statistics
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from runledger.log.server import EmbeddedServer, ServerState


@contextlib.contextmanager
def server(sync_always: bool = True) -> Iterator[ServerState]:
    # Run keys are wrapped under a master key kept outside NATS: a bench's ledger lives as long as
    # the bench, so an ephemeral one serves (inherited by the processes the bench starts).
    os.environ.setdefault("RUNLEDGER_MASTER_KEY", base64.b64encode(os.urandom(32)).decode())
    with tempfile.TemporaryDirectory(prefix="runledger-bench-") as tmp:
        srv = EmbeddedServer(home=Path(tmp) / "home")
        state = srv.start(data_dir=Path(tmp) / "data", sync_always=sync_always)
        try:
            yield state
        finally:
            srv.stop()


def jetstream_sync(state: ServerState) -> str:
    """The ``sync_interval`` line of the server's config (absent: nats-server's default, 2 minutes)."""
    config = Path(state.log).parent / "nats-server.conf"
    for line in config.read_text().splitlines():
        if "sync_interval" in line:
            return line.strip()
    return "sync_interval: 2m (default)"


def pct(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile by nearest rank (p99 of 100 samples is the 99th smallest)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summary(values: Sequence[float]) -> dict[str, float]:
    """median, p99, min, max and n of a list of samples."""
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
