"""The ``projections`` package's sub-commands of ``runledger``: project, sql, export, failures, quarantine.

Registered through the ``runledger.commands`` entry point (``register(sub, common)``).
Every command takes ``--db PATH`` (default ``$RUNLEDGER_HOME/ledger.duckdb``); the reading
commands catch the file up with the stream first unless ``--no-sync`` is given.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from runledger.cli.connect import with_client
from runledger.cli.registry import registered
from runledger.errors import ConfigurationError
from runledger.projections.progress import ProgressLine
from runledger.projections.queries import FORMATS

# Registering the commands builds parsers only: DuckDB, pyarrow and the projector load in the
# commands that use them, not for `runledger --help` (tests/unit/test_cli_imports.py).
if TYPE_CHECKING:
    from runledger.log.client import LedgerClient
    from runledger.projections.projector import ProjectResult
    from runledger.projections.store import ProjectionStore

T = TypeVar("T")


def _db(args: argparse.Namespace) -> Path:
    from runledger.projections.projector import default_db_path

    return Path(args.db) if args.db else default_db_path()


def _summary(result: ProjectResult) -> str:
    what = "rebuilt" if result.rebuilt else "projected"
    text = (
        f"{what} {result.events:,} events"
        + (f" ({result.quarantined:,} quarantined: `runledger quarantine`)" if result.quarantined else "")
        + f" in {result.seconds:.1f}s ({result.rate:,.0f} ev/s); position {result.position:,} "
        f"of {result.stream_last_seq:,}; {result.path}"
    )
    return text


def _sync(args: argparse.Namespace, *, quiet: bool) -> ProjectResult:
    """Catch the file up with the stream, printing progress only when it takes a while."""
    from runledger.projections.projector import project

    progress = ProgressLine(enabled=True)
    result = with_client(args, lambda c: project(c, _db(args), progress=progress))
    if not quiet or progress.shown:
        progress.done(_summary(result))
    return result


def cmd_project(args: argparse.Namespace) -> int:
    import asyncio

    from runledger.projections.errors import StreamReadError
    from runledger.projections.projector import project, rebuild

    path = _db(args)
    progress = ProgressLine(enabled=not args.quiet)

    async def go(client: LedgerClient) -> int:
        options: dict[str, Any] = {"reader": args.reader, "workers": args.workers}
        if args.batch is not None:
            options["batch_size"] = args.batch
        if args.rebuild:
            progress.done(_summary(await rebuild(client, path, progress=progress, **options)))
        if not args.follow:
            if not args.rebuild:
                progress.done(_summary(await project(client, path, progress=progress, **options)))
            return 0
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        progress.say(f"following the stream into {path}; Ctrl-C stops after the batch in hand")
        result: ProjectResult | None = None
        backoff = 1.0
        while not stop.is_set():
            try:
                result = await project(client, path, follow=True, stop=stop, progress=progress, **options)
            except StreamReadError as exc:
                # The server went away or the read broke off: everything up to the last batch is
                # committed, so start again from there once the server answers.
                progress.say(f"runledger: {exc}; following again in {backoff:g}s")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=backoff)
                backoff = min(backoff * 2, 30.0)
        if result is not None:
            progress.done(_summary(result))
        return 0

    return with_client(args, go)


def _open_for_reading(args: argparse.Namespace) -> ProjectionStore:
    from runledger.projections.store import ProjectionStore

    if not args.no_sync:
        _sync(args, quiet=True)
    return ProjectionStore(_db(args), writer=False)


def _reading(args: argparse.Namespace, work: Callable[[Any], T]) -> T:
    """``work(con)`` on the projection, caught up first unless --no-sync; with --content, in a session
    that opens content for this caller (runledger.projections.content), or ContentNotGrantedError."""
    from runledger.projections.content import content_session

    with _open_for_reading(args) as store:
        if not args.content:
            return work(store.con)
        return with_client(args, lambda client: content_session(client, store.con, work))


def cmd_sql(args: argparse.Namespace) -> int:
    from runledger.projections.queries import format_result, run_sql

    result = _reading(args, lambda con: run_sql(con, args.query))
    print(format_result(result, args.format))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    if not args.parquet:
        raise ConfigurationError("`runledger export` needs --parquet DIR, or a mode: `runledger export otlp -h`")
    from runledger.projections.queries import export_parquet

    counts = _reading(args, lambda con: export_parquet(con, Path(args.parquet)))
    for name, rows in counts.items():
        print(f"{name:<12} {rows:>10,} rows  -> {Path(args.parquet) / name}")
    return 0


def _selecting(mode: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A mode's command, handed the run selection: ``args.select_runs(client)`` is the RUN ids given,
    or the ids ``--where`` selects from the projection (caught up first unless ``--no-sync``)."""

    def run(args: argparse.Namespace) -> int:
        if args.runs and args.where:
            raise ConfigurationError("give RUN ids or --where, not both")

        async def selected(client: LedgerClient) -> list[str]:
            from runledger.projections.selection import select_runs

            if not args.where:
                return list(args.runs)
            return await select_runs(client, args.where, _db(args), sync=not args.no_sync, branches=args.branches)

        args.select_runs = selected
        return mode(args)

    return run


def cmd_failures(args: argparse.Namespace) -> int:
    """The classes of failure of recorded runs (runledger.projections.failures), the most frequent first."""
    from runledger.projections.failures import failure_classes, render_classes

    classes = _reading(args, lambda con: failure_classes(con, agent=args.agent))
    if args.json:
        print(json.dumps([c.to_dict() for c in classes], indent=2, ensure_ascii=False))
    else:
        print(render_classes(classes))
    return 0


def cmd_quarantine(args: argparse.Namespace) -> int:
    from runledger.projections.queries import format_result, quarantined

    with _open_for_reading(args) as store:
        result = quarantined(store.con, args.limit)
    if args.json:
        print(format_result(result, "json"))
    elif not result.rows:
        print("nothing quarantined: every message on the stream decoded as a valid event")
    else:
        print(format_result(result, "table", max_width=80))
        print('raw bytes: runledger sql "SELECT raw FROM quarantine WHERE stream_seq = N" --format json')
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Entry point of the ``projections`` package's sub-commands."""
    db = argparse.ArgumentParser(add_help=False)
    db.add_argument("--db", metavar="PATH", help="the DuckDB file (default: $RUNLEDGER_HOME/ledger.duckdb)")
    reading = argparse.ArgumentParser(add_help=False)
    reading.add_argument("--no-sync", action="store_true", help="do not catch up with the stream first")

    p = sub.add_parser(
        "project", parents=[common, db], help="project the ledger stream into DuckDB (catch up, --follow, --rebuild)"
    )
    p.add_argument("--follow", action="store_true", help="keep projecting new events until Ctrl-C")
    p.add_argument("--rebuild", action="store_true", help="project from the first event into a fresh file, then swap")
    p.add_argument("--batch", type=_positive, default=None,
                   help="events a transaction (default 20000; 60000 with --rebuild)")  # fmt: skip
    p.add_argument(
        "--workers", type=int, default=None, metavar="N",
        help="processes that decode and fold, for backlogs of 50,000 events or more (default: one per core, max 4)",
    )  # fmt: skip
    p.add_argument("--reader", choices=["auto", "pull", "ordered"], default="auto", help=argparse.SUPPRESS)
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(func=cmd_project)

    content = argparse.ArgumentParser(add_help=False)
    content.add_argument(
        "--content", action="store_true",
        help="open content (arguments, results, messages: redacted, as recorded) for this caller, who must hold "
        "the master key and a login that reads run keys (docs/tables.md, 'Content')",
    )  # fmt: skip

    p = sub.add_parser(
        "sql", parents=[common, db, reading, content], help="run SQL on the projection (tables: docs/tables.md)"
    )
    p.add_argument("query", help='e.g. "SELECT status, count(*) FROM runs GROUP BY ALL"')
    p.add_argument("--format", choices=FORMATS, default="table")
    p.set_defaults(func=cmd_sql)

    p = sub.add_parser(
        "export",
        parents=[common, db, reading, content],
        help="write the projection as partitioned Parquet (or: export otlp)",
    )
    p.add_argument("--parquet", metavar="DIR", help="directory to write <table>/... files into")
    p.set_defaults(func=cmd_export)
    # Other packages add modes (`export otlp`, `export jsonl`) through entry points: none is imported here. The
    # command owns the run selection the modes share (RUN ids or --where) and resolves it for them.
    selection = argparse.ArgumentParser(add_help=False)
    selection.add_argument("runs", nargs="*", metavar="RUN", help="run ids to export")
    selection.add_argument("--where", metavar="SQL", help="export every run matching this condition on the runs table")
    selection.add_argument("--branches", action="store_true",
                           help="with --where: branches of re-runs too (recorded runs only by default)")  # fmt: skip
    modes = registered("runledger.export")  # sorted by name
    if modes:
        targets = p.add_subparsers(dest="export_mode", metavar="MODE")
        for ep in modes:
            ep.load()(targets, [common, db, reading, selection])
            mode = targets.choices[ep.name]
            mode.set_defaults(func=_selecting(mode.get_default("func")))

    p = sub.add_parser(
        "failures", parents=[common, db, reading, content],
        help="group failed runs into classes (error type, failing step, message with values masked): counts, "
        "first and last seen, example runs (docs/tables.md, 'failure_classes')",
    )  # fmt: skip
    p.add_argument("--agent", metavar="NAME", help="only this agent's runs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_failures)

    p = sub.add_parser("quarantine", parents=[common, db, reading], help="list messages that are not valid events")
    p.add_argument("--limit", type=_positive)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_quarantine)
