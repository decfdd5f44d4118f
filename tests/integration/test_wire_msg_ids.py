"""docs/wire.md's warning, against a real server: a key's event published under the run's msg id
(``<run_id>:<seq>``) is acknowledged as a duplicate and never stored, so the key stays free; under the
key's own msg id (``effect:<agent>:<digest>:<seq>``) it is stored."""

from __future__ import annotations

import pytest

from runledger.log.client import LedgerClient
from runledger.log.subjects import (
    AGENT_WRITER,
    FENCE_HEADER,
    FENCE_SUBJECT_HEADER,
    LEDGER_STREAM,
    effect_msg_id,
    effect_subject,
    fence_filter,
    run_msg_id,
    run_subject,
)
from runledger.record.canonical import JCS_CHAIN_FORMAT, digest
from runledger.record.events import GENESIS, EffectIntended, make_event
from runledger.sdk.effects import read_key

pytestmark = pytest.mark.integration

AGENT, RUN, KEY = "msgid-agent", "msgidrun1", "refund:order-msgid"


async def _publish(client: LedgerClient, subject: str, data: bytes, msg_id: str) -> tuple[int, bool]:
    fence = fence_filter(subject)
    assert fence is not None
    ack = await client.js.publish(
        subject, data, headers={"Nats-Msg-Id": msg_id, FENCE_HEADER: "0", FENCE_SUBJECT_HEADER: fence}
    )
    return ack.seq, bool(ack.duplicate)


async def test_a_claim_under_the_runs_msg_id_is_dropped_as_a_duplicate(client: LedgerClient) -> None:
    args = {"order": "order-msgid", "amount": 1}
    intent = EffectIntended(step=0, name="refund", key=KEY, args=args, args_digest=digest(args, 2), lease_s=30.0)
    on_run, run_bytes = make_event(intent, run_id=RUN, agent=AGENT, seq=0, prev_hash=GENESIS,
                                   chain_format=JCS_CHAIN_FORMAT)  # fmt: skip
    _, duplicate = await _publish(client, run_subject(AGENT, RUN, AGENT_WRITER), run_bytes, run_msg_id(RUN, 0))
    assert not duplicate
    _, claim_bytes = make_event(
        intent, run_id=RUN, agent=AGENT, seq=0, prev_hash=GENESIS, chain_format=JCS_CHAIN_FORMAT
    )
    key_subject = effect_subject(AGENT, KEY, AGENT_WRITER)

    # The wrong msg id: the server says "duplicate" (of the run's event) and stores nothing on the key.
    _, duplicate = await _publish(client, key_subject, claim_bytes, run_msg_id(RUN, 0))
    assert duplicate
    assert (await read_key(client, KEY, AGENT)).status == "free"
    info = await client.js.stream_info(LEDGER_STREAM, subjects_filter=key_subject)
    assert not (info.state.subjects or {}).get(key_subject)

    # The key's own msg id: stored, and the key is claimed.
    seq, duplicate = await _publish(client, key_subject, claim_bytes, effect_msg_id(AGENT, KEY, 0))
    assert not duplicate and seq > 0
    state = await read_key(client, KEY, AGENT)
    assert state.status == "claimed" and state.run_id == RUN and state.fencing_token == seq
    assert on_run.payload == intent.model_dump(mode="json")
