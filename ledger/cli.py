"""The ``runledger`` command: assembles the sub-commands each package owns.

Packages register through the ``runledger.commands`` entry-point group (see
pyproject.toml), each with ``register(subparsers, common)``, so ``ledger`` never
imports ``projections`` or ``sandbox``. A sub-command sets ``func(args) -> int``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine
from importlib.metadata import entry_points
from typing import Any, TypeVar

from ledger.client import ENV_URL, LedgerClient, connect
from ledger.cluster import LocalCluster
from ledger.errors import LedgerError
from ledger.server import EmbeddedServer

T = TypeVar("T")


def nats_url(args: argparse.Namespace, *, start: bool = True) -> str:
    """--nats, else RUNLEDGER_NATS_URL, else the local cluster, else the embedded server (started if need be)."""
    url: str | None = getattr(args, "nats", None) or os.environ.get(ENV_URL)
    if url:
        return url
    cluster = LocalCluster().state()
    if cluster is not None:
        return cluster.url
    server = EmbeddedServer()
    state = server.state()
    if state is None:
        if not start:
            raise LedgerError("no embedded server is running: start it with `runledger up`")
        state = server.start()
        print(f"started the embedded nats-server at {state.url} (data in {state.data_dir})", file=sys.stderr)
    return state.url


def credentials(args: argparse.Namespace) -> str | None:
    """--creds, else $RUNLEDGER_CREDS, else the admin credentials of a secure embedded server."""
    creds: str | None = getattr(args, "creds", None) or os.environ.get("RUNLEDGER_CREDS")
    if creds:
        return creds
    if getattr(args, "nats", None) or os.environ.get(ENV_URL):
        return None
    state = EmbeddedServer().state()
    if state is not None and state.creds_dir:
        return os.path.join(state.creds_dir, "admin.json")
    return None


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def with_client(args: argparse.Namespace, fn: Callable[[LedgerClient], Awaitable[T]]) -> T:
    """Connect (per --nats / env / embedded), call ``fn(client)``, close."""

    async def go() -> T:
        client = await connect(nats_url(args), user_credentials=credentials(args))
        try:
            return await fn(client)
        finally:
            await client.close()

    return run_async(go())


def common_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--nats", metavar="URL", help=f"NATS server URL (default: ${ENV_URL}, else the embedded server)"
    )
    common.add_argument(
        "--creds",
        metavar="FILE",
        help="credentials file of a role (runledger up --secure writes them; default: $RUNLEDGER_CREDS)",
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="runledger", description="A flight recorder and re-drive bench for AI-agent runs."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    common = common_parser()
    registrars = {ep.name: ep for ep in entry_points(group="runledger.commands")}
    if "ledger" not in registrars:  # running from a source tree that was never installed
        from ledger.commands import register

        register(sub, common)
    for name in sorted(registrars):
        registrars[name].load()(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except LedgerError as exc:
        print(f"runledger: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Entry point of the ``ledger`` package's sub-commands."""
    from ledger.commands import register as register_ledger

    register_ledger(sub, common)


if __name__ == "__main__":
    sys.exit(main())
