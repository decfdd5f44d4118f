"""Output durability (``AgentSpec(durability="output")``) against a real nats-server: steps wait in
a bounded window and are acknowledged before anything leaves the process, a window is fenced
whole, and a SIGKILL at random moments loses at most the window, which resume runs again live
while every effect happens exactly once."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from nats.js.api import StreamConfig

from runledger import AgentSpec, Run, ScriptedModel
from runledger.errors import FencedError
from runledger.log.append import append_to_run
from runledger.log.client import LedgerClient, connect
from runledger.log.reader import read_raw
from runledger.log.subjects import LEDGER_STREAM, run_subject
from runledger.log.window import ATOMIC_MIN, Window, WindowedWriter
from runledger.ops.verify import verify_runs
from runledger.protect.loading import load_run
from runledger.record.events import BudgetGranted, ClockRead
from runledger.record.fold import fold
from runledger.sdk.lifecycle import open_run, resume_run, start_run
from runledger.sdk.run import RecordedRun
from tests.agents import WINDOW_EVENTS, calls
from tests.integration.processes import runledger, start_agent, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
ROUNDS_INPUT = '{"rounds": 4}'
LONG = 60_000.0  # a window that only a boundary or its size flushes


def spec_of(fn: Any, **window: Any) -> AgentSpec:
    return AgentSpec("outmode", fn, ScriptedModel([]), agent_version="v1", durability="output", **window)


async def stored_types(client: LedgerClient, run_id: str) -> list[str]:
    return [json.loads(r.data)["type"] for r in await read_raw(client, f"ledger.run.outmode.{run_id}.*")]


async def test_steps_wait_in_the_window_until_the_run_commits(client: LedgerClient) -> None:
    seen: dict[str, list[str]] = {}

    async def agent(run: Run) -> Any:
        for i in range(5):
            await run.tool("read", i, fn=lambda a: a)
        seen["before commit"] = await stored_types(client, run.run_id)
        await run.commit()
        seen["after commit"] = await stored_types(client, run.run_id)
        await run.now()

        async def charge(args: Any) -> Any:
            # The effect acts only once the log holds everything that led to it.
            seen["while acting"] = await stored_types(client, run.run_id)
            return {"ok": args}

        await run.effect("charge", 1, key="charge:out-1", fn=charge)
        await run.tool("read", 9, fn=lambda a: a)
        return "done"

    result = await start_run(client, spec_of(agent, window_events=64, window_ms=LONG), run_id="commit1")
    assert result.status == "completed"
    assert seen["before commit"] == ["run.started"]  # the start is committed: the run id is ours
    assert seen["after commit"] == ["run.started", *["tool.called"] * 5]
    # The claim carries the intent: the run holds every step before the effect, nothing of it yet.
    assert seen["while acting"][-1] == "clock.read", seen["while acting"]
    # The effect's record joins the window once its key holds the outcome: after the next step here.
    assert (await stored_types(client, "commit1"))[-4:] == [
        "tool.called",
        "effect.intended",
        "effect.committed",
        "run.completed",
    ]
    (verified,) = await verify_runs(client, "commit1")
    assert verified.ok, verified.problems


async def test_the_steps_before_an_effect_are_in_flight_with_its_claim_and_stored_before_it_acts(
    client: LedgerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim (which carries the intent) is the one write awaited before acting: the window of the
    steps before the effect is flushed in flight with it, not before it, and acknowledged before the
    effect acts (docs/wire.md, "The claim protocol for effects")."""
    import runledger.sdk.effects as effects

    writers: list[WindowedWriter] = []
    at_claim: list[tuple[int, int]] = []  # (events acknowledged, events not yet) when the claim is published
    real = effects.append_to_key

    async def watched(client_: LedgerClient, state: Any, body: Any, **kw: Any) -> Any:
        if body.TYPE == "effect.intended":  # the claim, about to be published (nothing awaited before)
            (writer,) = writers
            at_claim.append((writer.next_seq - writer.unacknowledged, writer.unacknowledged))
        return await real(client_, state, body, **kw)

    monkeypatch.setattr(effects, "append_to_key", watched)

    at_act: list[int] = []

    async def agent(run: Run) -> Any:
        assert isinstance(run, RecordedRun) and isinstance(run._writer, WindowedWriter)
        writers.append(run._writer)
        for i in range(3):
            await run.tool("read", i, fn=lambda a: a)

        def charge(a: Any) -> Any:
            at_act.append(run._writer.unacknowledged)  # type: ignore[attr-defined]
            return {"ok": a}

        await run.effect("charge", 1, key="charge:claim-1", fn=charge)
        return "done"

    result = await start_run(client, spec_of(agent, window_events=64, window_ms=LONG), run_id="claim1")
    assert result.status == "completed"
    # The claim is published while the tool steps are still on their way (not awaited before it: no
    # turn of the loop between the window's flush starting and the claim's publish waits for an ack)...
    ((acknowledged, unacknowledged),) = at_claim
    assert acknowledged + unacknowledged == 4 and unacknowledged >= 1, at_claim
    # ...and every one of them is acknowledged before the effect acts.
    assert at_act == [0]
    assert (await stored_types(client, "claim1"))[-3:] == ["effect.intended", "effect.committed", "run.completed"]


async def test_an_approval_request_and_a_child_run_are_committed_before_they_leave(client: LedgerClient) -> None:
    async def kid(run: Run) -> Any:
        await run.now()
        return "kid done"

    kid_spec = spec_of(kid, window_ms=LONG)
    kid_spec.name = "outkid"
    seen: dict[str, list[str]] = {}

    async def agent(run: Run) -> Any:
        await run.random()
        kid_spec.fn = _peeking(kid, client, run.run_id, seen)
        await run.child(kid_spec, 1)
        await run.random()
        return await run.approval("ship", {"n": 1})

    result = await start_run(client, spec_of(agent, window_ms=LONG), run_id="bound1")
    assert result.status == "suspended" and result.reason == "approval"
    assert seen["parent when the child starts"][-2:] == ["random.drawn", "child.started"]
    stored = await stored_types(client, "bound1")
    assert stored[-3:] == ["random.drawn", "approval.requested", "run.suspended"]


def _peeking(fn: Any, client: LedgerClient, parent: str, seen: dict[str, list[str]]) -> Any:
    async def peek(run: Run) -> Any:
        seen["parent when the child starts"] = await stored_types(client, parent)
        return await fn(run)

    return peek


async def test_the_window_bounds_what_is_unacknowledged(client: LedgerClient) -> None:
    most: list[int] = []

    async def agent(run: Run) -> Any:
        assert isinstance(run, RecordedRun)
        writer = run._writer
        assert isinstance(writer, WindowedWriter)
        for i in range(200):
            await run.tool("read", i, fn=lambda a: a)
            most.append(writer.unacknowledged)
        return writer.batches

    result = await start_run(client, spec_of(agent, window_events=20, window_ms=LONG), run_id="bounded")
    assert result.status == "completed"
    assert max(most) <= 20 and max(most) >= 10
    assert result.output > 0  # windows of 10 and more went as atomic batches
    log = await load_run(client, "bounded")
    assert [e.seq for e in log.events] == list(range(len(log.events))) and len(log.events) == 202


async def test_the_timer_flushes_a_window_nobody_commits(client: LedgerClient) -> None:
    from tests.conftest import eventually

    async def agent(run: Run) -> Any:
        await run.now()
        await eventually(lambda: _count_stored(client, run.run_id, 2), timeout=10)  # flushed by the 50 ms timer
        return "ok"

    assert (await start_run(client, spec_of(agent, window_ms=50.0), run_id="timer1")).status == "completed"


async def _count_stored(client: LedgerClient, run_id: str, n: int) -> bool:
    return len(await stored_types(client, run_id)) == n


async def test_a_window_from_a_stale_writer_is_refused_whole_and_the_writer_stops(client: LedgerClient) -> None:
    run = await open_run(client, spec_of(_never, window_events=64, window_ms=LONG), "zombie1")
    for _ in range(ATOMIC_MIN + 2):  # an atomic batch
        await run.random()
    # Meanwhile an operator appends to the run (its .o subject, under the same wildcard fence).
    await append_to_run(client, "zombie1", BudgetGranted(turns=1, by="op", reason="test"))
    with pytest.raises(FencedError):
        await run.commit()
    with pytest.raises(FencedError):
        await run.now()  # every later call raises the same error
    types = [json.loads(r.data)["type"] for r in await read_raw(client, "ledger.run.outmode.zombie1.*")]
    assert types == ["run.started", "budget.granted"]  # nothing of the stale window was stored


async def test_a_small_window_from_a_stale_writer_is_refused_too(client: LedgerClient) -> None:
    run = await open_run(client, spec_of(_never, window_events=64, window_ms=LONG), "zombie2")
    await run.random()  # one event: published as a single fenced message
    await append_to_run(client, "zombie2", BudgetGranted(turns=1, by="op", reason="test"))
    with pytest.raises(FencedError):
        await run.commit()
    assert await stored_types(client, "zombie2") == ["run.started", "budget.granted"]


async def _never(run: Run) -> Any:
    raise AssertionError("driven by the test, step by step")


async def test_a_retried_batch_whose_ack_was_lost_is_recognised_as_stored(
    client: LedgerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    subject = run_subject("outmode", "lostbatch")
    writer = WindowedWriter(
        client.nc, client.js, subject, run_id="lostbatch", agent="outmode", msg_id_prefix="lostbatch",
        window=Window(64, LONG),
    )  # fmt: skip
    real = WindowedWriter._send_batch
    sent: list[int] = []

    async def ack_lost_once(self: WindowedWriter, window: Any) -> int:
        seq = await real(self, window)  # stored...
        sent.append(seq)
        if len(sent) == 1:
            raise TimeoutError("ack lost")  # ...but the ack never arrived: the batch is sent again
        return seq

    monkeypatch.setattr(WindowedWriter, "_send_batch", ack_lost_once)
    for i in range(ATOMIC_MIN):
        await writer.append(ClockRead(step=i, value=f"t{i}"))
    await writer.commit()
    assert len(sent) == 1  # the second attempt was refused by the server (duplicate msg ids) and found stored
    raws = await read_raw(client, subject)
    assert len(raws) == ATOMIC_MIN and writer.last_stream_seq == raws[-1].stream_seq


async def test_a_stream_without_atomic_batches_gets_fenced_publishes(client: LedgerClient) -> None:
    info = await client.js.stream_info(LEDGER_STREAM)
    config: StreamConfig = info.config
    config.allow_atomic = False
    await client.js.update_stream(config)
    run = await open_run(client, spec_of(_never, window_events=64, window_ms=LONG), "noatomic")
    for _ in range(3 * ATOMIC_MIN):
        await run.random()
    await run.commit()
    writer = run._writer
    assert isinstance(writer, WindowedWriter) and not writer.atomic and writer.batches == 0
    assert len(await stored_types(client, "noatomic")) == 1 + 3 * ATOMIC_MIN
    (verified,) = await verify_runs(client, "noatomic")
    assert verified.ok


async def test_resume_runs_a_lost_window_again_live(client: LedgerClient) -> None:
    """A window never flushed (the process is gone) leaves the log shorter: resume replays what
    is stored and runs the rest live, and the chain has no gap."""
    made: list[int] = []

    def noted(a: int) -> int:
        made.append(a)
        return a

    async def agent(run: Run) -> Any:
        for i in range(6):
            await run.tool("read", i, fn=lambda a: noted(a))
        return "done"

    spec = spec_of(agent, window_ms=LONG)
    run = await open_run(client, spec, "lost1")
    for i in range(3):
        await run.tool("read", i, fn=lambda a: noted(a))
    await run.commit()
    for i in range(3, 5):
        await run.tool("read", i, fn=lambda a: noted(a))
    # The process dies here: its window (steps 3 and 4) was never flushed.
    result = await resume_run(client, spec, "lost1")
    assert result.status == "completed"
    assert made == [0, 1, 2, 3, 4, 3, 4, 5]  # the lost window ran again, live; nothing before it
    (verified,) = await verify_runs(client, "lost1")
    assert verified.ok, verified.problems


# -- SIGKILL at random moments --------------------------------------------------------------------------------

KILLS = int(os.environ.get("RUNLEDGER_TEST_KILLS", "20"))
AGENT = "tests.agents:windowed_spec"


def test_sigkill_at_random_moments_loses_at_most_the_window_and_repeats_no_effect(
    nats_url: str, tmp_path: Path
) -> None:
    service = tmp_path / "service.log"
    env = {"TEST_CALLS_LOG": str(service), "TEST_TOOL_DELAY": "0.01"}
    rng = random.Random(int(os.environ.get("RUNLEDGER_TEST_SEED", time.time_ns() % 10_000)))
    # The run's duration, measured: from its first step to its last (the agent touches two markers).
    marker = tmp_path / "started-probe"
    proc = start_agent(nats_url, AGENT, "probe", ROUNDS_INPUT, {**env, "TEST_STARTED_MARKER": str(marker)})
    wait_for(marker, timeout=60)
    began = time.monotonic()
    wait_for(Path(f"{marker}.end"), timeout=60)
    duration = time.monotonic() - began
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "completed" in out, out + err
    killed = 0
    for k in range(KILLS):
        run_id = f"kill{k}"
        marker = tmp_path / f"started-{k}"
        proc = start_agent(nats_url, AGENT, run_id, ROUNDS_INPUT, {**env, "TEST_STARTED_MARKER": str(marker)})
        wait_for(marker, timeout=60)
        time.sleep(rng.uniform(0, duration))
        proc.kill()
        out, err = proc.communicate(timeout=60)
        killed += proc.returncode == -9
        resumed = runledger(nats_url, "resume", run_id, "--agent", AGENT, env=env)
        assert resumed.returncode == 0 and "completed" in resumed.stdout, resumed.stdout + resumed.stderr
    assert killed >= KILLS // 2, f"only {killed} of {KILLS} runs were killed before they ended"
    entries = calls(service)
    for name in ["probe", *(f"kill{k}" for k in range(KILLS))]:
        charges = sorted(e["key"] for e in entries if e["call"] == "charge" and e["key"].startswith(f"charge:{name}:"))
        assert charges == [f"charge:{name}:{r}" for r in range(4)], (name, charges)  # every effect exactly once
    # The lost windows ran again: model calls made live beyond the recorded ones (re-spent tokens),
    # at most a window a kill.
    runs = [f"kill{k}" for k in range(KILLS)]
    checked = asyncio.run(_verified_turns(nats_url, runs))
    for run_id, (ok, problems, turns, status) in checked.items():
        assert ok, (run_id, problems)  # one chain, no gap, every hash linked
        assert status == "completed" and turns == 16, (run_id, status, turns)
    made = {r: len([e for e in entries if e["call"] == "model" and e["value"].startswith(f"{r}:")]) for r in runs}
    respent = {r: made[r] - checked[r][2] for r in runs}
    # A kill loses at most the window; +1: a model call made as the kill landed, before its event joined it.
    assert all(0 <= n <= WINDOW_EVENTS + 1 for n in respent.values()), respent
    print(f"{killed} of {KILLS} killed; steps re-run on resume (re-spent model calls) per run: {respent}")
    assert sum(respent.values()) > 0, f"no kill lost a window (the kills never landed between commits): {respent}"


def test_a_frozen_writer_that_wakes_after_a_resume_is_fenced_out_before_any_effect(
    nats_url: str, tmp_path: Path
) -> None:
    """SIGSTOP an output-durability run with steps in its window, resume it elsewhere, SIGCONT: the
    woken writer's window is refused (the run moved on), it stops with FencedError before it can
    claim or act, and the service saw each charge once."""
    service = tmp_path / "service.log"
    env = {"TEST_CALLS_LOG": str(service), "TEST_TOOL_DELAY": "0.01", "RUNLEDGER_EFFECT_LEASE_S": "0.5"}
    marker = tmp_path / "started"
    proc = start_agent(nats_url, AGENT, "frozen", ROUNDS_INPUT, {**env, "TEST_STARTED_MARKER": str(marker)})
    wait_for(marker, timeout=60)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        resumed = runledger(nats_url, "resume", "frozen", "--agent", AGENT, env=env)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    assert resumed.returncode == 0 and "completed" in resumed.stdout, resumed.stdout + resumed.stderr
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 4 and "another writer owns" in err, out + err
    charges = sorted(e["key"] for e in calls(service) if e["call"] == "charge")
    assert charges == [f"charge:frozen:{r}" for r in range(4)]
    ((ok, problems, turns, status),) = asyncio.run(_verified_turns(nats_url, ["frozen"])).values()
    assert ok and status == "completed" and turns == 16, (problems, status, turns)


async def _verified_turns(url: str, runs: list[str]) -> dict[str, tuple[bool, list[str], int, str]]:
    """Per run: verify's verdict and problems, the model calls recorded, the status."""
    out = {}
    async with await connect(url) as client:
        for run_id in runs:
            (verified,) = await verify_runs(client, run_id)
            cp = fold((await load_run(client, run_id, open_content=False)).records)
            out[run_id] = (verified.ok, verified.problems, int(cp.spent["turns"]), cp.status)
    return out


async def test_an_abandoned_batch_stores_nothing_and_holds_no_msg_id(client: LedgerClient) -> None:
    """A writer killed in the middle of a batch (no commit sent): nothing of it is stored, and its
    msg ids are free, so the resumed run's own events with those ids are stored, not deduplicated."""
    subject = run_subject("outmode", "abandoned")
    for i in range(1, 4):
        headers = {"Nats-Batch-Id": "b-abandoned", "Nats-Batch-Sequence": str(i), "Nats-Msg-Id": f"abandoned:{i - 1}"}
        await client.nc.publish(subject, b"lost", headers=headers)
    await client.nc.flush()
    writer = WindowedWriter(
        client.nc, client.js, subject, run_id="abandoned", agent="outmode", msg_id_prefix="abandoned",
        window=Window(64, LONG),
    )  # fmt: skip
    for i in range(ATOMIC_MIN):
        await writer.append(ClockRead(step=i, value=f"t{i}"))
    await writer.commit()
    raws = await read_raw(client, subject)
    assert [json.loads(r.data)["payload"]["value"] for r in raws] == [f"t{i}" for i in range(ATOMIC_MIN)]
