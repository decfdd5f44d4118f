"""The ``ui`` sub-command of ``runledger``: the page, served by this process.

Registered through the ``runledger.commands`` entry point (``register(sub, common)``). Without the
``ui`` extra the command is listed with the line that installs it (``runledger.extras``).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

from runledger.cli.connect import credentials, nats_url
from runledger.extras import require_extra


def cmd_ui(args: argparse.Namespace) -> int:
    from runledger.ui.app import UIConfig
    from runledger.ui.projection import default_ui_db
    from runledger.ui.server import serve

    config = UIConfig(
        nats_url=nats_url(args), db=Path(args.db) if args.db else default_ui_db(), creds=credentials(args),
        agents=tuple(args.agent or ()), prices=Path(args.prices) if args.prices else None, host=args.host,
    )  # fmt: skip
    if not config.loopback and not config.secure:
        print(
            f"runledger ui: WARNING: serving on {args.host} against a server without logins: anyone who reaches "
            "this address can read every run and act as an operator (`runledger up --secure` adds sign-in)",
            file=sys.stderr,
        )

    def announce(url: str) -> None:
        print(f"runledger ui: {url}  (projection {config.db}; Ctrl-C stops)", flush=True)
        if config.secure:
            print("sign in with a role's credentials file (runledger up --secure wrote them)", flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        serve(config, args.port, open_browser=args.open, announce=announce)
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Entry point of the ``ui`` package's sub-command."""
    require_extra("ui", "`runledger ui`")
    p = sub.add_parser("ui", parents=[common], help="the web page: runs, timelines, steps, diffs, approvals")
    p.add_argument("--port", type=int, default=8740, help="port to serve on (default 8740; 0: a free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--open", action="store_true", help="open the page in a browser")
    p.add_argument("--db", metavar="PATH", help="the page's projection file (default: $RUNLEDGER_HOME/ui.duckdb)")
    p.add_argument(
        "--agent", action="append", metavar="MODULE:ATTR",
        help="an agent the page resumes after an approval decision, and names in re-runs (repeatable)",
    )  # fmt: skip
    p.add_argument(
        "--prices", metavar="FILE", help='price table JSON: {"model": {"input": USD, "output": USD}} per 1M tokens'
    )
    p.set_defaults(func=cmd_ui)
