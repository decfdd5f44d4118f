"""The sub-commands that start, stop and describe the server: ``up`` (one node, ``--secure`` with its
roles and content grants, or ``--cluster N``), ``down``, ``status``. ``runledger.cli.commands.register``
adds them first."""

from __future__ import annotations

import argparse
import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runledger.cli.connect import run_async, with_client
from runledger.cli.exits import Exit
from runledger.errors import ConfigurationError
from runledger.log.server import ENV_URL, NO_LOGINS_WARNING, EmbeddedServer, pid_alive

if TYPE_CHECKING:
    from runledger.log.client import LedgerClient
    from runledger.protect.keystore import MasterKeySource


def cmd_up(args: argparse.Namespace) -> int:
    from runledger.log.cluster import LocalCluster
    from runledger.protect.keystore import ensure_master_key
    from runledger.protect.roles import content_grants, secure

    if args.cluster:
        return _up_cluster(args)
    if LocalCluster().state() is not None:
        raise ConfigurationError("a local cluster is running: `runledger down` first, or use it")
    server = EmbeddedServer()
    already = server.state()
    if already is not None and args.secure and not already.creds_dir:
        raise ConfigurationError("the embedded server is running without --secure: `runledger down` first")
    grant, revoke = tuple(args.grant_content or ()), tuple(args.revoke_content or ())
    if (grant or revoke) and not args.secure:
        raise ConfigurationError("--grant-content and --revoke-content go with --secure (without it nobody logs in)")
    auth = secure(list(args.agent or []), grant_content=grant, revoke_content=revoke) if args.secure else None
    if already is not None and auth is not None and (args.agent or grant or revoke):
        # The running server's users and permissions change in place: rewritten, then reloaded.
        auth(Path(already.creds_dir), already.url)
        os.kill(already.pid, signal.SIGHUP)
    state = server.start(
        data_dir=Path(args.data_dir) if args.data_dir else None,
        port=args.port,
        sync_always=not args.no_fsync,
        auth=auth,
    )
    admin = str(Path(state.creds_dir) / "admin.json") if state.creds_dir else None
    master = ensure_master_key(server.home)

    async def streams() -> None:
        from runledger.log.client import connect

        client = await connect(state.url, user_credentials=admin)
        await client.close()

    run_async(streams())
    from runledger.log.subjects import BLOB_BUCKET, CMD_STREAM, LEDGER_STREAM

    print(("already running" if already else "started") + f": {state.url}  (pid {state.pid}, data {state.data_dir})")
    print(f"streams {LEDGER_STREAM}, {CMD_STREAM} and object store {BLOB_BUCKET} are ready; log: {state.log}")
    print(f"use it from other shells with: export RUNLEDGER_NATS_URL={state.url}")
    if state.creds_dir:
        print(f"secure: logins required; role credentials files (mode 0600) are in {state.creds_dir}:")
        for path in sorted(Path(state.creds_dir).glob("*.json")):
            print(f"  {path}")
        print("connect with: export RUNLEDGER_CREDS=<file>  (or --creds FILE; the CLI defaults to admin.json)")
        granted = sorted(content_grants(Path(state.creds_dir)))
        print(
            f"content (show, sql --content) granted to: {', '.join(granted)}; they need the master key too"
            if granted
            else "analysts read structure: an operator grants them content with --grant-content analyst"
        )
    else:
        print(NO_LOGINS_WARNING)
    _print_master_key(master)
    if args.foreground:
        print("staying attached; Ctrl-C stops the server")
        try:
            while server.state() is not None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            server.stop()
    return 0


def _up_cluster(args: argparse.Namespace) -> int:
    from runledger.log.cluster import LocalCluster
    from runledger.log.streams import StreamSettings
    from runledger.log.subjects import BLOB_BUCKET, CMD_STREAM, LEDGER_STREAM
    from runledger.protect.keystore import ensure_master_key

    if args.secure or args.port:
        raise ConfigurationError("--cluster takes neither --secure nor --port (see deploy/nats/cluster/ for both)")
    if EmbeddedServer().state() is not None:
        raise ConfigurationError("the one-node embedded server is running: `runledger down` first")
    cluster = LocalCluster()
    already = cluster.state()
    state = cluster.start(
        size=args.cluster, data_dir=Path(args.data_dir) if args.data_dir else None, sync_always=not args.no_fsync
    )

    async def streams() -> None:
        from runledger.log.client import connect

        # New streams get as many replicas as there are nodes, up to 3.
        settings = StreamSettings.from_env()
        if settings.replicas is None:
            settings = replace(settings, replicas=min(3, args.cluster))
        client = await connect(state.url, settings=settings, ready_timeout=60)
        await client.close()

    master = ensure_master_key(cluster.home)
    run_async(streams())
    print(("already running" if already else "started") + f": a {len(state.nodes)}-node JetStream cluster")
    for node in state.nodes:
        print(f"  {node.name}: {node.url}  (pid {node.pid}, data {node.data_dir}, log {node.log})")
    replicas = min(3, args.cluster)
    print(f"streams {LEDGER_STREAM}, {CMD_STREAM} and object store {BLOB_BUCKET} are ready, {replicas} replicas")
    print(f"use it from other shells with: export RUNLEDGER_NATS_URL={state.url}")
    print(NO_LOGINS_WARNING)
    _print_master_key(master)
    return 0


def _print_master_key(master: MasterKeySource) -> None:
    made = " (created now, mode 0600)" if master.created else ""
    print(f"master key {master.key_id}: {master.where}{made}; run keys in the ledger are wrapped under it")
    print(
        "  agents, operators and workers that open content need it (same file, or $RUNLEDGER_MASTER_KEY); "
        "analysts do not. Losing it makes all recorded content unreadable: back it up apart from the ledger"
    )


def cmd_down(args: argparse.Namespace) -> int:
    from runledger.log.cluster import LocalCluster

    stopped = EmbeddedServer().stop()
    print("stopped the embedded nats-server" if stopped else "no embedded nats-server was running")
    if LocalCluster().stop():
        print("stopped the local cluster")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from runledger.log.cluster import LocalCluster
    from runledger.log.subjects import CMD_STREAM, LEDGER_STREAM

    state = EmbeddedServer().state()
    cluster = LocalCluster().state()
    if state is None and cluster is None and not (args.nats or os.environ.get(ENV_URL)):
        print("embedded nats-server: not running (start it with `runledger up`)")
        return Exit.FAILED
    if state is not None:
        print(f"embedded nats-server: running at {state.url} (pid {state.pid}, data {state.data_dir})")
    if cluster is not None:
        print(f"local cluster: {cluster.url}")
        for node in cluster.nodes:
            health = "running" if pid_alive(node.pid) else "DOWN"
            print(f"  {node.name}: {health} (pid {node.pid}, data {node.data_dir})")

    async def info(client: LedgerClient) -> None:
        for name in (LEDGER_STREAM, CMD_STREAM):
            si = await client.js.stream_info(name)
            c = si.config
            print(
                f"stream {name}: {si.state.messages} messages, {si.state.bytes} bytes, "
                f"first seq {si.state.first_seq}, last seq {si.state.last_seq}; storage {c.storage}, "
                f"replicas {c.num_replicas}, duplicate window {c.duplicate_window:g}s, "
                f"max age {'none' if not c.max_age else f'{c.max_age / 86400:g} days'}, "
                f"deny delete {c.deny_delete}, deny purge {c.deny_purge}"
            )
            if si.cluster is not None and si.cluster.leader:
                peers = ", ".join(
                    f"{r.name} ({'current' if r.current else 'catching up'})" for r in si.cluster.replicas or []
                )
                print(f"  leader {si.cluster.leader}; replicas {peers}")

    with_client(args, info)
    return 0


def _grantable(role: str) -> str:
    """A role content may be granted to (runledger.protect.roles.GRANTABLE), checked when the option is
    given: the roles module is not imported to build the parser (argparse's ``choices`` would)."""
    from runledger.protect.roles import GRANTABLE

    if role not in GRANTABLE:
        raise argparse.ArgumentTypeError(f"invalid choice: {role!r} (choose from {', '.join(map(repr, GRANTABLE))})")
    return role


def add_up(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("up", help="start the embedded nats-server and create the streams")
    p.add_argument("--data-dir", help="JetStream store directory (default ~/.runledger/data or $RUNLEDGER_HOME/data)")
    p.add_argument("--port", type=int, help="client port (default: a free one)")
    p.add_argument("--foreground", action="store_true", help="stay attached until Ctrl-C")
    p.add_argument(
        "--no-fsync", action="store_true", help="ack before fsync (faster; an acked event can be lost on power failure)"
    )
    p.add_argument("--secure", action="store_true", help="require logins: generate users and permissions for the roles")
    p.add_argument("--agent", action="append", metavar="NAME", help="with --secure: an agent user (repeatable)")
    p.add_argument(
        "--grant-content", action="append", metavar="ROLE", type=_grantable,
        help="with --secure: let ROLE (analyst) read run keys, so with the master key it opens content "
        "(show, sql --content); kept across restarts",
    )  # fmt: skip
    p.add_argument(
        "--revoke-content", action="append", metavar="ROLE", type=_grantable,
        help="with --secure: take the content grant back",
    )  # fmt: skip
    p.add_argument(
        "--cluster", type=int, metavar="N", help="start N nodes on loopback as a JetStream cluster (3: replicas 3)"
    )
    p.set_defaults(func=cmd_up)


def add_down(sub: Any, common: argparse.ArgumentParser) -> None:
    sub.add_parser("down", help="stop the embedded nats-server").set_defaults(func=cmd_down)


def add_status(sub: Any, common: argparse.ArgumentParser) -> None:
    sub.add_parser("status", parents=[common], help="server and stream status").set_defaults(func=cmd_status)
