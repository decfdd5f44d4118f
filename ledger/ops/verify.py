"""Tamper evidence: check each run's hash chain and sequence, name the first bad event, and raise the
alarm on forgeries: messages under a run's id that its writers may not write (``Forgery``)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from runledger.errors import EventDecodeError, KeyStoreError, PayloadUnavailableError, RunNotFoundError
from runledger.log.client import LedgerClient
from runledger.log.reader import own_run_filter, read_raw
from runledger.log.subjects import (
    AGENT_WRITER,
    OPERATOR_WRITER,
    RUN_PREFIX,
    WORKER_WRITER,
    parse_run_subject,
    writer_of,
)
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
from runledger.record.events import GENESIS, Event, decode
from runledger.record.fold import Checkpoint, refusal, split_refused
from runledger.record.records import RawRecord, Recorded


@dataclass(frozen=True)
class Forgery:
    """A message under a run's id that its chain does not include: one its writer may not write
    (runledger.record.fold.refusal: another agent under a taken run id, a forged envelope, a worker on
    an agent's run, a decision off the operator's subject) or bytes that are no event off the run's
    own subject. Every reader quarantines it; ``verify`` raises the alarm (exit 7)."""

    stream_seq: int
    subject: str
    reason: str

    @property
    def agent(self) -> str:
        """The agent the subject names."""
        parsed = parse_run_subject(self.subject)
        return parsed[0] if parsed else ""

    @property
    def writer(self) -> str:
        """Who published it, by the subject's writer token, which the server lets only that role
        write: the login ``agent-<name>``, ``worker`` or ``operator`` (runledger.protect.roles)."""
        names: dict[str, str] = {AGENT_WRITER: f"agent-{self.agent}", WORKER_WRITER: "worker"}
        names[OPERATOR_WRITER] = "operator"
        return names.get(writer_of(self.subject) or "", "unknown")

    def __str__(self) -> str:
        return f"stream seq {self.stream_seq}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {"stream_seq": self.stream_seq, "subject": self.subject, "writer": self.writer,
                "agent": self.agent, "reason": self.reason}  # fmt: skip


@dataclass
class VerifyResult:
    subject: str  # where the run's own writer appends (its first accepted message's subject)
    run_id: str
    agent: str = ""  # the run id's agent: the agent of its first accepted message (its run.started)
    events: int = 0  # the run's own messages: its chain and the problems in it, forgeries left out
    ok: bool = True
    first_bad_stream_seq: int | None = None
    first_bad_seq: int | None = None
    reason: str = ""
    problems: list[str] = field(default_factory=list)
    # Messages under the run's id that its chain does not include (``Forgery``): named, as every
    # reader quarantines them, never a break of the run, and an alarm (``runledger verify`` exits 7).
    forgeries: list[Forgery] = field(default_factory=list)
    # Read with an agent's credentials: other agents' subjects under the run's id, with their message
    # counts, which these credentials may not read (runledger.log.reader.own_run_filter).
    unread: dict[str, int] = field(default_factory=dict)
    # The canonical JSON of the run's hashes (run.started's chain_format, docs/wire.md): 1 or 2;
    # None when the run has no readable run.started.
    chain_format: int | None = None

    @property
    def quarantined(self) -> list[str]:
        """The forgeries as lines: ``stream seq N: why``."""
        return [str(f) for f in self.forgeries]

    @property
    def forged(self) -> bool:
        """Forgeries were found under the run's id (or another agent's messages that could not be read)."""
        return bool(self.forgeries or self.unread)

    @property
    def format_name(self) -> str:
        if self.chain_format is None:
            return "chain format unknown (no run.started)"
        return f"chain format {self.chain_format}, {CHAIN_FORMATS.get(self.chain_format, 'unknown')}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "agent": self.agent, "subject": self.subject, "events": self.events, "ok": self.ok,
            "first_bad_stream_seq": self.first_bad_stream_seq, "first_bad_seq": self.first_bad_seq,
            "reason": self.reason, "problems": self.problems, "chain_format": self.chain_format,
            "forged": self.forged, "forgeries": [f.to_dict() for f in self.forgeries], "unread": self.unread,
            "quarantined": self.quarantined,
        }  # fmt: skip


def verify_subject(subject: str, raws: list[RawRecord]) -> VerifyResult:
    """Check one run id's messages (in stream order, every agent's and writer's subject of it): each
    decodes, its hash matches its content, seq runs 0,1,2... with no gap and prev_hash links to the
    previous hash. ``subject``: any subject of the run (its id is taken from it).

    The run is the id's first accepted message's agent's (runledger.record.fold.refusal, as every
    reader finds it). A message its writer may not write (another agent under the run's id, an
    envelope that does not match its subject, a worker on an agent's run, an operator's decision
    anywhere but on the operator's subject), and bytes that are no event on any subject but the
    run's own, are no part of the chain: they are listed in ``forgeries``, as every reader leaves them
    out, and the chain is checked without them."""
    parsed = parse_run_subject(subject)
    decoded: list[tuple[RawRecord, Event | str]] = []
    for raw in raws:
        try:
            decoded.append((raw, decode(raw.data)))
        except EventDecodeError as exc:
            decoded.append((raw, f"not a valid event ({exc.reason})"))
    accepted, refused = split_refused(Recorded(ev, raw.stream_seq, raw.subject)
                                      for raw, ev in decoded if not isinstance(ev, str))  # fmt: skip
    why = {rec.stream_seq: reason for rec, reason in refused}
    own = accepted[0].subject if accepted else (raws[0].subject if raws else subject)
    owner = parse_run_subject(own)
    result = VerifyResult(subject=own, run_id=parsed[1] if parsed else subject, agent=owner[0] if owner else "")
    expected_seq, prev = 0, GENESIS
    for raw, ev in decoded:
        problem: str | None = None
        if isinstance(ev, str):
            if raw.subject != own:  # another writer's garbage: a stray, never a break (quarantine_error)
                result.forgeries.append(Forgery(raw.stream_seq, raw.subject, f"{ev} on {raw.subject}"))
                continue
            problem = ev
        elif raw.stream_seq in why:
            result.forgeries.append(Forgery(raw.stream_seq, raw.subject, why[raw.stream_seq]))
            continue
        elif ev.seq != expected_seq:
            problem = f"seq {ev.seq} where {expected_seq} was expected (missing, duplicated or reordered)"
        elif ev.prev_hash != prev:
            problem = "prev_hash does not link to the previous event (modified or forged history)"
        else:
            if ev.seq == 0 and ev.type == "run.started":
                result.chain_format = ev.payload.get("chain_format") or 1
            expected_seq, prev = ev.seq + 1, ev.hash
        result.events += 1
        if problem is not None:
            _flag(result, raw.stream_seq, expected_seq, problem)
    return result


async def verify_runs(client: LedgerClient, run_id: str | None = None, *, deep: bool = False) -> list[VerifyResult]:
    """Verify one run, or every run in the ledger; ``deep`` also checks content (verify_content).

    One result a run id, across every agent's and writer's subjects of it: the id is its first
    agent's, and what another agent wrote under it is a forgery of that run, never a second run.
    Logged in as an agent (``client.agent``), its own runs only (runledger.log.reader.own_run_filter:
    another agent's run raises RunOfAnotherAgentError), with the other agents' subjects under the id
    named in ``unread``. Raises RunNotFoundError for a ``run_id`` with no message."""
    unread: dict[str, int] = {}
    if run_id is not None:
        subject_filter, unread = await own_run_filter(client, run_id, None)
    else:
        subject_filter = f"{RUN_PREFIX}.{client.agent}.>" if getattr(client, "agent", None) else f"{RUN_PREFIX}.>"
    raws = await read_raw(client, subject_filter)
    if run_id is not None and not raws:
        raise RunNotFoundError(run_id)
    by_run: dict[str, list[RawRecord]] = defaultdict(list)
    for raw in raws:
        parsed = parse_run_subject(raw.subject)
        by_run[parsed[1] if parsed else raw.subject].append(raw)
    chains = sorted(by_run.items())
    results = [verify_subject(items[0].subject, items) for _, items in chains]
    for result in results:
        result.unread = unread
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
