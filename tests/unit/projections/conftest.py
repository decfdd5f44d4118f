"""Fixtures of the projection unit tests: a DuckDB file in tmp_path (DuckDB is a library, not a service)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runledger.projections.projector import Projector
from runledger.projections.store import ProjectionStore, StreamIdentity

IDENTITY = StreamIdentity(stream="LEDGER", created="2026-03-01T00:00:00.000000001Z", server_name="n1")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ProjectionStore]:
    s = ProjectionStore(tmp_path / "p.duckdb")
    s.bind(IDENTITY, 1)
    try:
        yield s
    finally:
        s.close()


def projector_for(store: ProjectionStore, **kwargs: Any) -> Projector:
    """A projector without a stream: tests hand it batches with ``project_batch``."""
    return Projector(None, store, **kwargs)  # type: ignore[arg-type]
