"""An OpenAI Agents SDK agent killed at random moments resumes without repeating a recorded call.

The agent of tests/openai_agents_shop.py (two function tools, ``refund`` an effect, and a handoff) runs
with ``runledger run`` in a process of its own against a real nats-server and a fake of the Responses
API on loopback (in this process: the SDK's own ``OpenAIResponsesModel`` and ``AsyncOpenAI`` client
speak HTTP to it), is SIGKILLed at a random moment of its run (drawn from a measured run's duration),
and is resumed with ``runledger resume``. Every trial completes; the fake never answered a request
whose model step was recorded before the kill twice (it counts requests by content: at most the one
in flight, answered but not recorded, is asked again); the refund acted once (its witness line) and
its key is committed once.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from runledger import LedgerClient, load_run
from runledger.record.fold import fold
from tests.conftest import eventually
from tests.integration.processes import runledger, start_agent
from tests.openai_agents_shop import FakeResponses

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

AGENT = "tests.openai_agents_shop:spec"
DELAY_S = 0.3  # each answer of the fake, and the refund after it acted, take this long
STEPS = ["model", "tool", "model", "effect", "model", "tool", "model"]


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def recorded_requests(records: list[Any]) -> set[str]:
    """The content digests of the requests whose answers the run recorded (the fake's response ids)."""
    ids = [r.event.payload.get("response", {}).get("response_id") for r in records if r.event.type == "model.called"]
    return {i.removeprefix("resp_") for i in ids if isinstance(i, str)}


_SPAN: list[float] = []  # measured once, by the first test


@pytest.fixture
def span_s(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> float:
    """A whole run, measured from its first request to its end (once): each request once, the refund once."""
    if not _SPAN:
        _SPAN.append(_measured(nats_url, tmp_path_factory.mktemp("oa-reference")))
    return _SPAN[0]


def _measured(nats_url: str, log: Path) -> float:
    fake = FakeResponses(delay_s=DELAY_S)
    with fake.serving() as url:
        env = {"OA_SHOP_URL": url, "OA_SHOP_LOG": str(log), "OA_SHOP_DELAY_S": str(DELAY_S)}
        agent = start_agent(nats_url, AGENT, "oa-reference", json.dumps("My order o-ref arrived broken."), env)
        deadline = time.monotonic() + 60
        while not fake.requests and agent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        began = time.monotonic()
        out, err = agent.communicate(timeout=60)
        span = time.monotonic() - began
    assert agent.returncode == 0, out + err
    assert len(fake.requests) == len(set(fake.requests)) == 4, fake.requests
    assert [line.split(" ")[0] for line in lines(log / "tools.log")] == ["lookup", "refund"]
    return span


@pytest.mark.parametrize("seed", range(10))
async def test_a_run_killed_at_a_random_moment_resumes_without_repeating_a_recorded_call(
    nats_url: str, client: LedgerClient, tmp_path: Path, span_s: float, seed: int
) -> None:
    run_id = f"oa-kill-{seed}"
    fake = FakeResponses(delay_s=DELAY_S)
    moment = random.Random(seed).uniform(0.0, span_s * 0.9)
    with fake.serving() as url:
        env = {"OA_SHOP_URL": url, "OA_SHOP_LOG": str(tmp_path), "OA_SHOP_DELAY_S": str(DELAY_S)}
        agent = start_agent(nats_url, AGENT, run_id, json.dumps(f"My order o-{seed} arrived broken."), env)
        try:
            await eventually(lambda: fake.requests or agent.poll() is not None, timeout=60)
            await asyncio.sleep(moment)
            agent.send_signal(signal.SIGKILL)
        finally:
            agent.wait(timeout=30)
        assert agent.returncode == -9, f"the agent ended before the kill: {agent.stderr.read() if agent.stderr else ''}"
        before = recorded_requests((await load_run(client, run_id)).records)

        resumed = await asyncio.to_thread(runledger, nats_url, "resume", run_id, "--agent", AGENT, env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    log = await load_run(client, run_id)
    cp = fold(log.records)
    assert cp.status == "completed", resumed.stdout + resumed.stderr
    assert [cp.steps[s].kind for s in sorted(cp.steps)] == STEPS
    asked = Counter(fake.requests)
    assert all(asked[d] == 1 for d in before), f"a recorded call was requested again: {asked}, recorded {before}"
    assert len(asked) == 4 and max(asked.values()) <= 2, asked
    assert sum(asked.values()) - len(asked) <= 1, f"more than the call in flight was repeated: {asked}"
    tools = lines(tmp_path / "tools.log")
    assert len(tools) - len(set(tools)) <= 1, f"more than the tool call in flight was repeated: {tools}"
    refunds = [t for t in tools if t.startswith("refund ")]
    assert refunds == [f"refund o-{seed} 30.0 refund:o-{seed}"], refunds
    assert cp.committed_keys == [f"refund:o-{seed}"]
    assert cp.output == "Closed: " + json.dumps({"assistant": "closer"}), cp.output
