"""Checking a journal snapshot before it is believed (runledger.sdk.snapshot), on in-memory chains."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runledger.errors import ChainError, LedgerError
from runledger.record.canonical import canonical_json
from runledger.record.events import JournalSnapshotted, RunSuspended, ToolCalled
from runledger.record.fold import Checkpoint, fold
from runledger.record.records import RawRecord, Recorded
from runledger.sdk.snapshot import (
    JournalSnapshotter,
    _check_head,
    _parsed,
    _snapshot_of,
    _verified,
    checkpoint_of,
    opened_journal,
    stored_journal,
)
from tests.unit.helpers import Chain

SUBJECT = "ledger.run.a.R1.a"
REF = {"$ref": "blob", "sha256": "a" * 64, "size": 1, "media_type": "application/json", "enc": "A256GCM",
       "kid": "a.R1"}  # fmt: skip


class Opener:
    """Stands for the blob store and the run's key: returns the value it was given."""

    def __init__(self, journal: Any) -> None:
        self.journal = journal

    async def open_value(self, value: Any, *, strict: bool = True, fetch: bool = True) -> Any:
        return self.journal


def tool(step: int) -> ToolCalled:
    return ToolCalled(step=step, name="lookup", args={"i": step}, args_digest=f"d{step}", output={"v": step})


def recorded(chain: Chain) -> list[Recorded]:
    return [Recorded(e, stream_seq=10 + i, subject=SUBJECT) for i, e in enumerate(chain.events)]


def snapshotted(steps: int = 6, tail: int = 3, **head: Any) -> tuple[list[Recorded], int, dict[str, Any]]:
    """A run of ``steps`` tool calls, a snapshot, ``tail`` more: (records, index of the snapshot, journal)."""
    chain = Chain()
    chain.start()
    for i in range(steps):
        chain.add(tool(i))
    before = fold(recorded(chain))
    journal = json.loads(canonical_json(before.to_dict()))  # what the blob holds, through JSON
    values = {"head_seq": before.next_seq - 1, "head_hash": before.last_hash, "head_stream_seq": before.last_stream_seq,
              "steps": len(before.steps), "journal": REF, **head}  # fmt: skip
    chain.add(JournalSnapshotted(**values))
    for i in range(steps, steps + tail):
        chain.add(tool(i))
    chain.add(RunSuspended(step=steps + tail, request_id="r", reason="approval"))
    return recorded(chain), steps + 1, journal


def verified(run_id: str, found: Recorded, tail: list[Recorded], journal: Any) -> Checkpoint:
    """What a resume checks of a snapshot: its event (``_snapshot_of``), then its journal and tail."""
    return _verified(run_id, "a", found, _snapshot_of(run_id, "a", found), tail, journal)


def test_a_snapshot_and_its_tail_fold_to_the_full_fold() -> None:
    records, at, journal = snapshotted()
    cp = verified("R1", records[at], records[at + 1 :], journal)
    assert cp.to_dict() == fold(records).to_dict()


@pytest.mark.parametrize(
    ("head", "why"),
    [
        ({"head_seq": 3}, "head is not"),
        ({"head_hash": "f" * 64}, "head is not"),
        ({"head_stream_seq": 99}, "stored after"),
    ],
)
def test_a_snapshot_whose_head_is_not_its_place_is_refused(head: dict[str, Any], why: str) -> None:
    records, at, journal = snapshotted(**head)
    with pytest.raises(LedgerError, match=why):
        verified("R1", records[at], records[at + 1 :], journal)


def test_a_journal_that_does_not_end_at_the_head_is_refused() -> None:
    records, at, _ = snapshotted()
    shorter = json.loads(canonical_json(fold(records[: at - 1]).to_dict()))  # one event short
    with pytest.raises(LedgerError, match="does not end at the head"):
        verified("R1", records[at], records[at + 1 :], shorter)


def test_the_journal_of_another_run_is_refused() -> None:
    plain = {k: v for k, v in REF.items() if k not in ("enc", "kid")}  # a run recorded unsealed
    records, at, journal = snapshotted(journal=plain)
    with pytest.raises(LedgerError, match="journal of run"):
        verified("R2", records[at], records[at + 1 :], journal)


def test_a_journal_sealed_under_another_key_is_refused() -> None:
    records, at, journal = snapshotted(journal={**REF, "kid": "b.R9"})
    with pytest.raises(LedgerError, match="not under the run's key"):
        verified("R1", records[at], records[at + 1 :], journal)


def test_a_gap_in_the_tail_is_a_chain_error() -> None:
    records, at, journal = snapshotted()
    tail = records[at + 1 :]
    with pytest.raises(ChainError):
        verified("R1", records[at], tail[:1] + tail[2:], journal)


async def test_opening_a_journal_without_sealed_content_changes_nothing() -> None:
    records, _, _ = snapshotted()
    cp = fold(records)
    assert await opened_journal(cp, Opener(None)) == cp.to_dict()  # type: ignore[arg-type]
    assert Checkpoint.from_dict(json.loads(canonical_json(cp.to_dict()))) == cp


def test_snapshot_intervals_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        JournalSnapshotter(every=0)


def test_a_journal_becomes_the_checkpoint_from_dict_makes() -> None:
    records, _, _ = snapshotted()
    data = json.loads(canonical_json(fold(records).to_dict()))
    assert checkpoint_of(data) == Checkpoint.from_dict(data)
    del data["steps"][0]["attempts"]  # a step written by another version: the default fills in
    data["steps"][1]["later_field"] = 1  # and a field this version does not know is ignored
    assert checkpoint_of(data) == Checkpoint.from_dict(data)
    assert checkpoint_of(data).steps[0].attempts == 1


def test_a_stored_journal_is_the_checkpoint_from_dict_makes() -> None:
    records, _, _ = snapshotted()
    cp = fold(records)
    stored = _parsed(canonical_json(stored_journal(cp.to_dict())))  # the table, through the blob's bytes
    assert isinstance(stored["steps"], dict) and stored["steps"]["fields"][0] == "step"
    assert checkpoint_of(stored) == cp
    later = {**stored, "steps": {"fields": [*stored["steps"]["fields"], "later_field"],
                                 "rows": [[*row, 1] for row in stored["steps"]["rows"]]}}  # fmt: skip
    assert checkpoint_of(later) == cp  # a field this version does not know is ignored
    names = stored["steps"]["fields"]
    shuffled = {**stored, "steps": {"fields": names[::-1], "rows": [row[::-1] for row in stored["steps"]["rows"]]}}
    assert checkpoint_of(shuffled) == cp  # another order of the same fields
    with pytest.raises(ValueError):
        checkpoint_of({**stored, "steps": {"fields": names, "rows": [[0, "tool"]]}})  # a short row
    with pytest.raises(ValueError):
        checkpoint_of({**stored, "steps": {"fields": names[::-1], "rows": [[0, "tool"]]}})
    with pytest.raises(ValueError):
        checkpoint_of({**stored, "steps": {"fields": "step", "rows": []}})


@pytest.mark.parametrize(
    "text",
    [b'{"a":[1,-0,-0.0,1.5e300,5e-324,123456789012345678901234567890],"b":"\\u00e9\\n","a":2}', b'"\\ud800"',
     '{"\u00e9":"\U0001f600","n":null,"t":true}'.encode(), b"NaN", b"[1e400]"],
)  # fmt: skip
def test_a_journal_parses_as_json_loads_parses_it(text: bytes) -> None:
    assert repr(_parsed(text)) == repr(json.loads(text))


def test_the_stream_must_hold_the_head_where_the_snapshot_says() -> None:
    records, at, _ = snapshotted()
    snap = records[at].event.body_as(JournalSnapshotted)
    head = records[at - 1]
    raw = RawRecord(head.stream_seq, head.subject, head.event.to_bytes())
    _check_head("R1", snap, raw)
    with pytest.raises(LedgerError, match="no event at"):
        _check_head("R1", snap, None)
    other = records[at - 2]
    with pytest.raises(LedgerError, match="is not its head"):
        _check_head("R1", snap, RawRecord(head.stream_seq, head.subject, other.event.to_bytes()))
    with pytest.raises(LedgerError, match="is not its head"):
        _check_head("R2", snap, raw)
