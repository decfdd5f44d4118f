"""Keyed digests (runledger.record.digests) on the in-memory ledger: a run with keys digests every
step's arguments, its approval and its hash-only content under its digest key (and records scheme 2);
a run recorded with plain digests keeps them; resume, the in-process replayer and ``diff`` still tell a
changed call from an unchanged one.

What erasure leaves is brute-forced against a real server in tests/integration/test_digest_erasure.py."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from runledger import AgentSpec, ModelResponse, Run, ScriptedModel
from runledger.errors import KeyStoreError, NondeterminismError
from runledger.log.client import LedgerClient
from runledger.log.subjects import effect_filter
from runledger.ops.decisions import approve
from runledger.protect.capture import DataPolicy, is_hashed
from runledger.protect.keystore import KVKeyStore, run_kid
from runledger.protect.loading import load_run
from runledger.record.canonical import canonical_json
from runledger.record.digests import KEYED_DIGESTS, PLAIN_DIGESTS, Digester
from runledger.record.fold import fold
from runledger.record.records import Recorded
from runledger.sdk import run as run_module
from runledger.sdk.lifecycle import resume_run, start_run
from runledger.testing import Replayer
from runledger.testing.export import read_recording
from tests import recorded_agents
from tests.unit.test_replay_paths import on_memory

CARD = "4539148803436467"


def _kid_spec(policy: DataPolicy) -> AgentSpec:
    async def kid(run: Run) -> Any:
        return {"pin_ok": run.input["pin"] > 0}

    return AgentSpec("dg_kid", kid, ScriptedModel([]), agent_version="v1", data_policy=policy)


def _spec(capture: str = "redacted") -> AgentSpec:
    policy = DataPolicy(capture=capture)  # type: ignore[arg-type]

    async def agent(run: Run) -> Any:
        await run.model([{"role": "user", "content": f"card {CARD}"}])
        await run.tool("verify", {"card": CARD}, fn=lambda a: {"valid": True})
        await run.effect("refund", {"amount": 4217}, key=f"refund:{run.run_id}", fn=lambda a: {"ok": True})
        await run.child(_kid_spec(policy), {"pin": 48213})
        await run.approval("send", {"confirm": "yes"})
        return "done"

    model = ScriptedModel(lambda m: ModelResponse(content="ok", input_tokens=1, output_tokens=1))
    return AgentSpec("dg_agent", agent, model, agent_version="v1", data_policy=policy)


# The value each digest of the run above is of, by event type.
VALUES = {
    "model.called": {"messages": [{"role": "user", "content": f"card {CARD}"}], "params": {}},
    "tool.called": {"card": CARD},
    "effect.intended": {"amount": 4217},
    "child.started": {"pin": 48213},
    "approval.requested": {"action": "send", "args": {"confirm": "yes"}},
    "approval.resolved": {"action": "send", "args": {"confirm": "yes"}},
}


async def _approved_and_resumed(client: LedgerClient, run_id: str, spec: AgentSpec) -> list[Recorded]:
    first = await start_run(client, spec, None, run_id=run_id)
    assert first.status == "suspended", first
    await approve(client, run_id, first.pending[0], by="op")
    assert (await resume_run(client, spec, run_id)).status == "completed"
    records = list((await load_run(client, run_id, open_content=False)).records)
    key = f"refund:{run_id}"
    from runledger.log.reader import decode_records, read_raw

    good, _ = decode_records(await read_raw(client, effect_filter("dg_agent", key)))
    return records + list(good)


def _digests_of(records: list[Recorded]) -> list[tuple[str, str]]:
    return [
        (r.event.type, r.event.payload.get("args_digest") or r.event.payload.get("digest"))
        for r in records
        if r.event.type in VALUES
    ]


def test_a_run_with_keys_digests_every_step_under_its_key_and_resumes() -> None:
    async def drive(client: LedgerClient) -> None:
        records = await _approved_and_resumed(client, "dg-keyed", _spec())
        assert fold(records[:1]).digest_scheme == KEYED_DIGESTS
        keys = await KVKeyStore(client.js).get(run_kid("dg_agent", "dg-keyed"))
        assert keys is not None
        keyed = Digester(2, KEYED_DIGESTS, keys.digest_key)
        found = _digests_of(records)
        # model, tool, effect on the run and on its key, child, approval asked and resolved
        assert sorted(t for t, _ in found) == sorted([*VALUES, "effect.intended"]), found
        for type_, value in found:
            assert value == keyed.digest(VALUES[type_]), type_
            assert value != hashlib.sha256(canonical_json(VALUES[type_], 2)).hexdigest(), type_

        # A resume still tells a changed argument from the recorded one.
        changed_run = await start_run(client, _spec(), None, run_id="dg-changed")
        await approve(client, "dg-changed", changed_run.pending[0], by="op")

        async def other(run: Run) -> Any:
            await run.model([{"role": "user", "content": f"card {CARD}"}])
            await run.tool("verify", {"card": CARD[:-1] + "8"}, fn=lambda a: {"valid": True})

        spec = _spec()
        changed = AgentSpec(spec.name, other, spec.model, agent_version="v1", data_policy=spec.data_policy)
        with pytest.raises(NondeterminismError, match="step 1"):
            await resume_run(client, changed, "dg-changed")

    on_memory(drive)


def test_hash_only_content_is_digested_under_the_runs_key() -> None:
    async def drive(client: LedgerClient) -> None:
        first = await start_run(client, _spec("hash-only"), None, run_id="dg-hashed")
        assert first.status == "suspended"
        records = (await load_run(client, "dg-hashed", open_content=False)).records
        keys = await KVKeyStore(client.js).get(run_kid("dg_agent", "dg-hashed"))
        assert keys is not None
        keyed = Digester(2, KEYED_DIGESTS, keys.digest_key)
        effect = next(r.event.payload for r in records if r.event.type == "effect.intended")
        assert is_hashed(effect["args"])
        raw = canonical_json({"amount": 4217}, 2)
        assert effect["args"]["$hash"] == keyed.of_bytes(raw) != hashlib.sha256(raw).hexdigest()

    on_memory(drive)


def test_a_run_recorded_with_plain_digests_keeps_them_when_it_resumes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run recorded before keyed digests (no digest_scheme in its run.started) resumes with this code and
    goes on digesting as it began: the steps replay, and the steps after the resume are plain too."""

    async def drive(client: LedgerClient) -> None:
        with monkeypatch.context() as patched:
            patched.setattr(run_module, "new_digest_scheme", lambda protector: PLAIN_DIGESTS)
            patched.setattr("runledger.sdk.lifecycle.new_digest_scheme", lambda protector: PLAIN_DIGESTS)
            first = await start_run(client, _spec(), None, run_id="dg-old")
        assert first.status == "suspended"
        records = (await load_run(client, "dg-old", open_content=False)).records
        assert "digest_scheme" not in records[0].event.payload
        await approve(client, "dg-old", first.pending[0], by="op")
        assert (await resume_run(client, _spec(), "dg-old")).status == "completed"
        records = (await load_run(client, "dg-old", open_content=False)).records
        for type_, value in _digests_of(list(records)):
            assert value == hashlib.sha256(canonical_json(VALUES[type_], 2)).hexdigest(), type_

    on_memory(drive)


def test_a_keyed_digester_without_its_key_says_why() -> None:
    with pytest.raises(KeyStoreError, match="digest key"):
        Digester(2, KEYED_DIGESTS).digest({"a": 1})
    with pytest.raises(ValueError, match="unknown digest scheme 3"):
        Digester(2, 3)


def test_a_keyed_recording_replays_and_a_changed_argument_still_diverges() -> None:
    """The replayer holds no key: it digests the recording's opened arguments again. Unchanged code
    replays clean; code that calls with another argument diverges at that step, shown side by side."""

    async def drive(client: LedgerClient) -> tuple[Any, Any]:
        recorded_agents.CALLS.clear()
        await start_run(client, recorded_agents.shop_spec(), {"basket": "b-1"}, run_id="shop-keyed")
        recording = await read_recording(client, "shop-keyed")
        assert fold(list(recording.events())).digest_scheme == KEYED_DIGESTS
        recorded_agents.CALLS.clear()
        same = await Replayer(recorded_agents.shop_spec()).replay(recording)
        other = await Replayer(recorded_agents.shop_other_warehouse_spec()).replay(recording)
        return same, other

    same, other = on_memory(drive)
    assert same.ok, str(same)
    assert other.divergence is not None and other.divergence.step == 1, str(other)
    assert '+ "warehouse": "north"' in other.divergence.detail
    assert recorded_agents.CALLS == []
