"""The ``runledger`` program: assembles the sub-commands each package owns, runs one, reports errors.

Packages register through the ``runledger.commands`` entry-point group (see pyproject.toml),
each with ``register(subparsers, common)``, so the core never imports ``runledger.projections``
or ``runledger.sandbox``. A sub-command sets ``func(args) -> int``. A package whose extra is not
installed is listed with the one line that installs it, not a traceback. Every exit code is one of
``runledger.cli.exits.Exit`` (the table is there and in the README).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from typing import Any

from runledger.cli import commands
from runledger.cli.connect import common_parser
from runledger.cli.exits import Exit, of_error
from runledger.cli.registry import registered
from runledger.errors import LedgerError, MissingExtraError
from runledger.extras import COMMANDS_OF_EXTRA, require_extra


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="runledger", description="A flight recorder and re-drive bench for AI-agent runs."
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0,
        help="also show other libraries' log lines (httpx's requests...); -vv: debug",
    )  # fmt: skip
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    common = common_parser()
    registrars = {ep.name: ep for ep in registered("runledger.commands")}
    if "ledger" not in registrars:  # running from a source tree that was never installed
        commands.register(sub, common)
    for name in sorted(registrars):
        try:
            registrars[name].load()(sub, common)
        except MissingExtraError as exc:
            _unavailable(sub, exc.extra)
    return parser


def _unavailable(sub: Any, extra: str) -> None:
    """Register the commands of an extra that is not installed: each says what to install."""
    for name in COMMANDS_OF_EXTRA.get(extra, ()):

        def explain(args: argparse.Namespace, name: str = name) -> int:
            require_extra(extra, f"`runledger {name}`")
            return 0

        # No option prefix: every word after the command (``--follow``, ``-h``) is taken as is.
        p = sub.add_parser(
            name, help=f"(not installed: pip install 'runledger[{extra}]')", add_help=False, prefix_chars="\0"
        )
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=explain)


def configure_logging(verbosity: int = 0) -> None:
    """runledger's own messages (INFO and up) on stderr; other libraries' only at WARNING and up unless
    ``verbosity`` asks for them (1: INFO, so httpx's ``HTTP Request:`` lines; 2: DEBUG, runledger's too).

    Under a host that configured logging already (a test runner, an application), its handlers and
    root level stay as they are: only the ``runledger`` logger's level is set."""
    third_party = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
    logging.basicConfig(level=third_party, format="%(message)s", stream=sys.stderr)
    if verbosity:  # asked for outright: the root level too, whoever configured it
        logging.getLogger().setLevel(third_party)
    logging.getLogger("runledger").setLevel(logging.DEBUG if verbosity >= 2 else logging.INFO)


def main(argv: list[str] | None = None) -> int:
    """Run one command and return its exit code (``Exit``): what the command returned; for an error,
    ``REFUSED`` or ``ERROR`` (``exits.of_error``) after one line on stderr. argparse exits 2 itself."""
    configure_logging()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verbose:
        configure_logging(args.verbose)
    if not getattr(args, "func", None):
        parser.print_help()
        return Exit.USAGE
    try:
        return int(args.func(args) or 0)
    except LedgerError as exc:
        print(f"runledger: error: {exc}", file=sys.stderr)
        return of_error(exc)
    except KeyboardInterrupt:
        return Exit.INTERRUPTED
    except BrokenPipeError:  # `runledger runs --json | head`: the reader is gone, nothing more to say
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (closing stdout again at exit would raise)
        return Exit.OK
    except Exception:  # a bug, not a verdict: Python's own exit code (1) would read as a failed run
        import traceback

        traceback.print_exc()
        return Exit.ERROR


if __name__ == "__main__":
    sys.exit(main())
