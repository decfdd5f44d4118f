"""Erasure: a run's content becomes unreadable through every reader, its structure stays, verify passes."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest

from runledger import AgentSpec, ModelResponse, Run, ScriptedModel
from runledger.cli import main
from runledger.errors import BlobMissingError, LedgerError, PayloadUnavailableError
from runledger.log.client import LedgerClient
from runledger.log.reader import read_raw
from runledger.log.server import ServerState
from runledger.ops.decisions import approve
from runledger.ops.verify import verify_runs
from runledger.protect.blobs import BlobStore, is_blob_ref
from runledger.protect.capture import DataPolicy, client_opener
from runledger.protect.erasure import erase_run
from runledger.protect.keystore import KVKeyStore
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from runledger.sdk.effects import read_key
from runledger.sdk.lifecycle import resume_run, start_run

pytestmark = pytest.mark.integration

PERSONAL = ["Ann Example", "ann@example.com", "DE89 3704 0044 0532 0130 00", "Flat 3, 12 High Street"]


def _spec(encrypt: bool = True) -> AgentSpec:
    async def agent(run: Run) -> Any:
        profile = await run.tool("lookup_customer", {"email": PERSONAL[1]}, fn=lambda a: {"name": PERSONAL[0]})
        letter = await run.tool("draft", {"to": PERSONAL[3]}, fn=lambda a: f"Dear {PERSONAL[0]},\n" + "." * 5000)
        await run.model([{"role": "user", "content": f"Summarise for {profile['name']}: {letter[:40]}"}])
        await run.effect("refund", {"iban": PERSONAL[2]}, key=f"refund:{run.run_id}", fn=lambda a: {"to": a["iban"]})
        await run.approval("send", {"to": PERSONAL[1]})
        return {"sent_to": PERSONAL[1]}

    reply = ModelResponse(content=f"Summary for {PERSONAL[0]}", input_tokens=7, output_tokens=3)
    model = ScriptedModel(lambda m: reply)
    policy = DataPolicy(encrypt=encrypt, blob_threshold=2048)
    return AgentSpec("erasable", agent, model, agent_version="v1", data_policy=policy)


def _text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _no_personal_data(text: str, where: str) -> None:
    for item in PERSONAL:
        assert item not in text, f"{item!r} still readable in {where}"


async def test_erase_makes_content_unreadable_everywhere_and_keeps_structure(
    client: LedgerClient, nats_server: ServerState, capsys: pytest.CaptureFixture[str]
) -> None:
    first = await start_run(client, _spec(), {"customer": PERSONAL[0]}, run_id="erase-me")
    assert first.status == "suspended"
    keys = await KVKeyStore(client.js).get("erasable.erase-me")
    assert keys is not None
    key_b64 = base64.b64encode(keys.data_key)
    before = await load_run(client, "erase-me", fetch=True)
    assert PERSONAL[0] in _text([r.event.payload for r in before.records])  # readable with the key
    refs = [v for r in before.records for v in r.event.payload.values() if is_blob_ref(v)]
    raw_refs = [
        v for r in (await load_run(client, "erase-me", open_content=False)).records
        for v in r.event.payload.values() if is_blob_ref(v)
    ]  # fmt: skip
    assert not refs and raw_refs  # fetch=True opened the blob; the stored event carries the reference

    result = await erase_run(client, "erase-me", reason="GDPR art. 17 request #42", by="dpo")
    assert result.keys_destroyed and result.blobs_deleted == len(raw_refs) and result.plaintext_events == 0

    # Every reader: the log opened with keys and blobs fetched, the fold, the effect's key subject,
    # the object store, the key store, the CLI.
    after = await load_run(client, "erase-me", fetch=True)
    _no_personal_data(_text([r.event.payload for r in after.records]), "the opened log")
    cp = fold(after.records)
    _no_personal_data(_text(cp.to_dict()), "the checkpoint")
    key_state = await read_key(client, "refund:erase-me")
    assert key_state.status == "committed"
    with pytest.raises(PayloadUnavailableError, match="erased"):
        await client_opener(client).open_value(key_state.result)
    for ref in raw_refs:
        with pytest.raises(BlobMissingError):
            await BlobStore(client).fetch(ref)
    assert await KVKeyStore(client.js).get("erasable.erase-me") is None
    # The key was securely deleted: its bytes are nowhere in the server's store files.
    for path in Path(nats_server.data_dir).rglob("*"):
        if path.is_file():
            assert key_b64 not in path.read_bytes(), path
    raw = b"".join(r.data for r in await read_raw(client, "ledger.>"))
    _no_personal_data(raw.decode("utf-8", "replace"), "the raw stream")
    code = await asyncio.to_thread(main, ["show", "erase-me", "--nats", client.url, "--step", "1", "--fetch"])
    shown = capsys.readouterr().out
    assert code == 0 and '"$erased": true' in shown and '"$enc"' not in shown  # says erased, not ciphertext
    _no_personal_data(shown, "runledger show --fetch")

    # Structure stays: steps, names, statuses, token usage, the erasure itself; the chain verifies.
    assert [(s.kind, s.name, s.status) for s in cp.steps.values()] == [
        ("tool", "lookup_customer", "ok"),
        ("tool", "draft", "ok"),
        ("model", "scripted-1", "ok"),
        ("effect", "refund", "committed"),
        ("approval", "send", "pending"),
    ]
    assert cp.spent["tokens"] == 10 and cp.status == "suspended"
    assert cp.erased is not None and cp.erased["by"] == "dpo" and cp.erased["reason"] == "GDPR art. 17 request #42"
    assert all(r.ok for r in await verify_runs(client, "erase-me"))
    code = await asyncio.to_thread(main, ["verify", "erase-me", "--nats", client.url])
    assert code == 0 and "1 of 1 runs verified" in capsys.readouterr().out

    # The run cannot be continued (its content cannot be replayed, its key cannot be re-created).
    await approve(client, "erase-me", first.pending[0], by="op")
    with pytest.raises(LedgerError, match="erased"):
        await resume_run(client, _spec(), "erase-me")

    # Erasing again is a no-op that says so.
    again = await erase_run(client, "erase-me", reason="again", by="dpo")
    assert not again.keys_destroyed and not again.recorded
    assert all(r.ok for r in await verify_runs(client, "erase-me"))


async def test_other_runs_are_untouched(client: LedgerClient) -> None:
    await start_run(client, _spec(), None, run_id="keep-me")
    await start_run(client, _spec(), None, run_id="drop-me")
    await erase_run(client, "drop-me", reason="test", by="t")
    kept = await load_run(client, "keep-me", fetch=True)
    assert PERSONAL[0] in _text([r.event.payload for r in kept.records])


async def test_erasing_an_unsealed_run_says_what_it_cannot_reach(
    client: LedgerClient, capsys: pytest.CaptureFixture[str]
) -> None:
    await start_run(client, _spec(encrypt=False), None, run_id="plain-run")
    code = await asyncio.to_thread(
        main, ["erase", "plain-run", "--nats", client.url, "--reason", "request", "--by", "dpo"]
    )
    out = capsys.readouterr().out
    assert code == 0 and "erased run plain-run" in out and "WARNING" in out and "recorded unsealed" in out
    log = await load_run(client, "plain-run")
    assert log.records[-1].event.type == "run.erased" and log.records[-1].event.payload["plaintext_events"] > 0
    # Its blobs (plain JSON) are deleted all the same.
    assert log.records[-1].event.payload["blobs_deleted"] >= 1


def _family(encrypt: bool = True) -> AgentSpec:
    policy = DataPolicy(encrypt=encrypt)

    async def kid(run: Run) -> Any:
        return await run.tool("address", {"of": run.input["name"]}, fn=lambda a: PERSONAL[3])

    kid_spec = AgentSpec("erasable_kid", kid, ScriptedModel([]), agent_version="v1", data_policy=policy)

    async def parent(run: Run) -> Any:
        return {"address": await run.child(kid_spec, {"name": PERSONAL[0]})}

    return AgentSpec("erasable_parent", parent, ScriptedModel([]), agent_version="v1", data_policy=policy)


async def test_erasure_cascades_to_child_runs_and_records_why(client: LedgerClient) -> None:
    await start_run(client, _family(), None, run_id="fam")
    await start_run(client, _family(), None, run_id="fam-other")
    child_id = fold((await load_run(client, "fam")).records).steps[0].child_run_id
    assert child_id and PERSONAL[3] in _text([r.event.payload for r in (await load_run(client, child_id)).records])

    result = await erase_run(client, "fam", reason="request #3", by="dpo")
    assert [(d.run_id, d.relation, d.derived_from, d.recorded) for d in result.lineage] == [
        (child_id, "child", "fam", True)
    ]
    _no_personal_data(_text([r.event.payload for r in (await load_run(client, child_id)).records]), "the child")
    erased = [r.event.payload for r in (await load_run(client, child_id)).records if r.event.type == "run.erased"]
    assert erased[0]["because_of"] == "fam" and erased[0]["relation"] == "child" and erased[0]["reason"] == "request #3"
    assert "because_of" not in [r for r in (await load_run(client, "fam")).records][-1].event.payload
    assert all(r.ok for r in await verify_runs(client, child_id))
    # Another run of the same agents is not part of the lineage.
    assert PERSONAL[3] in _text([r.event.payload for r in (await load_run(client, "fam-other")).records])
    # Erasing again finds the lineage erased already and records nothing twice.
    again = await erase_run(client, "fam", reason="again", by="dpo")
    assert not again.recorded and [d.recorded for d in again.lineage] == [False]


async def test_the_projection_rewrites_an_erased_runs_rows(
    client: LedgerClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Content recorded unsealed (encrypt=False) is in the projection as plaintext: the next
    `project` after the erasure rewrites every row of the run and of its child, and an export
    made afterwards holds none of it."""
    db = str(tmp_path / "ledger.duckdb")
    nats = ["--nats", client.url, "--db", db]
    await start_run(client, _spec(encrypt=False), None, run_id="plain-proj")
    await start_run(client, _family(encrypt=False), None, run_id="plain-fam")

    async def sql(query: str) -> str:
        code = await asyncio.to_thread(main, ["sql", query, "--format", "json", *nats])
        out = capsys.readouterr().out
        assert code == 0, out
        return out

    tables = ("events", "runs", "steps", "checkpoints", "effect_keys")
    before = [await sql(f"SELECT * FROM {t}") for t in tables]
    assert PERSONAL[2] in before[0] and PERSONAL[3] in before[2]  # the unsealed content was projected
    for run_id in ("plain-proj", "plain-fam"):
        await erase_run(client, run_id, reason="request", by="dpo")
    for table in tables:
        _no_personal_data(await sql(f"SELECT * FROM {table}"), f"the projection's {table} after the next project")
    steps = json.loads(await sql("SELECT run_id, kind, name, status, output FROM steps ORDER BY run_id, step"))
    assert [s["status"] for s in steps if s["run_id"] == "plain-proj"] == [
        "ok", "ok", "ok", "committed", "pending"
    ]  # fmt: skip
    assert all("$erased" in str(s["output"]) for s in steps if s["kind"] in ("tool", "effect", "child"))
    keys = json.loads(await sql("SELECT result FROM effect_keys WHERE run_id = 'plain-proj'"))
    assert keys and all("$erased" in str(k["result"]) for k in keys)
    export = tmp_path / "lake"
    code = await asyncio.to_thread(main, ["export", "--parquet", str(export), *nats])
    assert code == 0, capsys.readouterr()
    for path in export.rglob("*.parquet"):
        _no_personal_data(path.read_bytes().decode("utf-8", "replace"), str(path))


async def test_erased_content_reads_as_erased_and_a_key_it_committed_answers_committed_result_erased(
    client: LedgerClient, nats_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from runledger import EffectResultErasedError

    paid: list[str] = []

    def pay(args: dict[str, Any]) -> dict[str, Any]:
        paid.append(args["order"])
        return {"refund": "r-77", "to": PERSONAL[2]}

    async def payer(run: Run) -> Any:
        try:
            return await run.effect("refund", {"order": "o-77"}, key="refund:o-77", fn=pay)
        except EffectResultErasedError as exc:  # the agent handles it: the refund happened, its record is gone
            return {"already": exc.key, "committed_by": exc.committed_by}

    spec = AgentSpec("payer", payer, ScriptedModel([]), agent_version="v1")
    assert (await start_run(client, spec, run_id="pay-1")).output == {"refund": "r-77", "to": PERSONAL[2]}

    async def cli(*args: str) -> dict[str, Any]:
        capsys.readouterr()
        assert await asyncio.to_thread(main, [*args, "--nats", nats_url]) == 0
        shown: dict[str, Any] = json.loads(capsys.readouterr().out)
        return shown

    # effects show opens what the caller may open (it printed the sealed result).
    before = await cli("effects", "show", "refund:o-77")
    assert (before["status"], before["result"]) == ("committed", {"refund": "r-77", "to": PERSONAL[2]})

    await erase_run(client, "pay-1", reason="customer asked", by="dpo")
    after = await cli("effects", "show", "refund:o-77")
    assert (after["status"], after["result"], after["note"]) == (
        "committed",
        {"$erased": True},
        "committed, result erased (run pay-1 was erased)",
    )
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["show", "pay-1", "--nats", nats_url]) == 0
    text = capsys.readouterr().out
    assert "$enc" not in text and "«erased»" in text  # it printed the sealed blobs
    shown = await cli("show", "pay-1", "--json")
    assert "$enc" not in json.dumps(shown)
    (committed,) = [e for e in shown["events"] if e["type"] == "effect.committed"]
    assert committed["payload"]["result"] == {"$erased": True}

    # A later run claiming the key: committed, not paid again, and an error type the agent handles.
    later = await start_run(client, spec, run_id="pay-2")
    assert later.status == "completed", later.error
    assert later.output == {"already": "refund:o-77", "committed_by": "pay-1"}
    assert paid == ["o-77"]
