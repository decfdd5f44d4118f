"""Whole-table snapshots of a projection file, in a stable order, for equality checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb

DERIVED = ("events", "quarantine", "runs", "steps", "checkpoints", "effect_keys", "effects", "approvals")
_ORDER = {
    "events": "stream_seq",
    "quarantine": "stream_seq",
    "runs": "run_id",
    "steps": "run_id, step",
    "checkpoints": "run_id",
    "effect_keys": "subject",
    "effects": "run_id, step, key",
    "approvals": "run_id, step",
}


def table_rows(con: Any, table: str) -> list[tuple[Any, ...]]:
    """Every row of ``table`` in a stable order."""
    return list(con.execute(f"SELECT * FROM {table} ORDER BY {_ORDER[table]}").fetchall())


def snapshot(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every derived table and the projector's position (not its timing) of the file at ``path``."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        out = {table: table_rows(con, table) for table in DERIVED}
        out["projector_state"] = con.execute(
            "SELECT stream, stream_created, first_seq, last_seq, events, quarantined FROM projector_state"
        ).fetchall()
        return out
    finally:
        con.close()
