"""Tamper evidence: check each subject's hash chain and sequence, name the first bad event."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from runledger.errors import EventDecodeError, KeyStoreError, PayloadUnavailableError
from runledger.log.client import LedgerClient
from runledger.log.reader import read_raw
from runledger.log.subjects import any_agent_run_subject, fence_filter, parse_run_subject
from runledger.protect.blobs import is_blob_ref
from runledger.protect.capture import (
    PayloadOpener,
    client_opener,
    content_values,
    is_placeholder,
    is_sealed,
    is_sealed_text,
)
from runledger.record.canonical import CHAIN_FORMATS
from runledger.record.events import GENESIS, decode
from runledger.record.fold import Checkpoint, refusal
from runledger.record.records import RawRecord, Recorded


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
    # Messages on the run's subjects that its chain does not include, refused from their writer (a
    # forged envelope, a worker on an agent's run, a decision off the operator's subject:
    # runledger.record.fold.refusal): named, as every reader quarantines them, and not a break of the run.
    quarantined: list[str] = field(default_factory=list)
    # The canonical JSON of the run's hashes (run.started's chain_format, docs/wire.md): 1 or 2;
    # None when the run has no readable run.started.
    chain_format: int | None = None

    @property
    def format_name(self) -> str:
        if self.chain_format is None:
            return "chain format unknown (no run.started)"
        return f"chain format {self.chain_format}, {CHAIN_FORMATS.get(self.chain_format, 'unknown')}"


def verify_subject(subject: str, raws: list[RawRecord]) -> VerifyResult:
    """Check one run's messages (in stream order, every writer's subject of it): each decodes, its
    hash matches its content, seq runs 0,1,2... with no gap and prev_hash links to the previous hash.

    A message its writer may not write (runledger.record.fold.refusal: an envelope that does not
    match its subject, a worker on an agent's run, an operator's decision anywhere but on the
    operator's subject) is no part of the chain: it is listed in ``quarantined``, as every reader
    leaves it out, and the chain is checked without it."""
    parsed = parse_run_subject(subject)
    result = VerifyResult(subject=subject, run_id=parsed[1] if parsed else subject)
    expected_seq, prev = 0, GENESIS
    writers = Checkpoint()
    for raw in raws:
        result.events += 1
        problem: str | None = None
        try:
            ev = decode(raw.data)
        except EventDecodeError as exc:
            problem = f"not a valid event ({exc.reason})"
        else:
            refused = refusal(writers, Recorded(ev, raw.stream_seq, raw.subject))
            if refused is not None:
                result.quarantined.append(f"stream seq {raw.stream_seq}: {refused}")
                continue
            if ev.seq != expected_seq:
                problem = f"seq {ev.seq} where {expected_seq} was expected (missing, duplicated or reordered)"
            elif ev.prev_hash != prev:
                problem = "prev_hash does not link to the previous event (modified or forged history)"
            else:
                if ev.seq == 0 and ev.type == "run.started":
                    result.chain_format = ev.payload.get("chain_format") or 1
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
    # One chain a run, across its writers' subjects (runledger.log.subjects), named by its first
    # message's subject (the run's own writer).
    by_run: dict[str, list[RawRecord]] = defaultdict(list)
    for raw in raws:
        by_run[fence_filter(raw.subject) or raw.subject].append(raw)
    chains = sorted((items[0].subject, items) for items in by_run.values())
    results = [verify_subject(subject, items) for subject, items in chains]
    if deep:
        opener = client_opener(client)
        for result, (_, items) in zip(results, chains, strict=True):
            await verify_content(opener, result, items)
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
    writers = Checkpoint()
    for raw in raws:
        try:
            ev = decode(raw.data)
        except EventDecodeError:
            continue  # already reported by the chain check
        if refusal(writers, Recorded(ev, raw.stream_seq, raw.subject)) is None:  # else quarantined: not the run's
            events.append((raw, ev))
    erased = any(ev.type == "run.erased" for _, ev in events)
    sealed = any(_is_sealed(v) for _, ev in events for v in content_values(ev))
    for raw, ev in events:
        for value in content_values(ev):
            problem: str | None = None
            if sealed and not is_placeholder(value):
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
