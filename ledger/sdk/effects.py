"""The side-effect ledger: one hash-chained subject per idempotency key.

``ledger.effect.<digest(key)>`` holds the life of a key: ``effect.intended`` (the
claim), then ``effect.committed`` / ``effect.failed`` / ``effect.resolved``. The
claim is published with ``Nats-Expected-Last-Subject-Sequence`` equal to the
subject's last sequence while the key is free (0 for a new key), so the server
accepts exactly one claim per key across all processes. A claim with no outcome
is *in doubt*: nobody can know whether the action happened, so nobody guesses
(reconcile asks the external system, or an operator resolves).

States: free -> claimed -> committed | failed; claimed -> (resolved) committed | free;
failed -> free (the function raised before acting, so a new claim may try again).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal

from runledger.errors import ConfigurationError, LedgerError
from runledger.log.client import LedgerClient
from runledger.log.publish import PayloadTransform, RetryPolicy, SubjectWriter
from runledger.log.reader import decode_records, read_raw
from runledger.log.subjects import effect_msg_id, effect_subject
from runledger.record.events import GENESIS, EffectResolved, Payload
from runledger.record.records import Recorded

EffectStatus = Literal["free", "claimed", "committed", "failed"]


@dataclass
class KeyState:
    """The folded state of one idempotency key's subject."""

    key: str
    status: EffectStatus = "free"
    run_id: str | None = None
    step: int | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    via: str | None = None
    next_seq: int = 0
    last_hash: str = GENESIS
    last_stream_seq: int = 0


def fold_key(key: str, records: Iterable[Recorded]) -> KeyState:
    """Pure fold of a key subject's events into its state."""
    st = KeyState(key)
    for rec in records:
        apply_key(st, rec)
    return st


def apply_key(st: KeyState, rec: Recorded) -> None:
    """Fold one more event of the key subject into ``st`` (in place)."""
    ev, p = rec.event, rec.event.payload
    st.next_seq, st.last_hash = ev.seq + 1, ev.hash
    if rec.stream_seq:
        st.last_stream_seq = rec.stream_seq
    if ev.type == "effect.intended":
        st.status, st.run_id, st.step = "claimed", ev.run_id, p["step"]
        st.result = st.error = st.via = None
    elif ev.type == "effect.committed":
        st.status, st.result, st.via = "committed", p.get("result"), p.get("via", "act")
    elif ev.type == "effect.failed":
        st.status, st.error = "failed", p["error"]
    elif ev.type == "effect.resolved":
        if p["outcome"] == "committed":
            st.status, st.result, st.via = "committed", p.get("result"), p["by"]
        else:
            st.status = "free"


async def read_key(client: LedgerClient, key: str) -> KeyState:
    """Read and fold the key's subject. Garbage on the subject is skipped but still fences."""
    raws = await read_raw(client, effect_subject(key))
    good, _bad = decode_records(raws)
    state = fold_key(key, good)
    if raws:
        state.last_stream_seq = max(r.stream_seq for r in raws)
    return state


def key_writer(
    client: LedgerClient,
    state: KeyState,
    *,
    run_id: str,
    agent: str,
    policy: RetryPolicy,
    transform: PayloadTransform | None = None,
) -> SubjectWriter:
    """The writer that appends to the key's subject right after ``state`` (fenced on it)."""
    return SubjectWriter(
        client.js,
        effect_subject(state.key),
        run_id=run_id,
        agent=agent,
        msg_id_prefix=effect_msg_id(state.key, 0).rsplit(":", 1)[0],
        next_seq=state.next_seq,
        prev_hash=state.last_hash,
        last_stream_seq=state.last_stream_seq,
        policy=policy,
        transform=transform,
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
) -> KeyState:
    """Append one event to the key subject (fenced) and return the new state.

    ``transform`` is the run's content protection (the key subject holds the effect's
    arguments and result, so it is protected like the run's own subject)."""
    writer = key_writer(client, state, run_id=run_id, agent=agent, policy=policy, transform=transform)
    event = await writer.append(body)
    new = replace(state)
    apply_key(new, Recorded(event, writer.last_stream_seq))
    return new


async def resolve_key(
    client: LedgerClient,
    key: str,
    *,
    committed: bool,
    by: str,
    reason: str = "",
    result: Any = None,
    policy: RetryPolicy = RetryPolicy(),
) -> KeyState:
    """An operator's decision on an in-doubt key, recorded on the key's subject."""
    state = await read_key(client, key)
    if state.status != "claimed":
        raise LedgerError(
            f"effect {key!r} is not in doubt (it is {state.status}); there is nothing to resolve"
            if state.next_seq
            else f"no effect with key {key!r} was ever claimed"
        )
    if not by:
        raise ConfigurationError("say who resolves the effect: --by NAME")
    body = EffectResolved(
        key=key, outcome="committed" if committed else "not_committed", by=by, reason=reason, result=result
    )
    return await append_to_key(client, state, body, run_id=state.run_id or "", agent="operator", policy=policy)
