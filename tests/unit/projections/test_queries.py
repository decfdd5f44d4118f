"""Reading a projection: output formats and checkpoints at a step (against the fold)."""

from __future__ import annotations

import csv
import io
import json

import pytest

from runledger.log.reader import decode_records
from runledger.projections.errors import ProjectionError, QueryError
from runledger.projections.queries import QueryResult, checkpoint_at, format_result, run_sql
from runledger.projections.store import ProjectionStore
from runledger.record.events import RunStarted
from runledger.record.fold import fold
from tests.unit.projections.chains import VERSION, Stream, full_run, model, run_chain, tool
from tests.unit.projections.conftest import projector_for

RESULT = QueryResult(
    ["run_id", "n", "payload"], ["VARCHAR", "BIGINT", "JSON"],
    [("r1", 2, '{"a": [1, 2]}'), ("r,2", None, "null")],
)  # fmt: skip


def test_table_format() -> None:
    text = format_result(RESULT, "table")
    lines = text.splitlines()
    assert lines[0].split() == ["run_id", "n", "payload"]
    assert lines[2].split() == ["r1", "2", '{"a":', "[1,", "2]}"]
    assert lines[-1] == "(2 rows)"


def test_csv_format() -> None:
    rows = list(csv.reader(io.StringIO(format_result(RESULT, "csv"))))
    assert rows == [["run_id", "n", "payload"], ["r1", "2", '{"a": [1, 2]}'], ["r,2", "", "null"]]


def test_json_format_nests_json_columns() -> None:
    assert json.loads(format_result(RESULT, "json")) == [
        {"run_id": "r1", "n": 2, "payload": {"a": [1, 2]}},
        {"run_id": "r,2", "n": None, "payload": None},
    ]


def test_bad_sql_is_a_query_error(store: ProjectionStore) -> None:
    with pytest.raises(QueryError, match=r"docs/tables\.md"):
        run_sql(store.con, "SELECT nope FROM runs")


def test_checkpoint_at_every_step_equals_the_fold(store: ProjectionStore) -> None:
    stream = Stream()
    run = run_chain(stream, "long")
    run.add(RunStarted(agent="support", version=VERSION))
    for step in range(12):
        run.add(model(step) if step % 3 else tool(step, output=step))
        full_run(stream, f"other-{step}")  # other runs interleaved
    projector_for(store).project_batch(stream.records)
    good, _ = decode_records([r for r in stream.records if r.subject == run.subject])
    for step in [None, *range(12)]:
        assert checkpoint_at(store.con, "long", step).to_dict() == fold(good, upto_step=step).to_dict(), step
    with pytest.raises(ProjectionError, match="no run"):
        checkpoint_at(store.con, "missing", 1)
