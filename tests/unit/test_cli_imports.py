"""``runledger --help`` and the help of every sub-command import no third-party module at all: each
package's ``register`` only builds argparse parsers, and every command imports what it uses inside
its function (runledger.cli.commands, projections/cli.py, sandbox/cli.py, ui/cli.py, the ``export``
modes). Before, ``--help`` imported DuckDB, pyarrow, numpy, pydantic and the NATS client: about a
second of CPU for a help text. What the commands that connect import is checked against a real
server in tests/integration/test_cli_imports.py.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runledger.cli.app import build_parser
from tests.cli_imports import imported_by


def _help_commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[list[str]]:
    """``[..., "--help"]`` for this parser and every sub-command under it, as the user types them."""
    found = [[*prefix, "--help"]]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _help_commands(sub, (*prefix, name))
    return found


def test_help_and_the_help_of_every_sub_command_import_no_third_party_module(tmp_path: Path) -> None:
    commands = _help_commands(build_parser())
    assert ["rerun", "--help"] in commands and ["export", "otlp", "--help"] in commands  # every package's
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "RUNLEDGER_HOME": str(tmp_path / "home")}
    # Twice: the first call reads the entry points' metadata, the second their cache (runledger.cli.registry).
    for attempt in ("metadata read", "cache used"):
        for ran in imported_by(commands, tmp_path / "report.json", env=env):
            assert ran.code == 0 and "usage: runledger" in ran.out, (ran.argv, ran.err)
            # A module is counted for the first command that loaded it: the first offender is named.
            assert ran.third_party == frozenset(), (
                f"`runledger {' '.join(ran.argv)}` ({attempt}) imported {sorted(ran.third_party)}: registering "
                "a sub-command must only build its parser; import what the command uses inside its function"
            )
    assert list((tmp_path / "cache" / "runledger").glob("entry-points-*.json")), "the entry points were not cached"


def test_a_role_content_cannot_be_granted_to_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """``up --grant-content`` checks the role when it is given (the roles module is not imported to build
    the parser): argparse's usage error, exit 2, as with ``choices``."""
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["up", "--secure", "--grant-content", "operator"])
    assert exited.value.code == 2
    assert "invalid choice: 'operator' (choose from 'analyst')" in capsys.readouterr().err
    args = build_parser().parse_args(["up", "--secure", "--grant-content", "analyst", "--revoke-content", "analyst"])
    assert (args.grant_content, args.revoke_content) == (["analyst"], ["analyst"])


def test_reading_runs_does_not_load_redaction() -> None:
    """``runs``, ``show`` and ``verify`` open sealed content and never redact: redaction (its detectors'
    patterns, ~10% of ``runledger runs``' start) loads when a run's protector is made, on the write side."""
    code = (
        "import sys\nimport runledger.ops.trace, runledger.ops.verify, runledger.protect.loading\n"
        "print(' '.join(m for m in sys.modules if m.startswith('runledger.protect.redaction')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == []
