"""The lean publish path (runledger.log.fastpublish) under publish_fenced, against a real nats-server:
lost acks retried and recognised, rejections answered instead of left waiting, zombies fenced, and
a server SIGKILLed and restarted under publishes in flight."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from nats.aio.msg import Msg
from nats.js.errors import APIError

from runledger.errors import FencedError, PublishError
from runledger.log.client import LedgerClient, connect
from runledger.log.fastpublish import AckInbox, inbox_for
from runledger.log.publish import RetryPolicy, SubjectWriter, publish_fenced
from runledger.log.reader import read_raw
from runledger.log.server import EmbeddedServer
from runledger.log.subjects import run_subject
from runledger.protect.loading import load_run
from runledger.record.events import ClockRead
from tests.conftest import eventually

pytestmark = pytest.mark.integration
QUICK_ACKS = RetryPolicy(deadline_s=20, ack_timeout_s=0.3, backoff_s=0.02, max_backoff_s=0.1)


def _drop_acks(inbox: AckInbox, count: int) -> list[str]:
    """Make the next ``count`` acks of ``inbox`` vanish (the server stored the message; the ack was lost)."""
    dropped: list[str] = []
    deliver = inbox._deliver

    def lossy(msg: Msg) -> None:
        if len(dropped) < count:
            dropped.append(msg.subject)
            return
        deliver(msg)

    inbox._deliver = lossy  # type: ignore[method-assign]
    return dropped


async def test_appends_go_through_the_lean_path_and_a_wrapped_publish_does_not(client: LedgerClient) -> None:
    assert isinstance(inbox_for(client.js), AckInbox)
    assert inbox_for(client.js) is inbox_for(client.js)  # one inbox a connection
    subject = run_subject("a", "lean1")
    seqs = [await publish_fenced(client.js, subject, b"x", "lean1:0", 0)]
    assert [m.stream_seq for m in await read_raw(client, subject)] == seqs
    calls: list[str] = []
    real = client.js.publish

    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        return await real(*args, **kwargs)

    client.js.publish = wrapped  # type: ignore[method-assign]
    try:
        assert inbox_for(client.js) is None
        await publish_fenced(client.js, subject, b"y", "lean1:1", seqs[-1])
        assert calls == [subject]
    finally:
        del client.js.publish


async def test_a_lost_ack_is_retried_and_recognised_as_our_own_write(client: LedgerClient) -> None:
    inbox = inbox_for(client.js)
    assert inbox is not None
    subject = run_subject("a", "lost2")
    first = await publish_fenced(client.js, subject, b"first", "lost2:0", 0, QUICK_ACKS)
    dropped = _drop_acks(inbox, 1)
    # The ack of the first attempt never arrives: the retry (same msg id, same fence) meets 10071 on a
    # single node, and the subject's last message shows it was ours.
    seq = await publish_fenced(client.js, subject, b"second", "lost2:1", first, QUICK_ACKS)
    assert len(dropped) == 1
    stored = await read_raw(client, subject)
    assert [m.data for m in stored] == [b"first", b"second"] and stored[-1].stream_seq == seq


async def test_lost_acks_on_a_whole_run_store_every_event_once(client: LedgerClient) -> None:
    inbox = inbox_for(client.js)
    assert inbox is not None
    subject = run_subject("a", "lost3")
    writer = SubjectWriter(client.js, subject, run_id="lost3", agent="a", msg_id_prefix="lost3", policy=QUICK_ACKS)
    await writer.append(ClockRead(step=0, value="t0"))
    dropped = _drop_acks(inbox, 3)
    for step in range(1, 6):
        await writer.append(ClockRead(step=step, value=f"t{step}"))
    assert len(dropped) == 3
    log = await load_run(client, "lost3")
    assert [e.payload["value"] for e in log.events] == [f"t{i}" for i in range(6)]
    assert not log.quarantined


async def test_a_rejected_message_is_answered_not_left_waiting(client: LedgerClient) -> None:
    inbox = inbox_for(client.js)
    assert inbox is not None
    patient = RetryPolicy(deadline_s=60, ack_timeout_s=30)
    subject = run_subject("a", "reject4")
    # A stale fence: the server answers 10071 at once; the ack timeout (30 s) is never what ends it.
    with pytest.raises(FencedError):
        await asyncio.wait_for(publish_fenced(client.js, subject, b"x", "reject4:0", 5, patient), timeout=10)
    # Another rejection, read from the error ack: the expected stream does not match.
    with pytest.raises(APIError) as info:
        await asyncio.wait_for(
            inbox.publish(subject, b"x", timeout=30, headers={"Nats-Expected-Stream": "NOT_THE_LEDGER"}), timeout=10
        )
    assert info.value.code == 400
    # A subject no stream takes: no responders, retried until the deadline, then PublishError.
    with pytest.raises(PublishError):
        await asyncio.wait_for(
            publish_fenced(client.js, "nostream.x", b"x", "nostream:0", 0, RetryPolicy(deadline_s=0.5)), timeout=10
        )
    assert not inbox._waiting  # nothing left waiting for an ack


async def test_a_zombie_on_another_connection_is_fenced(client: LedgerClient, nats_url: str) -> None:
    subject = run_subject("a", "zombie5")
    owner = SubjectWriter(client.js, subject, run_id="zombie5", agent="a", msg_id_prefix="zombie5")
    await owner.append(ClockRead(step=0, value="t0"))
    other = await connect(nats_url)
    try:
        assert inbox_for(other.js) is not inbox_for(client.js)
        zombie = SubjectWriter(
            other.js, subject, run_id="zombie5", agent="a", msg_id_prefix="zombie5",
            next_seq=owner.next_seq, prev_hash=owner.prev_hash, last_stream_seq=owner.last_stream_seq,
        )  # fmt: skip
        await owner.append(ClockRead(step=1, value="t1"))
        with pytest.raises(FencedError):
            await zombie.append(ClockRead(step=1, value="zombie"))
    finally:
        await other.close()
    log = await load_run(client, "zombie5")
    assert [e.payload["value"] for e in log.events] == ["t0", "t1"]


async def test_a_server_killed_under_publishes_in_flight_loses_and_doubles_nothing(tmp_path: Path) -> None:
    server = EmbeddedServer(home=tmp_path / "home")
    state = server.start(data_dir=tmp_path / "data")
    client = await connect(state.url)
    writers, per_writer = 12, 40
    done = [0] * writers
    policy = RetryPolicy(deadline_s=60, ack_timeout_s=1.0)

    async def write(w: int) -> None:
        subject = run_subject("a", f"kill{w}")
        last = 0
        for i in range(per_writer):
            last = await publish_fenced(client.js, subject, b"w%d-%d" % (w, i), f"kill{w}:{i}", last, policy)
            done[w] += 1

    try:
        tasks = asyncio.gather(*(write(w) for w in range(writers)))
        await eventually(lambda: sum(done) >= writers * per_writer // 4)
        os.kill(state.pid, signal.SIGKILL)
        await eventually(lambda: server.state() is None)
        at_kill = sum(done)
        await asyncio.sleep(0.5)  # publishes in flight and new ones now fail and are retried
        server.start(data_dir=Path(state.data_dir), port=state.port)
        await asyncio.wait_for(tasks, timeout=90)
        assert at_kill < writers * per_writer  # the kill really came mid-way
        for w in range(writers):
            stored = await read_raw(client, run_subject("a", f"kill{w}"))
            assert [m.data for m in stored] == [b"w%d-%d" % (w, i) for i in range(per_writer)]
    finally:
        await client.close()
        server.stop()
