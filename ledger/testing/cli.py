"""``runledger export jsonl``: recorded runs to a recording file, for the in-process replayer.

A mode of the projections package's ``export`` command, added through the ``runledger.export``
entry point (``register(modes, parents)``), beside ``export --parquet`` (the projection's tables) and
``export otlp`` (traces). The runs are read from the log with their content opened, so this needs
the credentials (and master key) that may read them; ``--where`` selects them from the projection.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from runledger.cli.connect import with_client
from runledger.errors import ConfigurationError
from runledger.extras import require_extra
from runledger.log.client import LedgerClient


async def _where(client: LedgerClient, where: str, db: Path | None, sync: bool) -> list[str]:
    """Run ids matching ``where`` over the projection's ``runs`` table, oldest first."""
    require_extra("projections", "`runledger export jsonl --where`")
    from runledger.projections.projector import default_db_path, project
    from runledger.projections.queries import run_sql
    from runledger.projections.store import ProjectionStore

    path = db or default_db_path()
    if sync:
        await project(client, path)
    with ProjectionStore(path, writer=False) as store:
        rows = run_sql(store.con, f"SELECT run_id FROM runs WHERE ({where}) ORDER BY started_at, run_id").rows
    return [str(r[0]) for r in rows]


def cmd_export_jsonl(args: argparse.Namespace) -> int:
    from runledger.testing.export import export_runs

    if args.runs and args.where:
        raise ConfigurationError("give RUN ids or --where, not both")
    if not (args.runs or args.where):
        raise ConfigurationError("name the runs to export: RUN ... or --where SQL over the runs table")
    out = Path(args.out)

    async def go(client: LedgerClient) -> int:
        run_ids = list(args.runs)
        if args.where:
            run_ids = await _where(client, args.where, Path(args.db) if args.db else None, not args.no_sync)
            if not run_ids:
                print(f"no recorded run matches: {args.where}")
                return 0
        result = await export_runs(client, run_ids, out)
        print(f"exported {len(result.runs)} runs ({result.events} events) to {out}")
        return 0

    return with_client(args, go)


def register(modes: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Entry point of ``export jsonl`` (group ``runledger.export``)."""
    p = modes.add_parser(
        "jsonl", parents=parents,
        help="write runs, content opened, to a recording file for the in-process replayer (docs/testing.md)",
    )  # fmt: skip
    p.add_argument("runs", nargs="*", metavar="RUN", help="run ids to export")
    p.add_argument("--where", metavar="SQL", help="export every run matching this condition on the runs table")
    p.add_argument("--out", "-o", required=True, metavar="FILE", help="the recording file to write (replaced)")
    p.set_defaults(func=cmd_export_jsonl)
