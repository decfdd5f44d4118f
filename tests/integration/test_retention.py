"""Retention, as the docs state it (docs/data-protection.md "Retention and erasure",
``runledger.log.streams``): the LEDGER stream's max age is the retention window (default 90 days,
``RUNLEDGER_RETENTION_DAYS``, 0 keeps forever), blobs expire with it, keys one day later.

Checked through the server's own stream info (the object store and the key bucket are streams),
not through runledger's settings objects, and for a short window by watching events and blobs
actually leave the store.
"""

from __future__ import annotations

from typing import Any

import pytest

from runledger import AgentSpec, Run, ScriptedModel
from runledger.errors import BlobMissingError
from runledger.log.client import LedgerClient, connect
from runledger.log.streams import DAY
from runledger.log.subjects import BLOB_BUCKET, KEY_STREAM, LEDGER_STREAM
from runledger.protect.blobs import BlobStore
from runledger.protect.capture import DataPolicy
from runledger.sdk.lifecycle import start_run
from tests.conftest import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

BLOB_STREAM = f"OBJ_{BLOB_BUCKET}"


async def max_ages(client: LedgerClient) -> dict[str, float]:
    """Each store's max age in seconds as the server reports it (0: kept forever)."""
    ages = {}
    for stream in (LEDGER_STREAM, BLOB_STREAM, KEY_STREAM):
        info = await client.js.stream_info(stream)
        ages[stream] = float(info.config.max_age or 0)
    return ages


def window(days: float) -> dict[str, float]:
    """What the docs promise for a retention of ``days``: events and blobs ``days``, keys a day longer."""
    if days == 0:
        return {LEDGER_STREAM: 0.0, BLOB_STREAM: 0.0, KEY_STREAM: 0.0}
    return {LEDGER_STREAM: days * DAY, BLOB_STREAM: days * DAY, KEY_STREAM: (days + 1) * DAY}


async def test_the_default_retention_is_90_days_for_events_and_blobs_and_91_for_keys(nats_url: str) -> None:
    async with await connect(nats_url) as client:
        assert await max_ages(client) == window(90)


@pytest.mark.parametrize("days", [7, 0], ids=["seven-days", "forever"])
async def test_runledger_retention_days_sets_every_store(
    nats_url: str, monkeypatch: pytest.MonkeyPatch, days: int
) -> None:
    monkeypatch.setenv("RUNLEDGER_RETENTION_DAYS", str(days))
    async with await connect(nats_url) as client:
        assert await max_ages(client) == window(days)


async def test_a_changed_retention_reaches_the_blobs_and_the_keys_too(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lengthening the window must lengthen it for blobs and keys as well: else events outlive the
    payloads they reference and the keys that open them (unreadable before their retention ends);
    shortening it must shorten it for them too (else content is kept past the promised window)."""
    monkeypatch.setenv("RUNLEDGER_RETENTION_DAYS", "30")
    async with await connect(nats_url) as client:
        assert await max_ages(client) == window(30)
    for days in (90, 14):
        monkeypatch.setenv("RUNLEDGER_RETENTION_DAYS", str(days))
        async with await connect(nats_url) as client:
            assert await max_ages(client) == window(days), f"after changing the retention to {days} days"


async def test_events_and_blobs_expire_with_the_window(nats_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A window of a few seconds (and a duplicate window inside it): a run's events and its blob
    really leave the store; the run's key, kept a day longer, is still there."""
    seconds = 3.0
    monkeypatch.setenv("RUNLEDGER_RETENTION_DAYS", repr(seconds / DAY))
    monkeypatch.setenv("RUNLEDGER_DUPLICATE_WINDOW", "1")
    body = "z" * 100_000

    async def agent(run: Run) -> Any:
        return len(await run.tool("fetch", {}, fn=lambda a: body))

    async with await connect(nats_url) as client:
        assert (await max_ages(client))[LEDGER_STREAM] == pytest.approx(seconds)
        spec = AgentSpec("short", agent, ScriptedModel([]), data_policy=DataPolicy(encrypt=True, blob_threshold=1024))
        assert (await start_run(client, spec, None, run_id="short-1")).status == "completed"
        info = await client.js.stream_info(LEDGER_STREAM)
        assert info.state.messages > 0
        store = await client.js.object_store(BLOB_BUCKET)
        names = [o.name for o in await store.list()]
        assert len(names) == 1  # the tool's output, stored by reference
        keys = (await client.js.stream_info(KEY_STREAM)).state.messages
        assert keys >= 1  # the run's data key

        async def ledger_empty() -> bool:
            return (await client.js.stream_info(LEDGER_STREAM)).state.messages == 0

        async def blobs_gone() -> bool:
            return (await client.js.stream_info(BLOB_STREAM)).state.messages == 0

        await eventually(ledger_empty, timeout=30, interval=0.25)
        await eventually(blobs_gone, timeout=30, interval=0.25)
        ref = {"$ref": "blob", "sha256": names[0], "size": 1, "media_type": "application/json"}
        with pytest.raises(BlobMissingError):
            await BlobStore(client).fetch(ref)
        assert (await client.js.stream_info(KEY_STREAM)).state.messages == keys  # a day longer: still there
