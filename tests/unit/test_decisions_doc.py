"""docs/data-protection.md's table of decisions against the code: every decision the fold takes only
from the operator's subject is in it (and nothing else claims to be), only the operator role may
publish on that subject, and each command the table names exists."""

from __future__ import annotations

import re
from pathlib import Path

from runledger.cli.app import build_parser
from runledger.protect.roles import permissions
from runledger.record.fold import OPERATOR_TYPES

DOC = Path(__file__).parents[2] / "docs" / "data-protection.md"


def _rows() -> list[list[str]]:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("| decision | command | event | who may |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_every_operator_decision_of_the_fold_is_in_the_table() -> None:
    events = {re.sub(r"`", "", row[2]) for row in _rows()}
    # effect.resolved is a key's decision (runledger.sdk.effects), not a run's: in the table, not in the run fold.
    assert events == OPERATOR_TYPES | {"effect.resolved"}
    assert "run.retried" in OPERATOR_TYPES  # a failed run goes on only by an operator's decision


def test_only_the_operator_publishes_decisions() -> None:
    assert "ledger.run.*.*.o" in permissions("operator")["publish"]["allow"]
    assert "ledger.effect.*.*.o" in permissions("operator")["publish"]["allow"]
    for role, agent in (("agent", "alpha"), ("worker", None), ("analyst", None)):
        allowed = permissions(role, agent)["publish"]["allow"]
        assert not [s for s in allowed if s.startswith(("ledger.run.", "ledger.effect.")) and s.endswith(".o")], role


def test_every_command_of_the_table_exists() -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    for row in _rows():
        command = re.match(r"`runledger ([a-z-]+)", row[1])
        assert command is not None, row
        assert command.group(1) in subparsers.choices, row[1]  # type: ignore[operator]
