"""The side-effect ledger: one hash-chained subject per idempotency key.

``ledger.effect.<agent>.<digest(key)>.<writer>`` holds the life of an agent's key: ``effect.intended`` (the
claim), then ``effect.committed`` / ``effect.failed`` / ``effect.resolved``. The
claim is published with ``Nats-Expected-Last-Subject-Sequence`` equal to the
subject's last sequence while the key is free (0 for a new key), so the server
accepts exactly one claim per key across all processes. A claim with no outcome
is *in doubt*: nobody can know whether the action happened, so nobody guesses
(reconcile asks the external system, or an operator resolves).

States: free -> claimed -> committed | failed; claimed -> (resolved) committed | free;
failed -> free (the function raised before acting, so a new claim may try again).

Every claim is an *attempt* (1, 2, ... in the order of the key's claims) and its stream sequence
is the attempt's *fencing token*: the attempt's outcome is published fenced on it, so once
anything else was written to the key (a resolution, the next attempt's claim) the older attempt
can record nothing more (FencedError). A claim carries a *lease* (``lease_s`` seconds from its
``ts``): while it runs, whoever settles the claim (a resume, ``runledger effects resolve``) waits
for it to expire, or forces, which is recorded (``effect.resolved`` with ``forced``). The lease
keeps a holder that is only paused from being overtaken while it may still act; the fence and the
idempotency key the effect function passes downstream (runledger.sdk.context) keep a holder that
wakes up after its lease from acting twice. Leases are measured on the wall clock of the claim's
writer (its ``ts``) against the reader's: they assume clocks agree to well within a lease.

Design note: the live write path (``RecordedRun.effect``, docs/wire.md "The claim protocol"), at the
floor of the guarantee. The key's claim is the only write ahead of acting: it is the intent (the
run's ``effect.intended`` payload), fenced on "the key is empty" (the key is read only when that
fence refuses), with the run's fence checked in flight with it (a direct get of the run's last
message; under output durability the window's own fenced flush). Then the outcome on the key, fenced
on the claim: awaited before the effect returns under step durability, on its way under output
durability (acknowledged by the run's next commit, before anything leaves the process). The run
records the intent and the outcome together once the key holds the outcome: built and published
once the effect has returned (under step durability holding the run's append lock from the
outcome's ack, so they come before the run's next event; under output durability joining the
window), acknowledged by ``commit``. A crash before they land is the wire's row "3", which a resume
completes from the key. A record that fails stops the run: its next append or commit raises the
failure, and no other key is claimed after it (a claim first waits for the record). The intent and
the outcome are protected (redacted, sealed) once for both subjects, which then hold the same
ciphertext. An effect in doubt (a crash between claim and outcome) shows on the key (which carries
the run and step), not on the run, until a resume meets it and writes it there.

Rejected, with what was measured here (2-core machine, nats-server with ``sync_interval: always``;
single fenced publishes 0.35-0.45 ms at p50 when quiet):
- The key's outcome and the run's mirror in one atomic batch: a batch commit costs ~2.8 ms however
  small (PITFALLS.md), against ~0.4 ms for the mirror published after the key's outcome.
- The key's outcome and the mirror published concurrently: a holder that lost its claim while it was
  paused (the key settled or claimed again after its lease) would see its outcome refused by the key
  and still accepted by the run, which then records an outcome the key never held; and the resume
  that took over the key finds its own run moved and is fenced out of it. A crash between the two
  would also leave "committed on the run, claimed on the key": in doubt for every later user of the
  key. The mirror is published only once the key accepted the outcome.
- Returning before the key's outcome is acknowledged: a crash right after would leave an effect that
  happened in doubt (a reconcile or an operator) where today the record says committed.
- (Once rejected, now done) the run's intent merged into the key's claim: the two were in flight
  together, but the server fsyncs each, one after the other (below: 1.6x one fenced publish), so an
  effect paid about 2.6 fenced publishes before returning. The run now records the intent after the
  outcome; an effect in doubt shows on its key until a resume writes it on the run.
- Reading the key before claiming it: already gone (the optimistic claim above); counted, a new
  effect makes 4 publishes and no read.
- The intent and the claim in one atomic batch: measured again on this server (interleaved), a
  batch of 1 or 2 messages took 4.3 ms at p50 on a quiet machine (20 ms on a loaded one) against
  1.1 ms (2.6 ms) for the two fenced publishes in flight together, themselves 1.6x (1.75x) one
  fenced publish and 0.9x two in a row: the server fsyncs each, one after the other. So an effect
  that returns once its key holds the outcome costs about 2.6 fenced publishes of round trips,
  plus its CPU; 2 would need one write fewer before acting (no intent on the run: a wire change).
- The intent's ack not waited for before acting (only before the outcome): a process that lost the
  run would claim a free key and act before its refused intent told it so.
Measured (process pairs of the code before and after the deferred mirror, interleaved run by run,
bench.record's mix of 60 steps, load 2-4; the guarantees in tests/integration/test_effects.py): an
effect step's p50 new/old 0.75 in a tight loop, where the next step waits for the mirror (model step
1.37, the run 0.94), and 0.81-0.94 with bench.record's work between steps; the mix's p50 is that of
the model and tool steps either way (1.03-1.05, within the pairs' noise of about 7%).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from runledger.errors import ConfigurationError, EffectWriteRefusedError, FencedError, LedgerError
from runledger.log.client import LedgerClient
from runledger.log.publish import PayloadTransform, RetryPolicy, SubjectWriter
from runledger.log.reader import decode_records, read_raw, subject_counts
from runledger.log.subjects import (
    AGENT_WRITER,
    OPERATOR_WRITER,
    WORKER_WRITER,
    Writer,
    any_agent_effect_subject,
    effect_filter,
    effect_msg_id,
    effect_subject,
    parse_effect_subject,
)
from runledger.record.canonical import CHAIN_FORMAT
from runledger.record.events import GENESIS, EffectResolved, Payload
from runledger.record.records import Recorded
from runledger.sdk.holder import is_gone

logger = logging.getLogger(__name__)
EffectStatus = Literal["free", "claimed", "committed", "failed"]


@dataclass
class KeyState:
    """The folded state of one idempotency key's subject."""

    key: str
    agent: str = ""  # whose key it is (the subject's agent); "" for a key never claimed, read by key alone
    status: EffectStatus = "free"
    run_id: str | None = None
    step: int | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    via: str | None = None
    next_seq: int = 0
    last_hash: str = GENESIS
    last_stream_seq: int = 0
    attempt: int = 0  # claims so far: the current (latest) claim's attempt number
    fencing_token: int = 0  # the stream sequence of the latest claim
    claimed_at: str | None = None  # the latest claim's ts
    lease_s: float | None = None  # the latest claim's lease (None: recorded before leases)
    holder: str | None = None  # the process that made the latest claim (runledger.sdk.holder)
    # The writer of the latest claim ("a" the agent, "w" a worker's branch; "" never claimed). The
    # agent's own runs take a key whose latest claim is a worker's as free (agent_view).
    writer: str = ""
    refused: list[str] = field(default_factory=list)  # messages refused from their writer: where and why


def fold_key(key: str, records: Iterable[Recorded], agent: str = "") -> KeyState:
    """Pure fold of a key subject's events into its state."""
    st = KeyState(key, agent)
    for rec in records:
        apply_key(st, rec)
    return st


_OUTCOMES = frozenset({"effect.committed", "effect.failed", "effect.resolved"})


@functools.lru_cache(maxsize=4096)  # asked at every event of a key
def _key_subject_parts(subject: str) -> tuple[str, str] | None:
    """(agent, writer) of a key subject; None for any other subject."""
    parsed = parse_effect_subject(subject)
    return None if parsed is None else (parsed[0], subject.rpartition(".")[2])


def key_refusal(st: KeyState, rec: Recorded) -> str | None:
    """Why ``rec`` may not change the key ``st`` holds (None: it may), judged by its subject's writer.

    Who may write what on ``ledger.effect.<agent>.<digest>.<writer>`` (docs/data-protection.md):

    - ``o``, an operator: only ``effect.resolved`` (any ``by``), nothing else;
    - ``a``, the agent that owns the key (the envelope's agent is the subject's): a claim at any time
      (the server's fence makes it follow the state its writer read), and the outcome of its own
      claim: ``effect.committed`` / ``effect.failed``, or ``effect.resolved`` by its ``reconcile``;
    - ``w``, a worker: a claim only of a free key (never claimed, failed or released: a key a branch
      opens; never one that a claim holds or an outcome committed), and the outcome of its own claim;
      and whatever a worker's branch records, its agent does not take it for its own (``agent_view``);
    - an outcome only while its writer's claim holds the key, from the claim's run (its envelope's
      run id), so an outcome nobody claimed, or one for another writer's claim, changes nothing.

    What the rules cannot tell apart: one worker's branch from another's (all workers write ``w``)."""
    parsed = _key_subject_parts(rec.subject)
    if parsed is None:
        return None
    agent, writer = parsed
    ev = rec.event
    kind = ev.type
    if writer == OPERATOR_WRITER:
        return None if kind == "effect.resolved" else f"{kind} on the key's operator subject (resolutions only)"
    if ev.agent != agent:
        return f"{kind} names agent {ev.agent!r} on a key of agent {agent!r} (a forged envelope)"
    if writer == WORKER_WRITER and kind == "effect.intended" and st.status in ("claimed", "committed"):
        return f"a worker's claim on a {st.status} key (a worker claims only a free key: a branch opens it)"
    if kind not in _OUTCOMES:
        return None
    if kind == "effect.resolved" and ev.payload.get("by") != "reconcile":
        return f"effect.resolved by {ev.payload.get('by')!r} off the operator's subject (a forged resolution)"
    if st.status != "claimed" or st.writer != writer or ev.run_id != st.run_id:
        return (f"{kind} from run {ev.run_id!r} as {writer!r}, where the key is {st.status}"
                + (f" by run {st.run_id!r} as {st.writer!r}" if st.status == "claimed" else "")
                + ": an outcome only of its writer's own claim")  # fmt: skip
    return None


def apply_key(st: KeyState, rec: Recorded) -> str | None:
    """Fold one more event of the key subject into ``st`` (in place).

    An event its writer may not write (``key_refusal``) changes nothing but the fence (it moved the
    subject: the next append follows it) and is listed in ``st.refused``; the reason is returned
    (None when the event was folded). Readers quarantine it and go on: a forgery never settles,
    frees or claims a key, nor makes it unreadable."""
    ev, p = rec.event, rec.event.payload
    st.next_seq, st.last_hash = ev.seq + 1, ev.hash
    if rec.stream_seq:
        st.last_stream_seq = rec.stream_seq
    if rec.subject:
        reason = key_refusal(st, rec)
        if reason is not None:
            st.refused = [*st.refused, f"stream seq {rec.stream_seq}: {reason}"]  # a new list: states are copied
            return reason
    if ev.type == "effect.intended":
        st.status, st.run_id, st.step = "claimed", ev.run_id, p["step"]
        st.result = st.error = st.via = None
        st.attempt += 1
        st.fencing_token = rec.stream_seq
        st.claimed_at, st.lease_s, st.holder = ev.ts, p.get("lease_s"), p.get("holder")
        if rec.subject:
            st.writer = rec.subject.rpartition(".")[2]
    elif ev.type == "effect.committed":
        st.status, st.result, st.via = "committed", p.get("result"), p.get("via", "act")
    elif ev.type == "effect.failed":
        st.status, st.error = "failed", p["error"]
    elif ev.type == "effect.resolved":
        if p["outcome"] == "committed":
            st.status, st.result, st.via = "committed", p.get("result"), p["by"]
        else:
            st.status = "free"
    return None


def agent_view(state: KeyState) -> KeyState:
    """The key as its agent's own runs take it: a key that only workers' branches ever claimed
    (``writer`` ``w``: a re-run allowed to act, or a worker's forgery) is free to the agent, which
    never takes a worker's word for its own key; it claims the key anew (fenced on what the subject
    holds, so the branch's claim is overtaken and fenced out)."""
    if state.writer != WORKER_WRITER:
        return state
    return replace(state, status="free", run_id=None, step=None, result=None, error=None, via=None)


async def key_agent(client: LedgerClient, key: str) -> str:
    """The agent whose subject holds ``key`` ("" when no agent ever claimed it), found from the
    stream's subject counts (nothing is read). ConfigurationError when two agents use the key."""
    agents = sorted({parsed[0] for subject in await subject_counts(client, any_agent_effect_subject(key))
                     if (parsed := parse_effect_subject(subject)) is not None})  # fmt: skip
    if len(agents) > 1:
        raise ConfigurationError(f"effect key {key!r} is used by agents {', '.join(agents)}: say which (--agent)")
    return agents[0] if agents else ""


async def read_key(client: LedgerClient, key: str, agent: str | None = None) -> KeyState:
    """Read and fold ``agent``'s key subject. Garbage on the subject is skipped but still fences.

    Without ``agent`` (an operator who knows only the key), the key is looked up among every agent's:
    found under two agents, it is ambiguous and ConfigurationError says which to name."""
    if agent is None:
        agent = await key_agent(client, key)
    if not agent:
        return KeyState(key)
    raws = await read_raw(client, effect_filter(agent, key))
    good, _bad = decode_records(raws)
    state = fold_key(key, good, agent)
    if raws:
        state.last_stream_seq = max(r.stream_seq for r in raws)
    for refused in state.refused:  # the projection quarantines the same messages
        logger.warning("effect %r of agent %s: a message was stepped over: %s", key, agent, refused)
    return state


def key_writer(
    client: LedgerClient,
    state: KeyState,
    *,
    run_id: str,
    agent: str,
    policy: RetryPolicy,
    transform: PayloadTransform | None = None,
    writer: Writer = AGENT_WRITER,
) -> SubjectWriter:
    """The writer that appends to the key's ``writer`` subject right after ``state`` (fenced on the
    whole key)."""
    return SubjectWriter(
        client.js,
        effect_subject(state.agent or agent, state.key, writer),
        run_id=run_id,
        agent=agent,
        msg_id_prefix=effect_msg_id(state.agent or agent, state.key, 0).rsplit(":", 1)[0],
        next_seq=state.next_seq,
        prev_hash=state.last_hash,
        last_stream_seq=state.last_stream_seq,
        policy=policy,
        transform=transform,
        # A key's history may span runs of either chain format: its events are written in today's.
        chain_format=CHAIN_FORMAT,
    )


async def append_to_key(
    client: LedgerClient,
    state: KeyState,
    body: Payload,
    *,
    run_id: str,
    agent: str,
    policy: RetryPolicy,
    transform: PayloadTransform | None = None,
    writer: Writer = AGENT_WRITER,
) -> KeyState:
    """Append one event to the key's ``writer`` subject (fenced) and return the new state.

    Raises EffectWriteRefusedError when the key's rules (``key_refusal``) refuse what was written: a
    worker's claim on a key that is claimed or committed, an outcome of a claim the writer does not hold.

    ``transform`` is the run's content protection (the key subject holds the effect's
    arguments and result, so it is protected like the run's own subject)."""
    appender = key_writer(client, state, run_id=run_id, agent=agent, policy=policy, transform=transform, writer=writer)
    event = await appender.append(body)
    new = replace(state)
    refused = apply_key(new, Recorded(event, appender.last_stream_seq, appender.subject))
    if refused is not None:
        # Stored, and stepped over by every reader: nothing may be done as if it counted (no act after
        # a claim the key does not hold).
        raise EffectWriteRefusedError(state.key, writer, refused)
    return new


def lease_remaining(state: KeyState, now: float | None = None) -> float:
    """Seconds until the lease of the key's claim expires: 0 when the key is not claimed, the lease
    has expired, the claim carries none, or its holder is certainly dead. At most the lease itself
    (a claim stamped in the future by a fast clock is waited for no longer than its lease)."""
    if state.status != "claimed" or state.lease_s is None or state.claimed_at is None:
        return 0.0
    if is_gone(state.holder):
        return 0.0  # the holder is certainly dead (this host, its pid gone): nothing to protect
    claimed = dt.datetime.fromisoformat(state.claimed_at.replace("Z", "+00:00")).timestamp()
    left = claimed + state.lease_s - (time.time() if now is None else now)
    return max(0.0, min(left, state.lease_s))


LeaseWaitReport = Callable[[float, KeyState], None]


async def wait_for_lease(
    client: LedgerClient, state: KeyState, *, on_wait: LeaseWaitReport | None = None, poll_s: float = 0.5
) -> KeyState:
    """Wait while the claim in ``state`` holds its lease; return the key's state when the lease has
    expired or the key moved on (its holder recorded an outcome, someone resolved it), whichever
    comes first. ``on_wait(seconds, state)`` is told once, before waiting.

    The lease ends on the wall clock (the claim's ``ts`` is wall-clock time); the wait is bounded
    on the monotonic clock too, by what was left of the lease plus a second, whatever the wall
    clock does meanwhile."""
    left = lease_remaining(state)
    if left <= 0:
        return state
    if on_wait is not None:
        on_wait(left, state)
    bound = time.monotonic() + left + 1.0
    while True:
        await asyncio.sleep(min(poll_s, left))
        fresh = await read_key(client, state.key, state.agent or None)
        left = lease_remaining(state)
        if fresh.last_stream_seq != state.last_stream_seq or left <= 0 or time.monotonic() >= bound:
            return fresh


async def resolve_key(
    client: LedgerClient,
    key: str,
    *,
    committed: bool,
    by: str,
    reason: str = "",
    result: Any = None,
    force: bool = False,
    on_lease: Callable[[float, KeyState, bool], None] | None = None,
    policy: RetryPolicy = RetryPolicy(),
    agent: str | None = None,
) -> KeyState:
    """An operator's decision on an in-doubt key of ``agent`` (found by the key alone when None),
    recorded on the key's subject.

    A claim whose lease has not expired may still be acted on by its holder: the decision waits
    for the lease, unless ``force``, which is recorded (``effect.resolved`` with ``forced=True``).
    ``on_lease(seconds_left, claim, forced)`` is told either way. The resolution fences the holder
    out: whatever it still tries to record about its attempt is refused."""
    if not by:
        raise ConfigurationError("say who resolves the effect: --by NAME")
    state = await read_key(client, key, agent)
    forced = False
    while state.status == "claimed" and (left := lease_remaining(state)) > 0:
        if on_lease is not None:
            on_lease(left, state, force)
        if force:
            forced = True
            break
        state = await wait_for_lease(client, state)
    if state.status != "claimed":
        raise LedgerError(
            f"effect {key!r} is not in doubt (it is {state.status}); there is nothing to resolve"
            if state.next_seq
            else f"no effect with key {key!r} was ever claimed"
        )
    body = EffectResolved(
        key=key,
        outcome="committed" if committed else "not_committed",
        by=by,
        reason=reason,
        result=result,
        forced=forced,
    )
    try:
        return await append_to_key(
            client, state, body, run_id=state.run_id or "", agent="operator", policy=policy, writer=OPERATOR_WRITER
        )
    except FencedError:
        raise LedgerError(
            f"effect {key!r} changed while it was being resolved (its holder recorded an outcome, or someone "
            f"else resolved it); nothing was recorded. Look at it again: `runledger effects show {key}`"
        ) from None
