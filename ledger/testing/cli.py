"""``runledger export jsonl``: recorded runs to a recording file, for the in-process replayer.

A mode of the projections package's ``export`` command, added through the ``runledger.export``
entry point (``register(modes, parents)``), beside ``export --parquet`` (the projection's tables) and
``export otlp`` (traces). The runs are read from the log with their content opened, so this needs
the credentials (and master key) that may read them. The ``export`` command resolves the runs
(RUN ids, or ``--where`` over the projection) into ``args.select_runs``: nothing here reads the projection.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runledger.cli.connect import with_client
from runledger.errors import ConfigurationError

if TYPE_CHECKING:  # the NATS client loads when the command connects, not when `export` is registered
    from runledger.log.client import LedgerClient


def cmd_export_jsonl(args: argparse.Namespace) -> int:
    from runledger.testing.export import export_runs

    if not (args.runs or args.where):
        raise ConfigurationError("name the runs to export: RUN ... or --where SQL over the runs table")
    out = Path(args.out)

    async def go(client: LedgerClient) -> int:
        run_ids = await args.select_runs(client)
        if not run_ids:
            print(f"no recorded run matches: {args.where}")
            return 0
        result = await export_runs(client, run_ids, out)
        print(f"exported {len(result.runs)} runs ({result.events} events) to {out}")
        return 0

    return with_client(args, go)


def register(modes: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Entry point of ``export jsonl`` (group ``runledger.export``): ``parents`` bring the connection,
    ``--db``, ``--no-sync`` and the selection (RUN ids or ``--where``)."""
    p = modes.add_parser(
        "jsonl", parents=parents,
        help="write runs, content opened, to a recording file for the in-process replayer (docs/testing.md)",
    )  # fmt: skip
    p.add_argument("--out", "-o", required=True, metavar="FILE", help="the recording file to write (replaced)")
    p.set_defaults(func=cmd_export_jsonl)
