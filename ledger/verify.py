"""Tamper evidence: check each subject's hash chain and sequence, name the first bad event."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ledger.client import LedgerClient
from ledger.errors import EventDecodeError
from ledger.events import GENESIS, decode
from ledger.reader import read_raw
from ledger.records import RawRecord
from ledger.subjects import any_agent_run_subject, parse_run_subject


@dataclass
class VerifyResult:
    subject: str
    run_id: str
    events: int = 0
    ok: bool = True
    first_bad_stream_seq: int | None = None
    first_bad_seq: int | None = None
    reason: str = ""
    problems: list[str] = field(default_factory=list)


def verify_subject(subject: str, raws: list[RawRecord]) -> VerifyResult:
    """Check one subject's messages (in stream order): each decodes, its hash matches its
    content, seq runs 0,1,2... with no gap, and prev_hash links to the previous hash."""
    parsed = parse_run_subject(subject)
    result = VerifyResult(subject=subject, run_id=parsed[1] if parsed else subject)
    expected_seq, prev = 0, GENESIS
    for raw in raws:
        result.events += 1
        problem: str | None = None
        try:
            ev = decode(raw.data)
        except EventDecodeError as exc:
            problem = f"not a valid event ({exc.reason})"
        else:
            if parsed and ev.run_id != parsed[1]:
                problem = f"event claims run {ev.run_id!r} on another run's subject (forged)"
            elif ev.seq != expected_seq:
                problem = f"seq {ev.seq} where {expected_seq} was expected (missing, duplicated or reordered)"
            elif ev.prev_hash != prev:
                problem = "prev_hash does not link to the previous event (modified or forged history)"
            else:
                expected_seq, prev = ev.seq + 1, ev.hash
        if problem is not None:
            result.problems.append(f"stream seq {raw.stream_seq}: {problem}")
            if result.ok:
                result.ok = False
                result.first_bad_stream_seq = raw.stream_seq
                result.first_bad_seq = expected_seq
                result.reason = problem
    return result


async def verify_runs(client: LedgerClient, run_id: str | None = None) -> list[VerifyResult]:
    """Verify one run, or every run in the ledger."""
    raws = await read_raw(client, any_agent_run_subject(run_id) if run_id else "ledger.run.>")
    by_subject: dict[str, list[RawRecord]] = defaultdict(list)
    for raw in raws:
        by_subject[raw.subject].append(raw)
    return [verify_subject(subject, items) for subject, items in sorted(by_subject.items())]
