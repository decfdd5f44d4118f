"""The broker's budgets of host CPU (runledger.sandbox.broker): a guest whose requests cost the host more
CPU than the policy allows, one request or all of them, fails its branch with the reason, between steps.

The broker answers a guest over a real socket pair; the branch's run is a stand-in whose tool burns host
CPU by CPU time (in a worker thread, as a sync tool runs), so the figures compare CPU with CPU.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from runledger.cpu import in_thread
from runledger.sandbox.broker import Broker
from runledger.sandbox.channel import encode, read_message
from runledger.sandbox.containers import SandboxPolicy
from runledger.sandbox.errors import SandboxViolationError

START = {"agent": "m:spec", "run_id": "br-1"}


def burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class BurningRun:
    """A branch's run whose tool costs the host ``args["cpu_s"]`` seconds of CPU, and records each step
    it finished (a step the budget cut short would be missing)."""

    def __init__(self) -> None:
        self.finished: list[int] = []

    async def tool(self, name: str, args: Any, tool_call_id: str | None = None) -> Any:
        await in_thread(burn, args["cpu_s"])
        self.finished.append(args["n"])
        return {"n": args["n"]}


@pytest.fixture
async def channel() -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter, Any, Any]]:
    host_sock, guest_sock = socket.socketpair()
    host = await asyncio.open_unix_connection(sock=host_sock)
    guest = await asyncio.open_unix_connection(sock=guest_sock)
    try:
        yield (*host, *guest)
    finally:
        for writer in (host[1], guest[1]):
            writer.close()


async def _guest(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cpu_s: float, n: int) -> list[Any]:
    """Say hello, then ask for ``n`` tool calls of ``cpu_s`` each, one after the other; the replies."""
    writer.write(encode({"id": 0, "op": "hello"}))
    await writer.drain()
    await read_message(reader)
    replies = []
    for i in range(n):
        writer.write(encode({"id": i + 1, "op": "tool", "name": "burn", "args": {"cpu_s": cpu_s, "n": i}}))
        await writer.drain()
        reply = await read_message(reader)
        if reply is None:
            break
        replies.append(reply)
    else:
        writer.write(encode({"id": n + 1, "op": "done", "output": "done"}))
        await writer.drain()
    return replies


async def _serve(channel: Any, policy: SandboxPolicy, cpu_s: float, n: int) -> tuple[Broker, BurningRun, Any, Any]:
    host_reader, host_writer, guest_reader, guest_writer = channel
    broker = Broker(host_reader, host_writer, START, deadline=time.monotonic() + 120, policy=policy)
    run = BurningRun()
    guest = asyncio.create_task(_guest(guest_reader, guest_writer, cpu_s, n))
    hello = await read_message(host_reader)
    try:
        outcome: Any = await broker.serve(run, hello)
    except SandboxViolationError as exc:
        outcome = exc
    host_writer.close()
    return broker, run, outcome, await guest


async def test_a_request_over_the_per_request_budget_fails_the_branch_after_its_step(channel: Any) -> None:
    policy = SandboxPolicy(max_request_cpu_s=0.05, max_host_cpu_s=60.0)
    broker, run, outcome, replies = await _serve(channel, policy, cpu_s=0.1, n=5)
    assert isinstance(outcome, SandboxViolationError), outcome
    assert "request 1 (tool) cost the host" in str(outcome) and "SandboxPolicy.max_request_cpu_s" in str(outcome)
    assert run.finished == [0]  # the step that overran finished (never cut between claim and act)
    assert replies == [] and broker.requests == 1  # its reply was not sent; nothing more was served
    assert broker.meter.used >= 0.1


async def test_requests_over_the_reruns_budget_fail_the_branch_with_the_reason(channel: Any) -> None:
    policy = SandboxPolicy(max_request_cpu_s=1.0, max_host_cpu_s=0.27)
    broker, run, outcome, replies = await _serve(channel, policy, cpu_s=0.06, n=50)
    assert isinstance(outcome, SandboxViolationError), outcome
    assert "over its budget of 0.27s (SandboxPolicy.max_host_cpu_s)" in str(outcome), outcome
    # Stopped at the first request past the budget: 4 x 0.06 = 0.24 is under 0.27, the 5th goes over.
    assert broker.requests == len(run.finished) == 5, (broker.requests, run.finished)
    assert len(replies) == 4
    assert 0.27 < broker.meter.used < 0.27 + 0.06 + 0.05, broker.meter.used


async def test_a_rerun_within_its_budgets_is_served_to_its_end(channel: Any) -> None:
    broker, run, outcome, replies = await _serve(channel, SandboxPolicy(), cpu_s=0.01, n=5)
    assert outcome == "done" and len(replies) == 5 and run.finished == [0, 1, 2, 3, 4]
    assert 0.05 <= broker.meter.used < SandboxPolicy().max_host_cpu_s
