"""Tamper evidence: check each subject's hash chain and sequence, name the first bad event."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from runledger.errors import EventDecodeError, KeyStoreError, PayloadUnavailableError
from runledger.log.client import LedgerClient
from runledger.log.reader import read_raw
from runledger.log.subjects import any_agent_run_subject, parse_run_subject
from runledger.protect.blobs import is_blob_ref
from runledger.protect.capture import (
    PayloadOpener,
    client_opener,
    content_values,
    is_marker,
    is_sealed,
    is_sealed_text,
)
from runledger.record.events import GENESIS, decode
from runledger.record.records import RawRecord


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


async def verify_runs(client: LedgerClient, run_id: str | None = None, *, deep: bool = False) -> list[VerifyResult]:
    """Verify one run, or every run in the ledger; ``deep`` also checks content (verify_content)."""
    raws = await read_raw(client, any_agent_run_subject(run_id) if run_id else "ledger.run.>")
    by_subject: dict[str, list[RawRecord]] = defaultdict(list)
    for raw in raws:
        by_subject[raw.subject].append(raw)
    results = [verify_subject(subject, items) for subject, items in sorted(by_subject.items())]
    if deep:
        opener = client_opener(client)
        for result in results:
            await verify_content(opener, result, by_subject[result.subject])
    return results


def _flag(result: VerifyResult, stream_seq: int, seq: int, problem: str) -> None:
    result.problems.append(f"stream seq {stream_seq}: {problem}")
    if result.ok:
        result.ok, result.first_bad_stream_seq, result.first_bad_seq, result.reason = False, stream_seq, seq, problem


async def verify_content(opener: PayloadOpener, result: VerifyResult, raws: list[RawRecord]) -> None:
    """Content checks a hash chain cannot make (``verify --deep``).

    The chain proves the events are the ones that were written, in order, but anyone who may
    publish on the subject can append a well-formed event. Sealed content can only be written
    by a holder of the run's key: every sealed value must authenticate under it (AES-GCM), a
    run whose content is sealed may not carry unsealed content (a forged event by a writer
    without the key), and every blob must be in the object store under its own hash. An
    erased run is expected to have no key and no blobs.
    """
    events = []
    for raw in raws:
        try:
            events.append((raw, decode(raw.data)))
        except EventDecodeError:
            continue  # already reported by the chain check
    erased = any(ev.type == "run.erased" for _, ev in events)
    sealed = any(_is_sealed(v) for _, ev in events for v in content_values(ev))
    for raw, ev in events:
        for value in content_values(ev):
            problem: str | None = None
            if sealed and not is_marker(value):
                problem = f"{ev.type} carries unsealed content in a sealed run (written without the run's key: forged?)"
            else:
                try:
                    if isinstance(value, str):
                        await opener.open_text(value, strict=True)
                    else:
                        await opener.open_value(value, strict=True, fetch=True)
                except KeyStoreError:
                    problem = f"{ev.type} content fails authentication under the run's key (altered or forged)"
                except PayloadUnavailableError as exc:
                    expected = erased and ("erased" in exc.reason or "object store" in exc.reason)
                    if expected or "hash-only" in exc.reason:
                        continue
                    problem = f"{ev.type} content is unreadable: {exc.reason}"
            if problem is not None:
                _flag(result, raw.stream_seq, ev.seq, problem)
                break


def _is_sealed(value: Any) -> bool:
    return is_sealed(value) or is_sealed_text(value) or (is_blob_ref(value) and bool(value.get("enc")))
