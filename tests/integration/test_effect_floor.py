"""The effect protocol at its floor (docs/wire.md, "The claim protocol for effects"): the key's claim
is the only write ahead of acting, the run's fence is checked in flight with it, and the run records
the intent and the outcome once the key holds the outcome. Each crash point of the table, in both
durabilities: what the log holds, and a resume that acts exactly once. A run recorded by the
previous protocol (the intent on the run before acting) still resumes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runledger import NOT_FOUND, AgentSpec, Run, ScriptedModel
from runledger.errors import FencedError
from runledger.log.append import append_to_run
from runledger.log.client import LedgerClient
from runledger.log.publish import RetryPolicy, SubjectWriter
from runledger.log.reader import read_raw
from runledger.log.subjects import effect_filter, run_subject
from runledger.ops.verify import verify_runs
from runledger.protect.loading import load_run
from runledger.record.events import BudgetGranted, EffectIntended
from runledger.record.fold import fold
from runledger.sdk.effects import KeyState, append_to_key, read_key
from runledger.sdk.lifecycle import resume_run, start_run
from tests.agents import calls
from tests.integration.processes import runledger

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
SPECS = {"step": "tests.agents:windowed_step_spec", "output": "tests.agents:windowed_spec"}


def _types(records: list[Any]) -> list[str]:
    return [json.loads(r.data)["type"] for r in records]


async def _stored(client: LedgerClient, run_id: str, key: str) -> tuple[list[str], list[dict[str, Any]]]:
    run = _types(await read_raw(client, f"ledger.run.windowed.{run_id}.*"))
    return run, [json.loads(r.data) for r in await read_raw(client, effect_filter("windowed", key))]


async def test_an_outcome_the_key_holds_is_settled_from_the_key_with_the_tools_source_down(
    nats_url: str, client: LedgerClient, tmp_path: Path
) -> None:
    """Killed after the key's outcome, before the run's record of the effect: the resume takes the step
    as new, and must settle it from its key without asking the tool's source (a stopped MCP server)."""
    service = tmp_path / "service.log"
    run_id, key = "floor-source-down", "charge:floor-source-down:0"
    env = {"TEST_CALLS_LOG": str(service), "RUNLEDGER_CRASH_AT": f"effect:{key}:recorded"}
    crashed = runledger(nats_url, "run", "--agent", SPECS["step"], "--run-id", run_id, "--input", '{"rounds": 1}',
                        env=env)  # fmt: skip
    assert crashed.returncode == -9, crashed.stdout + crashed.stderr
    del env["RUNLEDGER_CRASH_AT"]
    resumed = runledger(nats_url, "resume", run_id, "--agent", "tests.agents:source_down_spec", env=env)
    assert resumed.returncode == 0 and "completed" in resumed.stdout, resumed.stdout + resumed.stderr
    assert [c["key"] for c in calls(service) if c["call"] == "charge"] == [key]
    cp = fold((await load_run(client, run_id, open_content=False)).records)
    assert cp.steps[8].status == "committed" and cp.committed_keys == [key]


@pytest.mark.parametrize("durability", ["step", "output"])
@pytest.mark.parametrize("point", ["claimed", "acted", "recorded"])
async def test_each_crash_point_leaves_the_table_s_state_and_resume_acts_once(
    point: str, durability: str, nats_url: str, client: LedgerClient, tmp_path: Path
) -> None:
    service = tmp_path / "service.log"
    run_id = f"floor-{durability}-{point}"
    key = f"charge:{run_id}:0"
    env = {"TEST_CALLS_LOG": str(service), "RUNLEDGER_CRASH_AT": f"effect:{key}:{point}"}
    spec = SPECS[durability]
    crashed = runledger(nats_url, "run", "--agent", spec, "--run-id", run_id, "--input", '{"rounds": 1}', env=env)
    assert crashed.returncode == -9, crashed.stdout + crashed.stderr

    run_types, key_events = await _stored(client, run_id, key)
    # The claim is the only write ahead of acting: the run holds nothing of the effect yet (in both
    # durabilities the steps before it were acknowledged before it acted).
    assert "effect.intended" not in run_types and run_types[-1] == "tool.called", run_types
    assert run_types.count("model.called") == 4 and run_types.count("tool.called") == 4, run_types
    assert [e["type"] for e in key_events] == (
        ["effect.intended"] if point != "recorded" else ["effect.intended", "effect.committed"]
    )
    claim = key_events[0]
    assert (claim["run_id"], claim["payload"]["step"], claim["payload"]["name"]) == (run_id, 8, "charge")
    assert len([c for c in calls(service) if c["call"] == "charge"]) == (0 if point == "claimed" else 1)

    del env["RUNLEDGER_CRASH_AT"]
    resumed = runledger(nats_url, "resume", run_id, "--agent", spec, env=env)
    assert resumed.returncode == 0 and "completed" in resumed.stdout, resumed.stdout + resumed.stderr
    assert [c["key"] for c in calls(service) if c["call"] == "charge"] == [key]  # exactly once
    run_types, key_events = await _stored(client, run_id, key)
    # The resume recorded the effect on the run: its intent, then its outcome, as the key has it.
    assert run_types[-3:] == ["effect.intended", "effect.committed", "run.completed"], run_types
    want = {"claimed": "effect.committed", "acted": "effect.resolved", "recorded": "effect.committed"}[point]
    assert key_events[-1]["type"] == want
    cp = fold((await load_run(client, run_id, open_content=False)).records)
    assert cp.steps[8].status == "committed" and cp.in_doubt_keys == [] and cp.committed_keys == [key]
    (verified,) = await verify_runs(client, run_id)
    assert verified.ok, verified.problems


async def test_a_run_that_moved_on_is_refused_its_next_effect_and_the_key_is_freed(client: LedgerClient) -> None:
    """Another process appended to the run (a resume elsewhere, a takeover): the fence check in flight
    with the claim refuses the effect before it acts, and the key is freed with an outcome that says
    nothing was done."""
    acted: list[Any] = []

    async def agent(run: Run) -> Any:
        await run.now()
        await append_to_run(client, run.run_id, BudgetGranted(turns=1, by="someone-else"))  # the run moves on
        return await run.effect("charge", 1, key="charge:moved-1", fn=lambda a: acted.append(a))

    spec = AgentSpec("floorfence", agent, ScriptedModel([]), agent_version="v1")
    with pytest.raises(FencedError):
        await start_run(client, spec, run_id="moved1")
    assert acted == []
    state = await read_key(client, "charge:moved-1", "floorfence")
    assert state.status == "failed" and state.error is not None and state.error["type"] == "FencedError"
    types = _types(await read_raw(client, "ledger.run.floorfence.moved1.*"))
    assert "effect.intended" not in types and "effect.failed" not in types, types


async def _old_protocol_run(client: LedgerClient, spec: AgentSpec, run_id: str, key: str, *, claim: bool) -> None:
    """A run as the previous protocol left it when its process died inside an effect: a clock step,
    then the effect's intent on the run (published before acting), and (``claim``) the key's claim."""

    args = {"amount": 5}
    digests: list[str] = []

    async def dies(run: Run) -> Any:
        await run.now()
        digests.append(run._digests.digest(args))  # type: ignore[attr-defined]  # the run's own (keyed) digest
        raise KeyboardInterrupt  # not an Exception: the run is left as it is, running

    with pytest.raises(KeyboardInterrupt):
        await start_run(client, AgentSpec(spec.name, dies, ScriptedModel([]), agent_version="v1"), run_id=run_id)
    log = await load_run(client, run_id, open_content=False)
    cp = fold(log.records)
    intent = EffectIntended(step=1, name="charge", key=key, args=args, args_digest=digests[0])
    writer = SubjectWriter(
        client.js, run_subject(spec.name, run_id), run_id=run_id, agent=spec.name, msg_id_prefix=run_id,
        next_seq=cp.next_seq, prev_hash=cp.last_hash, last_stream_seq=log.last_stream_seq,
        chain_format=cp.chain_format,
    )  # fmt: skip
    await writer.append(intent)
    if claim:
        await append_to_key(client, KeyState(key), intent, run_id=run_id, agent=spec.name, policy=RetryPolicy())


@pytest.mark.parametrize("claimed", [False, True], ids=["intent-only", "intent-and-claim"])
async def test_a_run_recorded_by_the_previous_protocol_resumes_and_acts_once(
    claimed: bool, client: LedgerClient
) -> None:
    acted: list[Any] = []
    key = f"charge:old-{claimed}"

    async def agent(run: Run) -> Any:
        await run.now()
        return await run.effect(
            "charge", {"amount": 5}, key=key, fn=lambda a: acted.append(a) or {"ok": True},
            reconcile=lambda k: NOT_FOUND,
        )  # fmt: skip

    spec = AgentSpec("floorold", agent, ScriptedModel([]), agent_version="v1")
    run_id = f"old-{claimed}"
    await _old_protocol_run(client, spec, run_id, key, claim=claimed)
    assert fold((await load_run(client, run_id, open_content=False)).records).in_doubt_keys == [key]

    result = await resume_run(client, spec, run_id)
    assert result.status == "completed" and result.output == {"ok": True}
    assert acted == [{"amount": 5}]
    types = _types(await read_raw(client, f"ledger.run.floorold.{run_id}.*"))
    assert types.count("effect.intended") == 1 and types[-2:] == ["effect.committed", "run.completed"], types
    (verified,) = await verify_runs(client, run_id)
    assert verified.ok, verified.problems
