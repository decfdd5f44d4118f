"""bench.load in a quick mode: what it reports is what the log holds."""

from __future__ import annotations

import asyncio

import pytest

from bench.load import AGENT, RAW_STREAM, STEPS_PER_RUN, prepare, run_phase
from runledger.log.client import connect
from runledger.log.reader import subject_counts
from runledger.protect.loading import load_run
from runledger.record.fold import fold

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def _log_counts(url: str, run_ids: list[str]) -> tuple[int, int, int, int]:
    """(steps, completed runs, run-subject events, effect-key events) as the stream holds them."""
    async with await connect(url) as client:
        steps = completed = 0
        for run_id in run_ids:
            cp = fold((await load_run(client, run_id, agent=AGENT, open_content=False)).records)
            steps += len(cp.steps)
            completed += cp.status == "completed"
        run_events = sum((await subject_counts(client, f"ledger.run.{AGENT}.>")).values())
        key_events = sum((await subject_counts(client, "ledger.effect.>")).values())
        return steps, completed, run_events, key_events


async def _raw_messages(url: str) -> int:
    async with await connect(url) as client:
        return int((await client.js.stream_info(RAW_STREAM)).state.messages)


def test_reported_steps_are_the_acknowledged_steps_in_the_stream(nats_url: str) -> None:
    payloads, _ = asyncio.run(prepare(nats_url))  # one warm-up run, and the raw stream
    _, _, warmup_run_events, warmup_key_events = asyncio.run(_log_counts(nats_url, []))

    # 3 agents x 2 runs, over two load processes (the multi-process path).
    sdk = run_phase(nats_url, "sdk", 3, procs=2, runs=2)
    assert (sdk.completed, sdk.failed, sdk.errors) == (6, 0, [])
    assert len(sdk.run_ids) == 6
    steps, completed, run_events, key_events = asyncio.run(_log_counts(nats_url, sdk.run_ids))
    assert sdk.steps == steps == 6 * STEPS_PER_RUN
    assert completed == 6
    # Every message the phase added to LEDGER is one of these runs' events or effect claims.
    assert sdk.stream_msgs == (run_events - warmup_run_events) + (key_events - warmup_key_events)
    assert sdk.steps_in_window == sdk.steps and sdk.rate > 0

    raw = run_phase(nats_url, "raw", 3, runs=1, payloads=payloads)
    assert raw.failed == 0
    assert raw.steps == 3 * len(payloads) == asyncio.run(_raw_messages(nats_url))
