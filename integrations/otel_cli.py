"""``runledger export otlp``: recorded runs as OTLP/HTTP traces (runledger.integrations.otel).

A mode of the projections package's ``export`` command, added through the ``runledger.export``
entry point (``register(modes, parents)``), so that package imports nothing of this one. This
module imports neither OpenTelemetry nor DuckDB: without the ``otel`` extra the command says
which extra to install.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

from runledger import ConfigurationError, require_extra
from runledger.cli.connect import with_client  # CLI glue: the connection options `export` parses

if TYPE_CHECKING:  # the NATS client loads when the command connects, not when `export` is registered
    from runledger import LedgerClient

# What the OpenTelemetry SDK reads, in the order it reads them; --endpoint wins over both.
_ENDPOINT_ENV = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def _endpoint(args: argparse.Namespace) -> str:
    found = args.endpoint or next((os.environ[n] for n in _ENDPOINT_ENV if os.environ.get(n)), None)
    if not found:
        raise ConfigurationError(
            "`runledger export otlp` needs the collector's URL: --endpoint http://localhost:4318 "
            "(or OTEL_EXPORTER_OTLP_ENDPOINT)"
        )
    return found


def _headers(items: list[str]) -> dict[str, str] | None:
    headers = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigurationError(f"--header {item!r} is not NAME=VALUE")
        headers[name.strip()] = value
    return headers or None


def cmd_export_otlp(args: argparse.Namespace) -> int:
    require_extra("otel", "`runledger export otlp`")
    from runledger.integrations.otel import export_runs, follow_runs, otlp_exporter

    if not (args.runs or args.where or args.follow):
        raise ConfigurationError("name the runs to export: RUN ..., --where SQL over runs, or --follow")
    endpoint = _endpoint(args)
    exporter = otlp_exporter(endpoint, headers=_headers(args.header), timeout=args.timeout)

    def sent(run_id: str, trace_id: str, spans: int) -> None:
        print(f"{run_id}  trace {trace_id}  {spans} spans", flush=True)

    async def go(client: LedgerClient) -> int:
        run_ids = await args.select_runs(client)
        if args.where and not run_ids and not args.follow:
            print(f"no recorded run matches: {args.where}")
            return 0
        options: dict[str, Any] = {"content": args.content, "service_name": args.service_name, "on_run": sent}
        result = await export_runs(client, run_ids, exporter, **options)
        if not args.follow:
            print(f"exported {len(result.runs)} runs ({result.spans} spans) to {endpoint}")
            return 0
        import asyncio

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        print("exporting runs as they settle; Ctrl-C stops", file=sys.stderr, flush=True)
        await follow_runs(client, exporter, stop, **options)
        return 0

    try:
        return with_client(args, go)
    finally:
        exporter.shutdown()


def register(modes: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Entry point of ``export otlp`` (group ``runledger.export``): ``parents`` are the options
    every ``export`` takes (the connection, ``--db``, ``--no-sync``, and the selection: RUN ids or
    ``--where``, which the command resolves into ``args.select_runs``)."""
    p = modes.add_parser(
        "otlp", parents=parents, help="send runs as OpenTelemetry traces to an OTLP/HTTP collector (docs/otel.md)"
    )
    p.add_argument("--endpoint", metavar="URL", help="the collector, e.g. http://localhost:4318 (/v1/traces added)")
    p.add_argument("--follow", action="store_true", help="then keep exporting runs as they settle, until Ctrl-C")
    p.add_argument(
        "--content", action="store_true", help="include messages, tool arguments and results (as the run recorded them)"
    )
    p.add_argument("--service-name", metavar="NAME", help="the traces' service.name (default: the run's agent)")
    p.add_argument("--header", action="append", default=[], metavar="NAME=VALUE", help="an HTTP header (repeatable)")
    p.add_argument("--timeout", type=float, default=10.0, metavar="S", help="seconds a request (default 10)")
    p.set_defaults(func=cmd_export_otlp)
