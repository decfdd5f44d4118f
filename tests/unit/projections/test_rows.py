"""Fold-to-rows: checkpoint serialisation and the row builders, with hand-made events."""

from __future__ import annotations

import json

from runledger.projections.rows import (
    RunFold,
    TableBuffer,
    add_checkpoint,
    add_run,
    add_steps,
    checkpoint_from_json,
    checkpoint_json,
    i64,
)
from runledger.record.events import BudgetGranted, RunResumed
from runledger.record.fold import fold
from tests.unit.projections.chains import Stream, approval_run, failed_run, forked_run, full_run, run_chain


def _checkpoints() -> list:
    stream = Stream()
    chains = [
        full_run(stream, "r1"),
        approval_run(stream, "r2", resolve=False),
        approval_run(stream, "r3", resolve=True, approved=False),
        failed_run(stream, "r4"),
        forked_run(stream, "r5", "r1"),
    ]
    resumed = run_chain(stream, "r6")
    resumed.add(full_run(Stream(), "x").events[0].body)  # run.started
    resumed.add(RunResumed(attempt=2, from_step=0), ts="2026-03-01T11:00:00.000000Z")
    resumed.add(BudgetGranted(turns=3, by="ops"))
    chains.append(resumed)
    return [fold(c.events) for c in chains] + [fold([])]


def test_checkpoint_json_is_to_dict() -> None:
    for cp in _checkpoints():
        assert json.loads(checkpoint_json(cp)) == cp.to_dict()


def test_checkpoint_round_trips_through_json() -> None:
    for cp in _checkpoints():
        assert checkpoint_from_json(checkpoint_json(cp)) == cp


def test_run_row_is_the_checkpoint_formatted() -> None:
    stream = Stream()
    chain = full_run(stream, "r1")
    cp = fold(chain.events)
    buf = TableBuffer("runs")
    add_run(buf, "r1", RunFold(chain.subject, cp, 1))
    row = buf.to_arrow().to_pylist()[0]
    assert row["run_id"] == "r1" and row["agent"] == "support" and row["status"] == "completed"
    assert row["tokens"] == cp.spent["tokens"] == 40
    assert (row["input_tokens"], row["output_tokens"]) == (30, 10)
    assert row["limit_turns"] == 5 and row["limit_tokens"] == 1000 and row["limit_seconds"] is None
    assert row["committed_keys"] == ["refund:r1"] and row["in_doubt_keys"] == []
    assert row["events"] == len(chain.events) and row["last_step"] == 2 and row["steps"] == 3
    assert json.loads(row["version"]) == cp.version
    assert row["started_at"] == cp.started_at and row["ended_at"] == cp.ended_at


def test_step_rows_follow_the_fold() -> None:
    stream = Stream()
    chain = approval_run(stream, "r2", resolve=True, approved=True)
    cp = fold(chain.events)
    buf = TableBuffer("steps")
    add_steps(buf, "r2", cp, sorted(cp.steps))
    rows = buf.to_arrow().to_pylist()
    assert [(r["step"], r["kind"], r["status"]) for r in rows] == [(0, "model", "ok"), (1, "approval", "approved")]
    assert rows[1]["request_id"] == "q-r2" and json.loads(rows[1]["output"])["by"] == "ana"
    assert rows[0]["input_tokens"] == 30 and rows[0]["tokens"] == 40


def test_checkpoint_row_holds_the_fold_and_its_error() -> None:
    cp = fold(full_run(Stream(), "r1").events)
    buf = TableBuffer("checkpoints")
    add_checkpoint(buf, "r1", RunFold("ledger.run.support.r1", cp, 7, "broken"))
    row = buf.to_arrow().to_pylist()[0]
    assert json.loads(row["checkpoint"]) == cp.to_dict()
    assert (row["first_stream_seq"], row["fold_error"], row["next_seq"]) == (7, "broken", cp.next_seq)


def test_integers_no_bigint_holds_become_null() -> None:
    assert i64(5) == 5 and i64(None) is None and i64(True) is None
    assert i64(2**63 - 1) == 2**63 - 1 and i64(2**63) is None and i64(-(2**63) - 1) is None


def test_an_empty_buffer_is_an_empty_table_of_the_right_shape() -> None:
    table = TableBuffer("events").to_arrow()
    assert table.num_rows == 0 and "payload" in table.column_names


def test_child_runs_carry_their_parent_and_child_steps_their_run() -> None:
    from runledger.record.events import ChildCompleted, ChildStarted, RunStarted
    from tests.unit.projections.chains import VERSION

    stream = Stream()
    parent = run_chain(stream, "p1")
    parent.add(RunStarted(agent="support", version=VERSION))
    parent.add(ChildStarted(step=0, run_id="p1-c0", agent="kid", args_digest="d"))
    parent.add(ChildCompleted(step=0, run_id="p1-c0", output={"n": 1}))
    child = run_chain(stream, "p1-c0", agent="kid")
    child.add(RunStarted(agent="kid", version=VERSION, parent_run_id="p1", parent_step=0))
    runs, steps = TableBuffer("runs"), TableBuffer("steps")
    for chain, run_id in ((parent, "p1"), (child, "p1-c0")):
        cp = fold(chain.events)
        add_run(runs, run_id, RunFold(chain.subject, cp, 1))
        add_steps(steps, run_id, cp, sorted(cp.steps))
    rows = runs.to_arrow().to_pylist()
    assert [(r["run_id"], r["child_of_run_id"], r["child_of_step"], r["parent_run_id"]) for r in rows] == [
        ("p1", None, None, None), ("p1-c0", "p1", 0, None),
    ]  # fmt: skip
    (step,) = steps.to_arrow().to_pylist()
    assert (step["kind"], step["name"], step["status"], step["child_run_id"]) == ("child", "kid", "completed", "p1-c0")
    assert json.loads(step["output"]) == {"n": 1}
