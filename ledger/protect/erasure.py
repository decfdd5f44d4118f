"""Erasing a run's content from an immutable log: destroy its key, delete its blobs, record the fact,
and do the same for every run derived from it.

The LEDGER stream denies deletes and purges, so content cannot be removed from it; it can
be made unreadable. Every content field of a run is sealed under the run's data key
(``runledger.protect.capture``), which lives only in the key store (``runledger.protect.keystore``). Erasing:

1. destroys the run's keys (secure deletion of the KV message, then a purge marker, so
   the key cannot be re-created for the run either); content sealed under it, in the run's
   events, in its effect claims and in its blobs, is unreadable through every reader; the
   redaction token key goes with it, so tokens can no longer be matched against guesses;
2. deletes the run's blobs from the object store (they are ciphertext already: belt and braces);
3. records ``run.erased`` on the run's subject (fenced like any operator decision), so
   readers know why the content is gone. Structure (types, steps, names, token usage,
   statuses, digests) stays readable and queryable; the hash chain, computed over the
   ciphertext, still verifies;
4. cascades to the run's *lineage*: every branch (``run.forked`` naming it: a sandbox re-run)
   and every child run (``run.child``: ``run.started`` naming it as parent, or its own
   ``child.started``), at any depth, is erased the same way, and its ``run.erased`` records
   ``because_of`` (the run whose erasure was asked for), ``derived_from`` and ``relation``.

Why cascade, and not "a branch keeps the parent's content sealed under the parent's key":
a derived run does not only copy the parent's values, it computes with them. A branch's
input is the parent's input; its live model calls after the fork send the parent's document
and earlier replies in their requests, and the replies quote them; a child's input is a
value of its parent. That content is the derived run's own record, sealed under its own key,
and no per-value rule can tell which of it came from the parent. Only destroying the derived
run's key reaches all of it. The price: erasing a run erases its branches and children too,
which is what "the content of this run is gone" has to mean.

Ordering (a re-run starting while its parent is erased): the root's key is destroyed and its
``run.erased`` recorded *before* the lineage is looked up, and a re-run checks its parent for
``run.erased`` *after* recording its ``run.forked`` (``erased_now``; ``cascade_to`` erases the
new branch when it finds one). Either the lookup sees the branch, or the branch sees the
erasure: no branch escapes. A run that is still running when it is erased can start a child
after the lookup: erase runs that have ended (the cascade is also run again by erasing again).

Finding the lineage reads the first two events of every run subject (``run.started``, then
``run.forked`` for a branch): one direct get each, in parallel, never the whole stream.
Rejected: an index of derived runs kept by their writers (every writer, the SDK's child runs
and the sandbox's branches, would have to keep it exact across crashes; the log already is
the index).

Idempotent: erasing again finishes a half-done erasure (of the run or of its lineage) and
records the events that are missing.

What erasure cannot reach, and says so: content recorded unsealed (``DataPolicy(encrypt=
False)``) stays in the stream until the retention window (stream max age) removes it; the
result counts those events. The DuckDB projection rewrites an erased run's rows on its next
``project`` (``runledger.projections``); Parquet files exported before the erasure are
outside the ledger's reach: export again.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from runledger.errors import ConfigurationError, EventDecodeError, LedgerError, RunNotFoundError
from runledger.log.append import append_to_run
from runledger.log.client import LedgerClient
from runledger.log.reader import RunLog, read_run, subject_counts
from runledger.log.subjects import (
    LEDGER_STREAM,
    OPERATOR_WRITER,
    RUN_PREFIX,
    WORKER_WRITER,
    parse_run_subject,
    writer_of,
)
from runledger.protect.blobs import BlobStore, is_blob_ref
from runledger.protect.capture import content_values, is_placeholder, is_sealed, is_sealed_text
from runledger.protect.keystore import KVKeyStore, run_kid
from runledger.record.events import RunErased, decode_fast
from runledger.record.fold import fold
from runledger.record.records import Recorded

Relation = Literal["branch", "child"]
# Direct gets in flight while the lineage is looked up.
_LOOKUPS = 32


@dataclass
class ErasureResult:
    run_id: str
    kid: str
    keys_destroyed: bool
    blobs_deleted: int
    plaintext_events: int
    recorded: bool  # False when an earlier erasure had already recorded run.erased
    derived_from: str | None = None  # a run of the lineage: the run it was branched or started from
    relation: Relation | None = None
    lineage: list[ErasureResult] = field(default_factory=list)  # the root's result: every derived run erased


@dataclass(frozen=True)
class Derived:
    """One run of a lineage: ``run_id`` (of ``agent``) was branched or started from ``derived_from``."""

    run_id: str
    agent: str
    derived_from: str
    relation: Relation


def _plain(value: Any) -> bool:
    """Content recorded readable without a key (neither sealed nor only a hash)."""
    if is_sealed(value) or is_sealed_text(value):
        return False
    if is_blob_ref(value):
        return not value.get("enc")
    return not is_placeholder(value) and value not in ("", None, [], {})


def _check(reason: str, by: str) -> None:
    if not reason.strip():
        raise ConfigurationError("say why the run is erased: --reason TEXT (it is recorded)")
    if not by.strip():
        raise ConfigurationError("say who erases the run: --by NAME")


async def erase_run(client: LedgerClient, run_id: str, *, reason: str, by: str, cascade: bool = True) -> ErasureResult:
    """Erase the content of ``run_id`` and, with ``cascade`` (the default), of every run derived
    from it (see the module docstring). Raises RunNotFoundError."""
    _check(reason, by)
    log = await read_run(client, run_id)
    result = await _erase_one(client, log, reason=reason, by=by)
    if cascade:
        for derived in await find_lineage(client, run_id):
            result.lineage.append(await _erase_derived(client, derived, root=run_id, reason=reason, by=by))
    return result


async def cascade_to(client: LedgerClient, run_id: str, derived_from: str, relation: Relation) -> ErasureResult:
    """Erase ``run_id`` because ``derived_from``, which it derives from, was erased: what a run that
    started while its parent was being erased does on finding out (``erased_now``). The reason
    and who are the parent's; ``because_of`` is the run whose erasure was asked for."""
    erased = await erased_now(client, derived_from)
    if erased is None:
        raise LedgerError(f"run {derived_from} is not erased: nothing to cascade to {run_id}")
    log = await read_run(client, run_id)
    derived = Derived(run_id, log.agent, derived_from, relation)
    root = str(erased.get("because_of") or derived_from)
    return await _erase_derived(client, derived, root=root, reason=str(erased["reason"]), by=str(erased["by"]))


async def erased_now(client: LedgerClient, run_id: str) -> dict[str, Any] | None:
    """The run's erasure (``Checkpoint.erased``: by, reason, ts, because_of) as the log says now,
    or None. Raises RunNotFoundError."""
    return fold((await read_run(client, run_id)).records, check_chain=False).erased


async def _erase_derived(client: LedgerClient, derived: Derived, *, root: str, reason: str, by: str) -> ErasureResult:
    try:
        log = await read_run(client, derived.run_id, agent=derived.agent)
    except RunNotFoundError:
        # A child named by its parent's child.started that never recorded an event: its keys may
        # exist already (they are created before run.started). Destroying them (and leaving the
        # purge marker) also stops it from ever starting.
        kid = run_kid(derived.agent, derived.run_id)
        destroyed = await KVKeyStore(client.js).destroy(kid)
        return ErasureResult(derived.run_id, kid, destroyed, 0, 0, False, derived.derived_from, derived.relation)
    cause = {"because_of": root, "derived_from": derived.derived_from, "relation": derived.relation}
    result = await _erase_one(client, log, reason=reason, by=by, cause=cause)
    result.derived_from, result.relation = derived.derived_from, derived.relation
    return result


async def _erase_one(
    client: LedgerClient, log: RunLog, *, reason: str, by: str, cause: dict[str, Any] | None = None
) -> ErasureResult:
    cp = fold(log.records, check_chain=False)
    kid = run_kid(log.agent, log.run_id, worker=writer_of(log.subject) == WORKER_WRITER)
    shas: set[str] = set()
    plaintext = 0
    for rec in log.records:
        values = content_values(rec.event)
        # Only the run's own blobs (sealed under its key, or unsealed): a reference copied from
        # another run's record stays that run's to erase.
        shas.update(v["sha256"] for v in values if is_blob_ref(v) and v.get("kid", kid) == kid)
        plaintext += any(_plain(v) for v in values)
    destroyed = await KVKeyStore(client.js).destroy(kid)
    blobs = BlobStore(client)
    deleted = 0
    for sha in sorted(shas):
        deleted += await blobs.delete(sha)
    recorded = False
    if cp.erased is None:
        body = RunErased(
            reason=reason,
            by=by,
            kid=kid,
            keys_destroyed=destroyed,
            blobs_deleted=deleted,
            plaintext_events=plaintext,
            **(cause or {}),
        )
        await append_to_run(client, log.run_id, body, log=log)
        recorded = True
    return ErasureResult(log.run_id, kid, destroyed, deleted, plaintext, recorded)


async def find_lineage(client: LedgerClient, run_id: str) -> list[Derived]:
    """Every run derived from ``run_id``, at any depth, parents before their derived runs.

    A branch names its parent in its ``run.forked`` (its second event); a child names its
    parent in its ``run.started`` (its first). A child whose ``run.started`` was never recorded
    is found through its parent's ``child.started`` (a branch's ``child.started`` names the
    parent's child, which it served from the record: not derived from the branch)."""
    edges = await _derivation_edges(client)
    found: list[Derived] = []
    seen = {run_id}
    frontier = [run_id]
    while frontier:
        parent = frontier.pop(0)
        children = list(edges.get(parent, []))
        children += [c for c in await _started_children(client, parent) if c.run_id not in {d.run_id for d in children}]
        for derived in children:
            if derived.run_id not in seen:
                seen.add(derived.run_id)
                found.append(derived)
                frontier.append(derived.run_id)
    return found


async def _derivation_edges(client: LedgerClient) -> dict[str, list[Derived]]:
    """parent run id -> the runs that name it in their first two events."""
    subjects = sorted(await subject_counts(client, f"{RUN_PREFIX}.>"))
    gate = asyncio.Semaphore(_LOOKUPS)

    async def head(subject: str) -> list[Derived]:
        parsed = parse_run_subject(subject)
        if parsed is None or writer_of(subject) == OPERATOR_WRITER:  # decisions name no parent
            return []
        agent, run_id = parsed
        out: list[Derived] = []
        async with gate:
            seq = 1
            for _ in range(2):
                found = await _next_on(client, subject, seq)
                if found is None:
                    break
                seq, payload, type_ = found[0] + 1, found[1], found[2]
                # A branch's fork parent: run.forked's forked_from (schema 2) or parent_run_id (1).
                parent = payload.get("forked_from", payload.get("parent_run_id"))
                if isinstance(parent, str) and type_ in ("run.started", "run.forked"):
                    out.append(Derived(run_id, agent, parent, "branch" if type_ == "run.forked" else "child"))
        return out

    edges: dict[str, list[Derived]] = {}
    for derived_runs in await asyncio.gather(*(head(s) for s in subjects)):
        for derived in derived_runs:
            known = edges.setdefault(derived.derived_from, [])
            if all(d.run_id != derived.run_id for d in known):  # a branch of a child names one parent twice
                known.append(derived)
    return edges


async def _next_on(client: LedgerClient, subject: str, seq: int) -> tuple[int, dict[str, Any], str] | None:
    """(stream sequence, payload, type) of the first decodable message on ``subject`` at or after ``seq``."""
    import nats
    from nats.js.errors import NotFoundError

    try:
        msg = await client.js.get_msg(LEDGER_STREAM, seq=seq, subject=subject, next=True, direct=True)
    except NotFoundError:
        return None
    except (TimeoutError, nats.errors.Error) as exc:
        raise LedgerError(
            f"cannot look up the runs derived from an erased run ({type(exc).__name__}): erase again"
        ) from exc
    if msg.seq is None or msg.data is None:
        return None
    try:
        event = decode_fast(msg.data)
    except (EventDecodeError, ValueError):
        return (msg.seq, {}, "")  # not an event: it derives nothing (readers quarantine it)
    return (msg.seq, event.payload, event.type)


async def _started_children(client: LedgerClient, run_id: str) -> list[Derived]:
    """The children ``run_id`` started itself (its ``child.started``), unless it is a branch."""
    try:
        log = await read_run(client, run_id)
    except RunNotFoundError:
        return []
    if any(r.event.type == "run.forked" for r in log.records):
        return []
    return [
        Derived(str(p["run_id"]), str(p["agent"]), run_id, "child")
        for p in (r.event.payload for r in log.records if r.event.type == "child.started")
    ]


# What erased content reads as, everywhere (the projection's rows too: projections.erasure).
ERASED: dict[str, Any] = {"$erased": True}
ERASED_TEXT = "«erased»"


def erased_value(value: Any) -> Any:
    """``value`` with the content an erasure made unreadable (sealed values and texts, encrypted blob
    references) replaced by ``{"$erased": true}`` / ``«erased»``; everything else as it is. For a value
    of an erased run (or a key it committed) once every key that could open it was tried."""
    if is_sealed(value) or (is_blob_ref(value) and value.get("enc")):
        return dict(ERASED)
    if is_sealed_text(value):
        return ERASED_TEXT
    if isinstance(value, dict):
        return {k: erased_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [erased_value(v) for v in value]
    return value


def erased_log(log: RunLog) -> RunLog:
    """``log`` (of an erased run, content opened where it could be) with what stayed sealed shown as erased."""
    records = [
        Recorded(r.event.model_copy(update={"payload": erased_value(r.event.payload)}), r.stream_seq, r.subject)
        for r in log.records
    ]
    return replace(log, records=records)
