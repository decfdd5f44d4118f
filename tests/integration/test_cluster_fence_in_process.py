"""A fenced append on a replicated stream while another fenced append of the same run is in process.

On a 3-node cluster the stream leader refuses a publish fenced on a subject that already has a
fenced publish in process (proposed, not yet applied) with 10164, "wrong last sequence" and no
number: it cannot check the fence yet. A run's own writer meets it when it publishes again
before the earlier attempt was applied: a retry after an ack that came late (the load bench met
it at 10 agents on the cluster: a run failed with PublishError "server rejected it: wrong last
sequence"). It is not a verdict on the fence: the same request asked again gets one.

Asserted with the earlier attempt sent fire-and-forget just before ``publish_fenced``:
- our own earlier attempt: ``publish_fenced`` returns the sequence it was stored under, and
  the run holds every event exactly once, in order;
- another writer's publish in process: ``publish_fenced`` raises FencedError (the fence holds),
  never PublishError, never a second event stored.
"""

from __future__ import annotations

import asyncio

import pytest

from runledger.errors import FencedError
from runledger.log.client import LedgerClient
from runledger.log.cluster import ClusterState, LocalCluster
from runledger.log.publish import RetryPolicy, last_subject_seq, publish_fenced
from runledger.log.subjects import FENCE_HEADER, FENCE_SUBJECT_HEADER, LEDGER_STREAM, fence_filter, run_subject
from runledger.record.ids import new_id
from tests.conftest import cluster_client

pytestmark = pytest.mark.integration

ROUNDS = 40
ZOMBIE_ROUNDS = 10


def _headers(subject: str, msg_id: str, expected: int) -> dict[str, str]:
    return {"Nats-Msg-Id": msg_id, FENCE_HEADER: str(expected), FENCE_SUBJECT_HEADER: fence_filter(subject) or subject}


def test_an_append_racing_a_fenced_append_in_process_gets_a_verdict_not_a_rejection(
    cluster: tuple[LocalCluster, ClusterState],
) -> None:
    _, state = cluster

    async def main() -> None:
        client = await cluster_client(state.url)
        js, nc = client.js, client.nc
        policy = RetryPolicy(deadline_s=20)
        run = new_id()
        subject = run_subject("fencer", run)
        last = 0
        for i in range(ROUNDS):
            data, msg_id = f"event {i}".encode(), f"{run}:{i}"
            # The earlier attempt, its ack lost: sent, not waited for.
            await nc.publish(subject, data, headers=_headers(subject, msg_id, last))
            seq = await publish_fenced(js, subject, data, msg_id, last, policy)
            assert seq > last
            last = seq

        stored = await _messages(client, subject)
        assert stored == [f"event {i}".encode() for i in range(ROUNDS)]
        assert await last_subject_seq(js, subject) == last

        # Another writer's append in process: the fence must hold (FencedError), not be retried past.
        for i in range(ZOMBIE_ROUNDS):
            theirs = f"theirs {i}".encode()
            await nc.publish(subject, theirs, headers=_headers(subject, f"{run}:theirs:{i}", last))
            with pytest.raises(FencedError):
                await publish_fenced(js, subject, b"ours", f"{run}:ours:{i}", last, policy)
            last = await last_subject_seq(js, subject)
        after = await _messages(client, subject)
        assert after[ROUNDS:] == [f"theirs {i}".encode() for i in range(ZOMBIE_ROUNDS)]
        await client.close()

    async def _messages(client: LedgerClient, subject: str) -> list[bytes]:
        sub = await client.js.subscribe(subject, ordered_consumer=True, stream=LEDGER_STREAM)
        out: list[bytes] = []
        info = await client.js.stream_info(LEDGER_STREAM, subjects_filter=subject)
        want = (info.state.subjects or {}).get(subject, 0)
        while len(out) < want:
            msg = await asyncio.wait_for(sub.next_msg(timeout=5), 10)
            out.append(msg.data)
        await sub.unsubscribe()
        return out

    asyncio.run(main())
