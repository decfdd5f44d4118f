"""Run selection: the run ids a SQL condition over the projection's ``runs`` table selects.

What ``runledger export --where`` resolves before it hands the runs to a mode (``export otlp``,
``export jsonl``), so the modes read runs from the log by id and import nothing of this package.
"""

from __future__ import annotations

from pathlib import Path

from runledger.log.client import LedgerClient
from runledger.projections.projector import default_db_path, project
from runledger.projections.queries import run_sql
from runledger.projections.store import ProjectionStore


async def select_runs(client: LedgerClient, where: str, db: Path | None = None, *, sync: bool = True) -> list[str]:
    """Run ids matching a SQL condition over the projection's ``runs`` table, oldest first.

    Catches the DuckDB file (default ``$RUNLEDGER_HOME/ledger.duckdb``) up with the stream first
    unless ``sync`` is false. Raises QueryError naming the condition when DuckDB refuses it."""
    path = db or default_db_path()
    if sync:
        await project(client, path)
    with ProjectionStore(path, writer=False) as store:
        rows = run_sql(store.con, f"SELECT run_id FROM runs WHERE ({where}) ORDER BY started_at, run_id").rows
    return [str(r[0]) for r in rows]
