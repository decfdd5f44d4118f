"""Journal snapshots of output-durability runs against a real nats-server: a snapshot taken while
steps wait in the window records the head the server stored, a resume after a SIGKILL at a random
moment uses the last snapshot that was stored (the same checkpoint as a full read, fenced, the
chain verified), and a snapshot lost with its window is never believed."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest
from nats.js.errors import NotFoundError

from runledger import AgentSpec, Run, ScriptedModel
from runledger.errors import FencedError
from runledger.log.client import LedgerClient, connect
from runledger.log.reader import read_run
from runledger.log.subjects import LEDGER_STREAM, run_subject
from runledger.ops.decisions import approve
from runledger.ops.verify import verify_runs
from runledger.protect.capture import client_opener
from runledger.protect.loading import load_run
from runledger.record.events import JournalSnapshotted, decode_fast
from runledger.record.fold import fold
from runledger.sdk.lifecycle import resume_run, start_run
from runledger.sdk.models import ModelResponse
from runledger.sdk.snapshot import SNAPSHOT, SNAPSHOT_EVERY, load_journal, opened_journal
from tests.integration.processes import start_agent, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[2]
AGENT = "snapout"
ROUNDS = 600  # a model call and a tool a round: 1,200 steps, interval snapshots at seq 512 and 1,024
WINDOW = 200  # events; a flush starts at half of it, so a snapshot waits in the window behind ~100 steps
LONG_MS = 60_000.0  # only the window's size or a boundary flushes it


async def long_agent(run: Run) -> dict[str, Any]:
    """ROUNDS rounds of a model call and a read tool with keyword-ish dict args, then an approval
    when the input asks for one. Returns a digest of every reply it saw (live or replayed)."""
    marker = os.environ.get("TEST_STARTED_MARKER")
    if marker:
        Path(marker).touch()
    kill_at = int(os.environ.get("TEST_KILL_AT_ROUND", "-1"))
    digest = hashlib.sha256()
    for r in range(ROUNDS):
        if r == kill_at:
            os.kill(os.getpid(), 9)  # the process dies here, its window with it
        reply = await run.model([{"role": "user", "content": f"round {r}"}], temperature=0)
        got = await run.tool("lookup", {"z": r, "a": [r, "x"]}, fn=lambda a: {"v": a["z"] * 3, "k": a["a"]})
        digest.update(json.dumps([reply.content, got], sort_keys=True).encode())
    if marker:
        Path(marker + ".end").touch()
    if run.input and run.input.get("approval"):
        decision = await run.approval("ship", {"rounds": ROUNDS})
        digest.update(decision["by"].encode())
    return {"digest": digest.hexdigest()}


def long_spec() -> AgentSpec:
    model = ScriptedModel(lambda messages: ModelResponse(content=f"answer to {messages[-1]['content']}"))
    return AgentSpec(
        AGENT, long_agent, model, agent_version="v1", durability="output", window_events=WINDOW, window_ms=LONG_MS
    )


def expected_digest(approved_by: str | None = None) -> str:
    digest = hashlib.sha256()
    for r in range(ROUNDS):
        reply = f"answer to round {r}"
        digest.update(json.dumps([reply, {"v": r * 3, "k": [r, "x"]}], sort_keys=True).encode())
    if approved_by:
        digest.update(approved_by.encode())
    return digest.hexdigest()


async def snapshots_stored(client: LedgerClient, run_id: str) -> list[JournalSnapshotted]:
    log = await read_run(client, run_id, agent=AGENT)
    return [r.event.body_as(JournalSnapshotted) for r in log.records if r.event.type == SNAPSHOT]


async def same_as_full_read(client: LedgerClient, run_id: str) -> int | None:
    """Assert that the snapshot read gives the checkpoint and fence of a full read; the seq of
    the snapshot used (None when the run has none that verifies)."""
    opener = client_opener(client)
    whole = await read_run(client, run_id, agent=AGENT)
    journal = await load_journal(client, run_id, AGENT, opener)
    if journal is None:
        return None
    assert await opened_journal(journal.checkpoint, opener) == await opened_journal(fold(whole.records), opener)
    assert journal.log.last_stream_seq == whole.last_stream_seq
    return journal.snapshot_seq


async def verified(client: LedgerClient, run_id: str) -> None:
    (result,) = await verify_runs(client, run_id)
    assert result.ok, result.problems


async def test_a_suspended_output_run_resumes_from_its_snapshots_as_from_every_event(client: LedgerClient) -> None:
    outcomes = []
    for run_id, from_snapshot in (("so-snap", True), ("so-whole", False)):
        first = await start_run(client, long_spec(), {"approval": True}, run_id=run_id)
        assert first.status == "suspended", first
        snaps = await snapshots_stored(client, run_id)
        # Two interval snapshots taken mid-window, and one at suspension, each heading the event it follows.
        assert [s.head_seq for s in snaps[:2]] == [SNAPSHOT_EVERY - 1, 2 * SNAPSHOT_EVERY], snaps
        log = await read_run(client, run_id, agent=AGENT)
        stream_seq_of = {r.event.seq: r.stream_seq for r in log.records}
        for snap in snaps:  # the head the server stored, not the window's lagging one
            assert snap.head_stream_seq == stream_seq_of[snap.head_seq], (snap, stream_seq_of[snap.head_seq])
        last = await client.js.get_last_msg(LEDGER_STREAM, run_subject(AGENT, run_id), direct=True)
        assert decode_fast(last.data or b"").type == SNAPSHOT
        assert await same_as_full_read(client, run_id) == log.records[-1].event.seq
        await approve(client, run_id, first.pending[0], by="alice")
        result = await resume_run(client, long_spec(), run_id, from_snapshot=from_snapshot)
        assert result.status == "completed" and result.output == {"digest": expected_digest("alice")}
        await verified(client, run_id)
        types = [r.event.type for r in (await load_run(client, run_id)).records]
        outcomes.append((result.status, result.output, types))
    assert outcomes[0] == outcomes[1]


async def test_two_resumes_of_an_output_run_from_its_snapshot_only_one_writes(client: LedgerClient) -> None:
    first = await start_run(client, long_spec(), {"approval": True}, run_id="so-race")
    await approve(client, "so-race", first.pending[0], by="bob")
    results = await asyncio.gather(
        *(resume_run(client, long_spec(), "so-race") for _ in range(2)), return_exceptions=True
    )
    assert sorted(type(r).__name__ for r in results) == ["FencedError", "RunResult"], results
    await verified(client, "so-race")
    assert fold((await load_run(client, "so-race")).records).status == "completed"


# -- SIGKILL ----------------------------------------------------------------------------------------------------

KILLS = int(os.environ.get("RUNLEDGER_TEST_KILLS", "8"))
SPEC = "tests.integration.test_snapshot_output:long_spec"


async def resume_crashed(url: str, run_id: str) -> tuple[int | None, bool]:
    """Check the snapshot read against a full read, resume twice at once (one is fenced out),
    verify; the seq of the snapshot the resume used, and whether the run had ended before the kill."""
    async with await connect(url) as client:
        used = await same_as_full_read(client, run_id)
        stored = await snapshots_stored(client, run_id)
        if stored:  # the resume uses the last snapshot stored: every stored one verifies
            assert used == max(s.head_seq for s in stored) + 1, (used, stored)
        done = fold((await read_run(client, run_id, agent=AGENT)).records).status == "completed"
        results = await asyncio.gather(
            *(resume_run(client, long_spec(), run_id) for _ in range(2)), return_exceptions=True
        )
        if done:  # the kill landed after the run ended: nothing to resume, nobody is fenced
            assert all(not isinstance(r, BaseException) and r.nothing_to_do for r in results), results
        else:
            assert sorted(type(r).__name__ for r in results) == ["FencedError", "RunResult"], results
        result = next(r for r in results if not isinstance(r, BaseException))
        assert result.status == "completed" and result.output == {"digest": expected_digest()}, result
        assert [isinstance(r, FencedError) for r in results].count(True) == (0 if done else 1)
        await verified(client, run_id)
        return used, done


async def stored_past(url: str, run_id: str, seq: int, timeout: float = 60.0) -> None:
    """Return once the run's writer subject holds an event past ``seq``."""
    deadline = time.monotonic() + timeout
    async with await connect(url) as client:
        while time.monotonic() < deadline:
            try:
                msg = await client.js.get_last_msg(LEDGER_STREAM, run_subject(AGENT, run_id), direct=True)
                if decode_fast(msg.data or b"").seq > seq:
                    return
            except NotFoundError:
                pass  # the run has not stored its first window yet
            await asyncio.sleep(0.005)
    raise AssertionError(f"run {run_id} stored nothing past seq {seq} within {timeout}s")


def test_sigkill_at_random_moments_then_resume_from_the_last_stored_snapshot(nats_url: str, tmp_path: Path) -> None:
    seed = int(os.environ.get("RUNLEDGER_TEST_SEED", time.time_ns() % 10_000))
    rng = random.Random(seed)
    marker = tmp_path / "started-probe"
    proc = start_agent(nats_url, SPEC, "sk-probe", "{}", {"TEST_STARTED_MARKER": str(marker)})
    wait_for(marker, timeout=120)
    began = time.monotonic()
    wait_for(Path(f"{marker}.end"), timeout=120)
    duration = time.monotonic() - began
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "completed" in out, out + err
    used: list[int | None] = []
    killed = 0
    for k in range(KILLS):
        run_id = f"sk{k}"
        marker = tmp_path / f"started-{k}"
        proc = start_agent(nats_url, SPEC, run_id, "{}", {"TEST_STARTED_MARKER": str(marker)})
        wait_for(marker, timeout=120)
        if k % 2:  # a moment after the first interval snapshot is stored (the chain's seq 512)
            asyncio.run(stored_past(nats_url, run_id, SNAPSHOT_EVERY))
            time.sleep(rng.uniform(0, 0.4) * duration)
        else:  # any moment of the run
            time.sleep(rng.uniform(0, 1) * duration)
        proc.kill()
        proc.communicate(timeout=60)
        snapshot_seq, ended = asyncio.run(resume_crashed(nats_url, run_id))
        killed += proc.returncode == -9 and not ended
        used.append(snapshot_seq)
    print(f"seed {seed}: {killed} of {len(used)} killed, run {duration:.2f}s; snapshot seq each resume used: {used}")
    assert killed >= len(used) // 2, f"only {killed} of {len(used)} runs were killed before they ended"
    assert any(u is not None for u in used), f"no resume used a snapshot (seed {seed}): {used}"


@pytest.mark.parametrize("kill_round", [262, 280, 300])
def test_a_snapshot_lost_with_its_window_is_not_used(nats_url: str, kill_round: int) -> None:
    """The process dies while the interval snapshot at seq 512 (after round 255's model call) waits in the window
    with the steps after it: neither is stored, the resume reads the whole run, runs the lost steps
    again and snapshots again, and a later read uses the new snapshot."""
    run_id = f"lost-snap-{kill_round}"
    proc = start_agent(nats_url, SPEC, run_id, "{}", {"TEST_KILL_AT_ROUND": str(kill_round)})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -9, out + err

    async def check() -> None:
        async with await connect(nats_url) as client:
            log = await read_run(client, run_id, agent=AGENT)
            last = log.records[-1].event.seq
            assert last == SNAPSHOT_EVERY - 1, last  # the head is stored, the window is not
            assert not await snapshots_stored(client, run_id)
            assert await same_as_full_read(client, run_id) is None
        used, ended = await resume_crashed(nats_url, run_id)
        assert used is None and not ended
        async with await connect(nats_url) as client:
            snaps = await snapshots_stored(client, run_id)
            assert snaps, "the resumed run wrote no snapshot"
            # A later reader uses the resumed run's own last snapshot: the same checkpoint as a full read.
            assert await same_as_full_read(client, run_id) == snaps[-1].head_seq + 1
            log = await read_run(client, run_id, agent=AGENT)
            stream_seq_of = {r.event.seq: r.stream_seq for r in log.records}
            for snap in snaps:
                assert snap.head_stream_seq == stream_seq_of[snap.head_seq], snap

    asyncio.run(check())
