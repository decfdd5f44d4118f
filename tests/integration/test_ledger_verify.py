"""Tamper evidence: `verify` names the first bad event of a modified, missing, reordered or forged run.

Each test writes a run's events with a raw client (no fencing, as an attacker with
publish rights would) into a real stream and checks what `verify` reports.
"""

from __future__ import annotations

import json

import pytest

from runledger.cli import main
from runledger.log.client import LedgerClient
from runledger.log.subjects import run_subject
from runledger.ops.verify import verify_runs
from runledger.record.canonical import canonical_json
from runledger.record.events import ClockRead, ToolCalled, chain_hash
from tests.unit.helpers import Chain

pytestmark = pytest.mark.integration


def _chain(run_id: str, steps: int = 5) -> Chain:
    chain = Chain(run_id, "tamper")
    chain.start()
    for i in range(steps):
        chain.add(ToolCalled(step=i, name="t", args={"i": i}, args_digest=f"d{i}", output={"ok": i}))
    return chain


async def _publish(client: LedgerClient, run_id: str, raws: list[bytes]) -> list[int]:
    subject = run_subject("tamper", run_id)
    return [int((await client.js.publish(subject, raw)).seq) for raw in raws]


async def _verify_one(client: LedgerClient, run_id: str) -> tuple[bool, int | None, int | None, str]:
    [result] = await verify_runs(client, run_id)
    return result.ok, result.first_bad_seq, result.first_bad_stream_seq, result.reason


async def test_an_intact_run_verifies(client: LedgerClient) -> None:
    chain = _chain("intact")
    await _publish(client, "intact", chain.raw)
    assert await _verify_one(client, "intact") == (True, None, None, "")


async def test_a_modified_event_is_named(client: LedgerClient) -> None:
    chain = _chain("modified")
    data = json.loads(chain.raw[3])
    data["payload"]["output"] = {"ok": "refund 10000"}  # content changed, hash left as it was
    raws = [*chain.raw[:3], canonical_json(data), *chain.raw[4:]]
    stream_seqs = await _publish(client, "modified", raws)
    ok, seq, stream_seq, reason = await _verify_one(client, "modified")
    assert not ok and seq == 3 and stream_seq == stream_seqs[3]
    assert "hash does not match" in reason


async def test_a_modified_event_with_a_recomputed_hash_breaks_the_next_link(client: LedgerClient) -> None:
    chain = _chain("rehashed")
    data = json.loads(chain.raw[2])
    data["payload"]["output"] = {"ok": "changed"}
    unhashed = {k: v for k, v in data.items() if k != "hash"}
    data["hash"] = chain_hash(data["prev_hash"], unhashed)  # a consistent event on its own
    raws = [*chain.raw[:2], canonical_json(data), *chain.raw[3:]]
    stream_seqs = await _publish(client, "rehashed", raws)
    ok, seq, stream_seq, reason = await _verify_one(client, "rehashed")
    # The rewritten event is self-consistent; the next event no longer links to it.
    assert not ok and seq == 3 and stream_seq == stream_seqs[3]
    assert "prev_hash" in reason


async def test_a_missing_event_is_named(client: LedgerClient) -> None:
    chain = _chain("missing")
    raws = [chain.raw[0], chain.raw[1], chain.raw[3], chain.raw[4]]  # seq n+2 published, n+1 skipped
    stream_seqs = await _publish(client, "missing", raws)
    ok, seq, stream_seq, reason = await _verify_one(client, "missing")
    assert not ok and seq == 2 and stream_seq == stream_seqs[2]
    assert "seq 3 where 2 was expected" in reason


async def test_reordered_events_are_named(client: LedgerClient) -> None:
    chain = _chain("reorder")
    raws = [chain.raw[0], chain.raw[1], chain.raw[3], chain.raw[2], *chain.raw[4:]]
    stream_seqs = await _publish(client, "reorder", raws)
    ok, seq, stream_seq, reason = await _verify_one(client, "reorder")
    assert not ok and seq == 2 and stream_seq == stream_seqs[2]
    assert "seq 3 where 2 was expected" in reason


async def test_a_forged_event_inserted_into_the_history_is_named(client: LedgerClient) -> None:
    chain = _chain("forged")
    # A well-formed event with a valid hash, forged at position 2 with the right prev_hash:
    forger = Chain("forged", "tamper")
    forger.events = list(chain.events[:2])
    forged = forger.add(ClockRead(step=1, value="2020-01-01T00:00:00+00:00"))
    raws = [*chain.raw[:2], forger.raw[-1], *chain.raw[2:]]
    assert forged.seq == 2
    stream_seqs = await _publish(client, "forged", raws)
    ok, seq, stream_seq, reason = await _verify_one(client, "forged")
    # The forged event links, so the genuine event 2 after it is the first that cannot.
    assert not ok and seq == 3 and stream_seq == stream_seqs[3]
    assert "seq 2 where 3 was expected" in reason


async def test_an_event_of_another_run_replayed_onto_this_subject_is_named(client: LedgerClient) -> None:
    """Its envelope names another run: quarantined and named (runledger.record.fold.refusal), no part
    of the chain, which holds without it, as every reader leaves it out."""
    victim, other = _chain("victim"), _chain("donor")
    raws = [*victim.raw[:3], other.raw[3], *victim.raw[3:]]
    stream_seqs = await _publish(client, "victim", raws)
    [result] = await verify_runs(client, "victim")
    assert result.ok and result.events == len(raws) - 1 and result.forged  # an alarm (exit 7), not a break
    [named] = result.quarantined
    assert named.startswith(f"stream seq {stream_seqs[3]}: ") and "names run 'donor'" in named


async def test_the_cli_names_the_first_bad_sequence(client: LedgerClient, capsys: pytest.CaptureFixture[str]) -> None:
    chain = _chain("clibad")
    stream_seqs = await _publish(client, "clibad", [chain.raw[0], chain.raw[1], chain.raw[3]])
    await _publish(client, "cligood", _chain("cligood").raw)
    import asyncio

    code = await asyncio.to_thread(main, ["verify", "--nats", client.url])
    out = capsys.readouterr().out
    assert code == 1
    assert f"BAD  clibad  agent tamper  first bad event at stream seq {stream_seqs[2]} (event seq 2," in out
    assert "ok   cligood  agent tamper" in out and "1 of 2 runs verified" in out


# -- verify --deep: what the chain alone cannot see ---------------------------------------------------------


async def _sealed_run(client: LedgerClient, run_id: str) -> None:
    from runledger import AgentSpec, Run, ScriptedModel
    from runledger.protect.capture import DataPolicy
    from runledger.sdk.lifecycle import start_run

    async def agent(run: Run) -> object:
        await run.tool("read", {"q": 1}, fn=lambda a: "d" * 3000)
        return "done"

    spec = AgentSpec("deep", agent, ScriptedModel([]), agent_version="v1", data_policy=DataPolicy(blob_threshold=1024))
    await start_run(client, spec, {"in": 1}, run_id=run_id)


async def _append_forged(client: LedgerClient, run_id: str, body: object) -> int:
    from runledger.protect.loading import load_run
    from runledger.record.events import Payload

    assert isinstance(body, Payload)
    log = await load_run(client, run_id, open_content=False)
    last = log.records[-1].event
    forger = Chain(run_id, "deep")
    forger.events = [r.event for r in log.records]
    forger.add(body)
    assert forger.events[-1].prev_hash == last.hash  # a perfectly linked event
    ack = await client.js.publish(run_subject("deep", run_id), forger.raw[-1])
    return int(ack.seq)


async def test_deep_verify_passes_a_genuine_sealed_run(client: LedgerClient) -> None:
    await _sealed_run(client, "deep-ok")
    [result] = await verify_runs(client, "deep-ok", deep=True)
    assert result.ok, result.problems


async def test_a_linked_forgery_at_the_tail_passes_the_chain_but_not_deep_verify(client: LedgerClient) -> None:
    from runledger.record.events import RunCompleted

    await _sealed_run(client, "deep-forged")
    stream_seq = await _append_forged(client, "deep-forged", RunCompleted(output={"refund": 10_000}))
    [chain_only] = await verify_runs(client, "deep-forged")
    assert chain_only.ok  # the limit of a hash chain: anyone who may publish can append
    [deep] = await verify_runs(client, "deep-forged", deep=True)
    assert not deep.ok and deep.first_bad_stream_seq == stream_seq and "unsealed content" in deep.reason


async def test_content_sealed_under_another_key_fails_authentication(client: LedgerClient) -> None:
    from runledger.protect.capture import DataPolicy, PayloadProtector
    from runledger.protect.keystore import RunKeys
    from runledger.record.events import RunCompleted

    await _sealed_run(client, "deep-key")
    impostor = PayloadProtector(DataPolicy(), RunKeys.generate("deep.deep-key"))  # same kid, wrong key
    stream_seq = await _append_forged(client, "deep-key", await impostor.protect(RunCompleted(output="forged")))
    [deep] = await verify_runs(client, "deep-key", deep=True)
    assert not deep.ok and deep.first_bad_stream_seq == stream_seq and "fails authentication" in deep.reason


async def test_a_swapped_blob_is_caught_and_an_erased_run_still_verifies(client: LedgerClient) -> None:
    from runledger.log.subjects import BLOB_BUCKET
    from runledger.protect.blobs import is_blob_ref
    from runledger.protect.erasure import erase_run
    from runledger.protect.loading import load_run

    await _sealed_run(client, "deep-blob")
    log = await load_run(client, "deep-blob", open_content=False)
    ref = next(v for r in log.records for v in r.event.payload.values() if is_blob_ref(v))
    store = await client.js.object_store(BLOB_BUCKET)
    await store.delete(ref["sha256"])
    await store.put(ref["sha256"], b"swapped body")
    [deep] = await verify_runs(client, "deep-blob", deep=True)
    assert not deep.ok and "does not match its hash" in deep.reason

    await _sealed_run(client, "deep-erased")
    await erase_run(client, "deep-erased", reason="test", by="t")
    [erased] = await verify_runs(client, "deep-erased", deep=True)
    assert erased.ok, erased.problems
