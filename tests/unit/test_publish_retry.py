"""publish_fenced against a scripted JetStream: what a cluster between leaders answers.

The cluster failover test (tests/integration/test_cluster_failover.py) shows the whole path
on real servers; which error a publish meets there depends on timing, so the answers that
matter are scripted here one by one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import nats
import pytest
from nats.js.api import PubAck
from nats.js.errors import APIError, NotFoundError, ServiceUnavailableError

from runledger.errors import FencedError, PublishError
from runledger.log.publish import RetryPolicy, publish_fenced, retrying

FAST = RetryPolicy(deadline_s=2.0, ack_timeout_s=0.1, backoff_s=0.001, max_backoff_s=0.002)


@dataclass
class Msg:
    seq: int
    data: bytes
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class ScriptedJS:
    """Answers each publish / direct get with the next scripted outcome (a value, or an exception)."""

    publishes: list[Any]
    lasts: list[Any] = field(default_factory=list)
    published: int = 0

    async def publish(self, subject: str, data: bytes, timeout: float, headers: dict[str, str]) -> PubAck:
        self.published += 1
        return _answer(self.publishes.pop(0))  # type: ignore[no-any-return]

    async def get_last_msg(self, stream: str, subject: str, direct: bool) -> Msg:
        return _answer(self.lasts.pop(0))  # type: ignore[no-any-return]


def _answer(outcome: Any) -> Any:
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def wrong_last(actual: int) -> APIError:
    return APIError(code=400, err_code=10071, description=f"wrong last sequence: {actual}")


async def test_leader_election_errors_are_retried_with_the_same_fence() -> None:
    js = ScriptedJS(
        publishes=[
            ServiceUnavailableError(code=503, description="no responders"),
            APIError(code=500, err_code=10008, description="JetStream system temporarily unavailable"),
            nats.errors.NoRespondersError(),
            nats.errors.TimeoutError(),
            PubAck(stream="LEDGER", seq=12),
        ]
    )
    assert await publish_fenced(js, "s", b"x", "r:3", 11, FAST) == 12  # type: ignore[arg-type]
    assert js.published == 5


async def test_a_run_stops_when_no_ack_comes_before_the_deadline() -> None:
    js = ScriptedJS(publishes=[ServiceUnavailableError(code=503, description="x")] * 10_000)
    with pytest.raises(PublishError, match="no acknowledgement"):
        await publish_fenced(js, "s", b"x", "r:3", 11, RetryPolicy(deadline_s=0.05, backoff_s=0.001))  # type: ignore[arg-type]


async def test_other_rejections_are_not_retried() -> None:
    js = ScriptedJS(publishes=[APIError(code=400, err_code=10054, description="maximum payload exceeded")])
    with pytest.raises(PublishError, match="maximum payload"):
        await publish_fenced(js, "s", b"x", "r:3", 11, FAST)  # type: ignore[arg-type]
    assert js.published == 1


async def test_a_lagging_replica_does_not_turn_our_own_stored_retry_into_fencing() -> None:
    # The first attempt was stored at 12 but its ack was lost; the retry is told "wrong last
    # sequence: 12". The direct get is first answered by a replica still at 11.
    ours = Msg(seq=12, data=b"x", headers={"Nats-Msg-Id": "r:3"})
    js = ScriptedJS(
        publishes=[nats.errors.TimeoutError(), wrong_last(12)],
        lasts=[Msg(seq=11, data=b"older"), NotFoundError(), ours],
    )
    assert await publish_fenced(js, "s", b"x", "r:3", 11, FAST) == 12  # type: ignore[arg-type]


async def test_another_writer_is_fenced_out() -> None:
    theirs = Msg(seq=12, data=b"y", headers={"Nats-Msg-Id": "zombie:3"})
    js = ScriptedJS(publishes=[wrong_last(12)], lasts=[theirs])
    with pytest.raises(FencedError):
        await publish_fenced(js, "s", b"x", "r:3", 11, FAST)  # type: ignore[arg-type]


def in_process() -> APIError:
    return APIError(code=400, err_code=10164, description="wrong last sequence")


async def test_a_fence_in_process_is_asked_again_not_taken_as_a_verdict() -> None:
    # 10164: the leader could not check the fence (another fenced publish of the run in process).
    js = ScriptedJS(publishes=[in_process(), in_process(), PubAck(stream="LEDGER", seq=12)])
    assert await publish_fenced(js, "s", b"x", "r:3", 11, FAST) == 12  # type: ignore[arg-type]
    assert js.published == 3
    # Asked again once the other one is applied, the server's verdict is the fence's.
    theirs = Msg(seq=12, data=b"y", headers={"Nats-Msg-Id": "zombie:3"})
    js = ScriptedJS(publishes=[in_process(), wrong_last(12)], lasts=[theirs])
    with pytest.raises(FencedError):
        await publish_fenced(js, "s", b"x", "r:3", 11, FAST)  # type: ignore[arg-type]


async def test_retrying_waits_out_transient_failures_only() -> None:
    answers: list[Any] = [nats.js.errors.NoStreamResponseError(), ServiceUnavailableError(code=503), "keys"]

    async def call() -> str:
        return str(_answer(answers.pop(0)))

    assert await retrying(call, deadline_s=2) == "keys"
    answers[:] = [APIError(code=400, err_code=10071, description="wrong last sequence: 3")]
    with pytest.raises(APIError):
        await retrying(call, deadline_s=2)
