"""Run selection: the run ids a SQL condition over the projection's ``runs`` table selects.

What ``runledger export --where`` resolves before it hands the runs to a mode (``export otlp``,
``export jsonl``), so the modes read runs from the log by id and import nothing of this package; and
what a sweep (``runledger rerun --where``) re-drives. Recorded runs only unless ``branches``: the
branches of re-runs (``parent_run_id`` set) would otherwise outnumber them after a sweep or two
(``export --branches`` asks for them too).
"""

from __future__ import annotations

from pathlib import Path

from runledger.log.client import LedgerClient
from runledger.projections.projector import default_db_path, project
from runledger.projections.queries import run_sql
from runledger.projections.store import ProjectionStore


async def select_runs(
    client: LedgerClient, where: str, db: Path | None = None, *, sync: bool = True, branches: bool = False
) -> list[str]:
    """Run ids matching a SQL condition over the projection's ``runs`` table, oldest first; the branches
    of re-runs only with ``branches``.

    Catches the DuckDB file (default ``$RUNLEDGER_HOME/ledger.duckdb``) up with the stream first
    unless ``sync`` is false. Raises QueryError naming the condition when DuckDB refuses it."""
    path = db or default_db_path()
    if sync:
        await project(client, path)
    condition = f"({where})" if branches else f"parent_run_id IS NULL AND ({where})"
    with ProjectionStore(path, writer=False) as store:
        rows = run_sql(store.con, f"SELECT run_id FROM runs WHERE {condition} ORDER BY started_at, run_id").rows
    return [str(r[0]) for r in rows]
