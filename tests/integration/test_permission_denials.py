"""Permission denials under ``up --secure`` surface at once, naming the role, the subject and what
is needed: the server's refusal reaches only the connection's error callback (runledger.log.permissions),
where a publish used to wait for its retry bound and then advise waiting for the server."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from runledger import AgentSpec, Run, ScriptedModel
from runledger.cli import main
from runledger.errors import PermissionDeniedError
from runledger.log.client import connect
from runledger.log.server import ServerState
from runledger.sdk.lifecycle import start_run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def spec(name: str) -> AgentSpec:
    async def agent(run: Run) -> Any:
        await run.approval("ship", {"n": 1})
        return "shipped"

    return AgentSpec(name, agent, ScriptedModel([]), agent_version="v1")


async def test_an_analysts_approve_is_refused_at_once_naming_role_subject_and_who_may(
    secure_server: ServerState, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = secure_server.creds_dir
    admin = await connect(secure_server.url, user_credentials=f"{folder}/admin.json")  # creates the streams
    alpha = await connect(secure_server.url, user_credentials=f"{folder}/agent-alpha.json")
    try:
        waiting = await start_run(alpha, spec("alpha"), run_id="ship-1")
        assert waiting.status == "suspended"
        (request,) = waiting.pending
    finally:
        await alpha.close()
        await admin.close()
    capsys.readouterr()
    started = time.monotonic()
    code = await asyncio.to_thread(
        main, ["approve", "ship-1", request, "--by", "ann", "--nats", secure_server.url,
               "--creds", f"{folder}/analyst.json"],
    )  # fmt: skip
    took = time.monotonic() - started
    assert code == 6  # Exit.REFUSED
    assert capsys.readouterr().err == (
        "runledger: error: permission denied: the analyst credentials may not publish to ledger.run.alpha.ship-1.o, "
        "and nothing was recorded; approvals, budget grants, accepted versions and retries are an operator's "
        f"decisions: connect with the operator's credentials, --creds {folder}/operator.json (or RUNLEDGER_CREDS)\n"
    )
    assert took < 5, f"the denial took {took:.1f}s"  # it took 32 s, then advised waiting for the server


async def test_one_agents_credentials_used_for_another_agent_say_whose_they_are(secure_server: ServerState) -> None:
    folder = secure_server.creds_dir
    admin = await connect(secure_server.url, user_credentials=f"{folder}/admin.json")
    alpha = await connect(secure_server.url, user_credentials=f"{folder}/agent-alpha.json")
    try:
        started = time.monotonic()
        with pytest.raises(PermissionDeniedError) as refused:
            await start_run(alpha, spec("beta"), run_id="beta-1")
        took = time.monotonic() - started
    finally:
        await alpha.close()
        await admin.close()
    assert str(refused.value) == (
        "permission denied: the agent 'alpha' credentials may not publish to $KV.LEDGER_KEYS.beta.beta-1, and "
        "nothing was recorded; only agent 'beta' creates the keys of its runs: run agent 'beta' with its own "
        f"credentials, --creds {folder}/agent-beta.json (or RUNLEDGER_CREDS) (`runledger up --secure --agent beta` "
        "makes them)"
    )
    assert took < 5, f"the denial took {took:.1f}s"  # it said "cannot create the keys ... (TimeoutError)"


async def test_a_denied_window_of_an_output_durability_run_fails_at_once(secure_server: ServerState) -> None:
    from runledger.protect.capture import DataPolicy

    folder = secure_server.creds_dir
    admin = await connect(secure_server.url, user_credentials=f"{folder}/admin.json")
    alpha = await connect(secure_server.url, user_credentials=f"{folder}/agent-alpha.json")
    # Unsealed (no run keys to create): the first thing it writes is its window, on beta's run.
    beta = AgentSpec("beta", spec("beta").fn, ScriptedModel([]), agent_version="v1", durability="output",
                     data_policy=DataPolicy("full", encrypt=False))  # fmt: skip
    try:
        started = time.monotonic()
        with pytest.raises(PermissionDeniedError) as refused:
            await start_run(alpha, beta, run_id="beta-2")
        took = time.monotonic() - started
    finally:
        await alpha.close()
        await admin.close()
    assert str(refused.value) == (
        "permission denied: the agent 'alpha' credentials may not publish to ledger.run.beta.beta-2.a, and nothing "
        f"was recorded; only agent 'beta' writes its runs: connect with its credentials, --creds "
        f"{folder}/agent-beta.json (or RUNLEDGER_CREDS)"
    )
    assert took < 5, f"the denial took {took:.1f}s"
