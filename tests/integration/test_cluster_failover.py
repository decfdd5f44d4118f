"""A 3-node JetStream cluster on loopback losing its stream leader, then another node, under load.

20 agents record runs concurrently (model calls, read tools and a non-idempotent refund
every tenth step) while the test SIGKILLs the LEDGER stream's leader, brings it back, then
SIGKILLs the new leader and brings that back too. What docs/scale.md ("Failover, measured")
claims, asserted here:

- leader loss: no run failed (no PublishError reached an agent: the SDK's retries outlast the
  election, so no run had to be resumed), and acknowledgements resumed within the SDK's retry
  deadline;
- quorum loss (two of three nodes SIGKILLed together, with every agent parked between steps
  so that nothing was in flight): 0 steps acknowledged without a quorum; every run stopped
  with PublishError at its last acknowledged step; every run resumed when the nodes returned;
- both: every step the SDK acknowledged to an agent is in the log exactly once (counted per
  step number over the raw events), every run's hash chain verifies, and every refund reached
  the payments service exactly once (its own log counts).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runledger import AgentSpec, ModelResponse, Run, ScriptedModel
from runledger.errors import FencedError, PublishError
from runledger.examples.refund_agent.agent import refund
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import LedgerClient, connect
from runledger.log.cluster import ClusterState, LocalCluster
from runledger.log.publish import RetryPolicy
from runledger.ops.verify import verify_runs
from runledger.protect.loading import load_run
from runledger.record.ids import new_id
from runledger.sdk.lifecycle import RunResult, resume_run, start_run
from tests.conftest import cluster_client, eventually, stream_leader

pytestmark = pytest.mark.integration

AGENTS = 20
MIN_STEPS = 30
THINK_S = 0.05
STEP_TYPES = {"model.called", "tool.called", "effect.intended", "effect.committed", "effect.failed"}


class Load:
    """What the agents share with the test: acknowledged steps, when to stop, when to resume,
    where they stand (parked between steps, stopped by PublishError) and how often each resumed."""

    def __init__(self) -> None:
        self.acked: set[tuple[str, int]] = set()
        self.stop = asyncio.Event()
        self.quorum = asyncio.Event()  # set while a majority of nodes is up
        self.quorum.set()
        self.gate = asyncio.Event()  # cleared: agents park before their next step
        self.gate.set()
        self.parked: set[str] = set()
        # run id -> the last step acknowledged to it when it caught PublishError
        self.stopped: dict[str, int | None] = {}
        self.resumes: Counter[str] = Counter()

    def last_acked(self, run_id: str) -> int | None:
        return max((s for r, s in self.acked if r == run_id), default=None)


LOAD = Load()


async def busy(run: Run) -> dict[str, Any]:
    """Steps until told to stop (at least MIN_STEPS); a refund every tenth step."""
    history: list[dict[str, Any]] = [{"role": "system", "content": run.prompt}]
    i = 0
    while i < MIN_STEPS or not LOAD.stop.is_set():
        if not LOAD.gate.is_set():  # between two steps: nothing of this run is in flight
            LOAD.parked.add(run.run_id)
            await LOAD.gate.wait()
            LOAD.parked.discard(run.run_id)
        if i % 10 == 9:
            await run.tool("refund", {"order": f"{run.input['name']}-{i}", "amount": 1.0})
        elif i % 2 == 0:
            history.append({"role": "user", "content": f"step {i} " + "x" * 500})
            await run.model(history[-3:])
        else:
            await run.tool("lookup", {"i": i}, fn=lambda a: {"i": a["i"], "rows": "r" * 200})
        # The step returned: its event was acknowledged by a quorum of the cluster.
        LOAD.acked.add((run.run_id, run.checkpoint.last_step))
        i += 1
        await asyncio.sleep(THINK_S)
    return {"steps": i}


def busy_spec() -> AgentSpec:
    reply = ModelResponse(content="next", input_tokens=200, output_tokens=5)
    return AgentSpec(
        "busy", busy, ScriptedModel(lambda m: reply, name="fixed"), tools=[refund], prompt="be busy", agent_version="v1"
    )


@pytest.fixture
def payments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PaymentsService]:
    service = PaymentsService(tmp_path / "payments.log").start()
    monkeypatch.setenv("REFUND_PAYMENTS_URL", service.url)
    try:
        yield service
    finally:
        service.stop()


async def agent(url: str, spec: AgentSpec, name: str, policy: RetryPolicy = RetryPolicy()) -> tuple[RunResult, bool]:
    """One agent process: start a run; if the cluster stays unreachable past the SDK's bound
    (PublishError: a clean failure, nothing unacknowledged was taken for done), resume it once
    a majority of nodes is back. Returns the outcome and whether the run had to be resumed."""
    client = await connect(url)
    run_id = new_id()
    try:
        try:
            return await start_run(client, spec, {"name": name}, run_id=run_id, policy=policy), False
        except PublishError:
            LOAD.stopped[run_id] = LOAD.last_acked(run_id)  # the run stops at its last acknowledged step
        await LOAD.quorum.wait()
        for _ in range(3):
            LOAD.resumes[run_id] += 1
            try:
                return await resume_run(client, spec, run_id, policy=policy), True
            except (PublishError, FencedError):
                # A publish that timed out without quorum may still commit when the nodes return;
                # the fence then stops this resume (it read the log before): read it again.
                await asyncio.sleep(1)
        LOAD.resumes[run_id] += 1
        return await resume_run(client, spec, run_id, policy=policy), True
    finally:
        await client.close()


async def wait_progress(steps: int, timeout: float = 60) -> None:
    target = len(LOAD.acked) + steps
    await eventually(lambda: len(LOAD.acked) >= target, timeout=timeout, interval=0.1)


@pytest.mark.timeout(900)  # its own waits: up to 60 + 60 + 60 + 60 + 60 + 60 + 60 + 300 s
async def test_runs_survive_losing_the_leader_then_another_node(
    cluster: tuple[LocalCluster, ClusterState], payments: PaymentsService
) -> None:
    local, state = cluster
    global LOAD
    LOAD = Load()
    admin = await cluster_client(state.url)
    spec = busy_spec()
    agents = [asyncio.create_task(agent(state.url, spec, f"a{i}")) for i in range(AGENTS)]

    await wait_progress(AGENTS * 3)
    pauses: list[float] = []
    killed: list[str] = []
    for _ in range(2):  # the stream leader, then the new leader once the first node is back
        leader = await stream_leader(admin)
        local.kill(leader)  # SIGKILL the stream leader mid-run
        killed.append(leader)
        killed_at = time.monotonic()
        await wait_progress(AGENTS * 2)  # a new leader took over and acks resumed
        pauses.append(time.monotonic() - killed_at)
        local.restart(leader)
        await asyncio.to_thread(local.wait_healthy, 60)
    await wait_progress(AGENTS)
    LOAD.stop.set()

    outcomes = await asyncio.wait_for(asyncio.gather(*agents), timeout=300)
    print(f"SIGKILL of the leaders {killed}: acks resumed after {', '.join(f'{p:.1f}s' for p in pauses)}")
    # docs/scale.md: "no run failed" -- not one PublishError reached an agent, none was resumed.
    assert not LOAD.stopped, f"runs stopped by PublishError during a leader election: {sorted(LOAD.stopped)}"
    assert [r.status for r, _ in outcomes] == ["completed"] * AGENTS, [(r.status, r.error) for r, _ in outcomes]
    assert not any(resumed for _, resumed in outcomes)
    # An election fits inside the SDK's retry deadline (that is why no run failed).
    assert max(pauses) < RetryPolicy().deadline_s, pauses

    await check_exactly_once(admin, outcomes, payments)
    await admin.close()


async def check_exactly_once(
    admin: LedgerClient, outcomes: list[tuple[RunResult, bool]], payments: PaymentsService
) -> None:
    # Every acknowledged step is in the log exactly once; every chain verifies.
    results = await verify_runs(admin)
    assert len(results) == AGENTS and all(r.ok for r in results), [r.reason for r in results if not r.ok]
    by_run: dict[str, Counter[tuple[int, str]]] = {}
    for result, _ in outcomes:
        log = await load_run(admin, result.run_id, agent="busy", open_content=False)
        by_run[result.run_id] = Counter(
            (int(r.event.payload["step"]), r.event.type) for r in log.records if r.event.type in STEP_TYPES
        )
        dupes = [k for k, n in by_run[result.run_id].items() if n > 1]
        assert not dupes, f"run {result.run_id}: events stored twice: {dupes}"
        steps = sorted({s for s, _ in by_run[result.run_id]})
        assert steps == list(range(steps[0], steps[0] + len(steps))), f"run {result.run_id}: steps not contiguous"
    assert LOAD.acked, "no step was acknowledged"
    missing = [(rid, s) for rid, s in LOAD.acked if not any(step == s for step, _ in by_run[rid])]
    assert not missing, f"acknowledged steps missing from the log: {missing[:5]}"

    # Effects exactly once: every refund the runs committed hit the payments service once.
    calls = Counter(c["order"] for c in payments.calls())
    assert calls and max(calls.values()) == 1, [o for o, n in calls.items() if n > 1]
    committed = sum(1 for counts in by_run.values() for (_, t) in counts if t == "effect.committed")
    assert committed == len(calls), f"{committed} refunds committed in the log, {len(calls)} made"


@pytest.mark.timeout(900)  # its own waits: up to 60 + 60 + 60 + 30 + 60 + 60 + 300 s
async def test_runs_stop_cleanly_without_a_quorum_and_resume_exactly_once(
    cluster: tuple[LocalCluster, ClusterState], payments: PaymentsService
) -> None:
    """Two of three nodes die together: nothing can be acknowledged, so every run stops with
    PublishError at its last acknowledged step; when the nodes return, each is resumed.

    The agents are parked between steps when the nodes die, so no publish is in flight: an ack
    the leader sent before the kill cannot be counted as one made without a quorum, and any
    step acknowledged from then until the nodes return would be exactly that."""
    local, state = cluster
    global LOAD
    LOAD = Load()
    admin = await cluster_client(state.url)
    spec = busy_spec()
    short = RetryPolicy(deadline_s=3.0)
    agents = [asyncio.create_task(agent(state.url, spec, f"q{i}", short)) for i in range(AGENTS)]

    await wait_progress(AGENTS * 3)
    LOAD.gate.clear()
    await eventually(lambda: len(LOAD.parked) == AGENTS, timeout=60, interval=0.05)
    LOAD.quorum.clear()
    local.kill("n1")
    local.kill("n2")
    acked_at_loss = set(LOAD.acked)
    last_at_loss = {run_id: LOAD.last_acked(run_id) for run_id in LOAD.parked}
    LOAD.gate.set()  # every agent now tries its next step without a quorum
    # Until every agent's publish has outlived its deadline and the run stopped.
    await eventually(lambda: len(LOAD.stopped) == AGENTS, timeout=short.deadline_s + 27, interval=0.1)
    stalled = LOAD.acked - acked_at_loss
    local.restart("n1")
    local.restart("n2")
    await asyncio.to_thread(local.wait_healthy, 60)
    LOAD.quorum.set()
    await wait_progress(AGENTS * 2)
    LOAD.stop.set()

    outcomes = await asyncio.wait_for(asyncio.gather(*agents), timeout=300)
    print(f"steps acknowledged without a quorum: {len(stalled)}; resumes per run: {sorted(LOAD.resumes.values())}")
    # docs/scale.md: "0 steps acknowledged without a quorum".
    assert not stalled, f"steps acknowledged while two of three nodes were dead: {sorted(stalled)[:5]}"
    # "every run stopped with PublishError at its last acknowledged step".
    assert LOAD.stopped == last_at_loss, {r: (s, last_at_loss.get(r)) for r, s in LOAD.stopped.items()}
    # "all 20 resumed ... when the nodes returned", and then completed.
    assert [r.status for r, _ in outcomes] == ["completed"] * AGENTS, [(r.status, r.error) for r, _ in outcomes]
    assert all(resumed for _, resumed in outcomes) and set(LOAD.resumes) == set(LOAD.stopped)
    assert set(LOAD.resumes.values()) == {1}, LOAD.resumes  # "resumed exactly once"
    await check_exactly_once(admin, outcomes, payments)
    await admin.close()
