"""Payloads by reference: large bodies live in LEDGER_BLOBS, events and checkpoints carry references."""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

import pytest

from runledger import AgentSpec, Run, ScriptedModel
from runledger.cli import main
from runledger.errors import BlobCorruptError, BlobMissingError, PayloadUnavailableError
from runledger.log.client import LedgerClient
from runledger.log.subjects import BLOB_BUCKET
from runledger.ops.decisions import approve
from runledger.protect.blobs import BlobStore, is_blob_ref
from runledger.protect.capture import DataPolicy, client_opener
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from runledger.sdk.lifecycle import resume_run, start_run

pytestmark = pytest.mark.integration

MB = 1024 * 1024


def _document(size: int) -> str:
    line = "Clause {n}: the party of the first part shall refund order-{n} in full.\n"
    out, n, total = [], 0, 0
    while total < size:
        text = line.format(n=n)
        out.append(text)
        total += len(text)
        n += 1
    return "".join(out) + "END-OF-DOCUMENT"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("encrypt", [True, False], ids=["sealed", "plain"])
async def test_a_50mb_document_stays_out_of_the_checkpoint_and_is_shown_on_request(
    client: LedgerClient, capsys: pytest.CaptureFixture[str], encrypt: bool
) -> None:
    doc = _document(50 * MB)
    seen: list[int] = []
    reads: list[str] = []  # every real call of the tool

    def read_document(args: dict[str, Any]) -> str:
        reads.append(args["id"])
        return doc

    async def agent(run: Run) -> Any:
        text = await run.tool("read_document", {"id": "contract-7"}, fn=read_document)
        seen.append(len(text))
        await run.approval("sign", {"length": len(text)})
        return {"length": len(text), "tail": text[-15:]}

    spec = AgentSpec("reader", agent, ScriptedModel([]), agent_version="v1", data_policy=DataPolicy(encrypt=encrypt))
    run_id = f"doc50-{encrypt}"
    first = await start_run(client, spec, None, run_id=run_id)
    assert first.status == "suspended" and seen == [len(doc)] and reads == ["contract-7"]

    log = await load_run(client, run_id)
    ref = next(r.event.payload["output"] for r in log.records if r.event.type == "tool.called")
    assert is_blob_ref(ref) and ref["size"] >= 50 * MB and bool(ref.get("enc")) == encrypt
    assert max(len(r.event.to_bytes()) for r in log.records) < 4096
    cp = fold(log.records)
    size = len(json.dumps(cp.to_dict()))
    assert size < 64 * 1024, size

    # `show` prints the reference by default and the document with --fetch.
    code = await asyncio.to_thread(main, ["show", run_id, "--nats", client.url, "--step", "0"])
    out = capsys.readouterr().out
    assert code == 0 and '"$ref": "blob"' in out and "END-OF-DOCUMENT" not in out
    code = await asyncio.to_thread(main, ["show", run_id, "--nats", client.url, "--step", "0", "--fetch"])
    out = capsys.readouterr().out
    assert code == 0 and "END-OF-DOCUMENT" in out and "Clause 12345:" in out and len(out) > 50 * MB

    # A resume replays the step from the blob (fetched and hash-verified), not by reading again.
    await approve(client, run_id, first.pending[0], by="op")
    second = await resume_run(client, spec, run_id)
    assert second.status == "completed"
    assert second.output == {"length": len(doc), "tail": "END-OF-DOCUMENT"} and seen == [len(doc), len(doc)]
    assert reads == ["contract-7"], "the resume ran the tool again instead of serving its blob"
    resumed_cp = fold((await load_run(client, run_id)).records)
    assert len(json.dumps(resumed_cp.to_dict())) < 64 * 1024


async def test_blobs_are_named_by_hash_stored_once_and_verified(client: LedgerClient) -> None:
    blobs = BlobStore(client)
    body = b'"some body"' * 10_000
    ref = await blobs.put(body)
    again = await blobs.put(body)
    assert ref == again and ref["sha256"] == hashlib.sha256(body).hexdigest()
    store = await client.js.object_store(BLOB_BUCKET)
    assert len([o for o in await store.list() if o.name == ref["sha256"]]) == 1
    assert await blobs.fetch(ref) == body
    # Read as the object store lays it out (metadata by direct get, chunks by one subject read),
    # the same bytes nats-py's own read gives.
    assert await blobs._read_direct(ref["sha256"]) == body == await blobs._read_through_store(ref["sha256"])
    # A deleted blob (its metadata a delete marker) is left to nats-py's read, which finds it erased.
    gone = await blobs.put(b'"to be erased"')
    assert await blobs.delete(gone["sha256"])
    assert await blobs._read_direct(gone["sha256"]) is None
    with pytest.raises(BlobMissingError):
        await blobs.fetch(gone)

    # An object whose content does not match its name is refused.
    forged = b'"forged body"'
    fake_name = hashlib.sha256(b'"the real one"').hexdigest()
    await store.put(fake_name, forged)
    with pytest.raises(BlobCorruptError):
        await blobs.fetch({"$ref": "blob", "sha256": fake_name, "size": 13})
    missing = {"$ref": "blob", "sha256": "0" * 64, "size": 1, "media_type": "application/json"}
    with pytest.raises(BlobMissingError):
        await blobs.fetch(missing)
    with pytest.raises(PayloadUnavailableError, match="not in the object store"):
        await client_opener(client).open_value(missing)


async def test_the_threshold_is_configurable(client: LedgerClient) -> None:
    async def agent(run: Run) -> Any:
        small = await run.tool("small", 1, fn=lambda a: "x" * 500)
        big = await run.tool("big", 2, fn=lambda a: "y" * 5000)
        return len(small) + len(big)

    policy = DataPolicy(encrypt=False, blob_threshold=1024)
    await start_run(client, AgentSpec("thr", agent, ScriptedModel([]), data_policy=policy), None, run_id="thr1")
    outputs = [r.event.payload["output"] for r in (await load_run(client, "thr1")).records if r.event.step is not None]
    assert outputs[0] == "x" * 500 and is_blob_ref(outputs[1])
