"""Replay identity through a real run and a real resume: what an agent observes live is what it
observes after a resume, for any JSON value, in a run recorded as new runs are (chain format 2)
with its content sealed (the default ``DataPolicy``: encryption on), inline or by reference.

The agent reads its input, a tool's output and an effect's output, writes each as ``json.dumps``
text (no ``sort_keys``: how a value reaches a prompt), then waits for an approval; the resume
replays all three from the sealed record. The run's hash chain verifies in format 2. The same
property without NATS, value by value: tests/unit/test_replay_identity.py.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from runledger import AgentSpec, Run, ScriptedModel
from runledger.log.client import connect
from runledger.log.reader import read_raw
from runledger.log.subjects import any_agent_run_subject
from runledger.ops.decisions import approve
from runledger.ops.verify import verify_runs
from runledger.protect.capture import DataPolicy, is_blob_ref, is_sealed
from runledger.protect.loading import load_run
from runledger.record.canonical import JCS_CHAIN_FORMAT
from runledger.record.events import decode
from runledger.record.fold import fold
from runledger.sdk.lifecycle import resume_run, start_run
from tests.unit.test_replay_identity import DIFFERING, JSON

pytestmark = pytest.mark.integration
_runs = itertools.count()


async def _live_and_resumed(url: str, value: Any, by_reference: bool) -> tuple[list[str], list[str]]:
    observed: dict[str, list[str]] = {"live": [], "resumed": []}
    phase = ["live"]

    async def agent(run: Run) -> str:
        seen = observed[phase[0]]
        seen.append(json.dumps(run.input))
        out = await run.tool("echo", {"n": 1}, fn=lambda args: value)
        seen.append(json.dumps(out))
        done = await run.effect("store", {"n": 2}, key=f"store:{run.run_id}", fn=lambda args: value)
        seen.append(json.dumps(done))
        await run.approval("go", None)
        return seen[-1]

    # Sealed (encrypt=True, the default), by reference when every value is above the threshold.
    policy = DataPolicy("full", blob_threshold=0) if by_reference else DataPolicy("full")
    assert policy.encrypt
    spec = AgentSpec("identity", agent, ScriptedModel([]), agent_version="1", data_policy=policy)
    run_id = f"id-{next(_runs)}"
    client = await connect(url)
    try:
        first = await start_run(client, spec, value, run_id=run_id)
        assert first.status == "suspended", first
        await approve(client, run_id, first.pending[0], by="op")
        phase[0] = "resumed"
        resumed = await resume_run(client, spec, run_id)
        assert resumed.status == "completed", resumed
        assert resumed.output == observed["live"][-1]

        # Recorded as new runs are, sealed, and the chain verifies in the run's format.
        cp = fold((await load_run(client, run_id, open_content=False)).records)
        assert cp.chain_format == JCS_CHAIN_FORMAT
        verified = await verify_runs(client, run_id)
        assert [(v.ok, v.chain_format) for v in verified] == [(True, JCS_CHAIN_FORMAT)], verified
        sealed = 0
        for raw in await read_raw(client, any_agent_run_subject(run_id)):
            p = decode(raw.data).payload
            for field in ("input", "output"):
                if p.get(field) is not None:
                    assert is_sealed(p[field]) or (is_blob_ref(p[field]) and p[field].get("enc")), p
                    sealed += 1
        assert sealed >= (3 if value is not None else 0)
    finally:
        await client.close()
    return observed["live"], observed["resumed"]


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(value=JSON, by_reference=st.booleans())
@example(value=DIFFERING, by_reference=False)
@example(value=DIFFERING, by_reference=True)
def test_a_resume_observes_what_the_live_run_observed(nats_url: str, value: Any, by_reference: bool) -> None:
    live, resumed = asyncio.run(_live_and_resumed(nats_url, value, by_reference))
    assert len(live) == 3 and live == resumed
