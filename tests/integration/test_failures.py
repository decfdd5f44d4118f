"""Classes of failure on a real nats-server: 200 recorded runs of tests/tripbot.py with three planted causes
(numbers, ids and quoted values varying inside each) make exactly three classes, in the projection, in
`runledger failures` (sealed messages, and opened with --content) and in the selection `--class` sweeps;
the projector fills them incrementally and on a rebuild alike."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import duckdb
import pytest

from runledger.log.client import LedgerClient
from runledger.projections.failures import class_condition
from runledger.projections.projector import project, rebuild
from runledger.sandbox.sweep import select_runs
from runledger.sdk.lifecycle import start_run
from tests import tripbot
from tests.integration.processes import runledger

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
RUNS = 200
MASKED = {
    "currency": "unknown currency <str> for trip TR-<n> at <n>",
    "long stay": "confirmation <hex> of trip TR-<n> has no total",
    "nowhere": "tool <str> (step <n>) raised LookupError: no hotels in <str> for <n> nights",
}


async def _record(client: LedgerClient, numbers: range) -> None:
    for first in range(numbers.start, numbers.stop, 20):  # 20 runs in flight at a time
        batch = range(first, min(first + 20, numbers.stop))
        await asyncio.gather(
            *(start_run(client, tripbot.spec(), tripbot.trip(n), run_id=f"trip-{n:03d}") for n in batch)
        )


def _rows(db: Path, sql: str) -> list[tuple[object, ...]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


async def test_two_hundred_runs_with_three_planted_causes_make_exactly_three_classes(
    client: LedgerClient, nats_url: str, tmp_path: Path
) -> None:
    db = tmp_path / "ledger.duckdb"
    await _record(client, range(RUNS // 2))
    await project(client, db)  # half of them in the file, then the rest incrementally
    await _record(client, range(RUNS // 2, RUNS))
    causes = {f"trip-{n:03d}": tripbot.cause(tripbot.trip(n)) for n in range(RUNS)}
    failed = {run_id: cause for run_id, cause in causes.items() if cause}
    assert len(failed) == 60

    cli = runledger(nats_url, "failures", "--db", str(db), "--json")
    assert cli.returncode == 0, cli.stderr
    classes = json.loads(cli.stdout)
    assert len(classes) == 3, classes
    by_cause = {failed[c["example_runs"][0]]: c for c in classes}
    assert sorted(by_cause) == ["currency", "long stay", "nowhere"]
    for cause, c in by_cause.items():
        assert c["runs"] == 20 and c["agent"] == "tripbot", c
        assert len(c["example_runs"]) == 3 and {failed[r] for r in c["example_runs"]} == {cause}
        assert c["first_seen"] <= c["last_seen"] and c["message"] is None  # sealed: no --content
    assert (by_cause["nowhere"]["error_type"], by_cause["nowhere"]["step_kind"], by_cause["nowhere"]["step_name"]) == (
        "ToolFailedError", "tool", "quote",
    )  # fmt: skip
    # Two causes fail with a ValueError after a model call of the same model: their messages tell them apart.
    assert {by_cause[c]["error_type"] for c in ("currency", "long stay")} == {"ValueError"}
    assert {by_cause[c]["step_name"] for c in ("currency", "long stay")} == {"scripted-trips-1"}

    # Every failed run is in the class of its cause, in the projection (caught up by the command above).
    members: dict[str, set[str]] = {}
    for run_id, class_id in _rows(db, "SELECT run_id, failure_class FROM runs WHERE status = 'failed'"):
        members.setdefault(str(class_id), set()).add(str(run_id))
    assert sorted(map(sorted, members.values())) == sorted(
        sorted(r for r, c in failed.items() if c == cause) for cause in MASKED
    )

    opened = runledger(nats_url, "failures", "--db", str(db), "--content", "--json", "--no-sync")
    assert opened.returncode == 0, opened.stderr
    assert {failed[c["example_runs"][0]]: c["message"] for c in json.loads(opened.stdout)} == MASKED
    text = runledger(nats_url, "failures", "--db", str(db), "--no-sync")
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("3 classes of failure in 60 failed runs")
    assert f"class {by_cause['currency']['class_id']}  20 runs of tripbot" in text.stdout
    assert "(message sealed: --content opens it)" in text.stdout

    # --class selects the failed runs of the class, and only those (what `rerun --class` sweeps).
    for cause, c in by_cause.items():
        selected = await select_runs(client, db, class_condition(c["class_id"]))
        assert selected == sorted(r for r, k in failed.items() if k == cause), cause

    # A rebuild derives the same classes as the incremental projection.
    await rebuild(client, tmp_path / "rebuilt.duckdb")
    for sql in (
        "SELECT * FROM failure_classes ORDER BY class_id",
        "SELECT run_id, failure_class, failure_step, failure_step_kind, failure_step_name, failure_shape FROM runs "
        "ORDER BY run_id",
    ):
        assert _rows(db, sql) == _rows(tmp_path / "rebuilt.duckdb", sql), sql


def test_a_class_id_that_is_not_one_is_refused_before_anything_runs(nats_url: str, tmp_path: Path) -> None:
    cli = runledger(nats_url, "rerun", "--class", "TR-004", "--agent", "tests.tripbot:spec", "--mode", "redrive",
                    env={"RUNLEDGER_HOME": str(tmp_path)})  # fmt: skip
    assert cli.returncode == 4, cli.stdout + cli.stderr  # Exit.ERROR: the command cannot do its work
    assert "--class 'TR-004' is not a class of failure" in cli.stderr and "runledger failures" in cli.stderr
