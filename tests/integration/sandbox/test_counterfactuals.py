"""Counterfactuals on each of the four version-tuple elements, forked at step 0 and at a later step,
in real Docker sandboxes: the prefix before the fork is the parent's record whatever changed, the change
acts from the fork on, and the model's own log (``tests/sandbox_agents/counterfactual``) shows it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runledger.log.client import LedgerClient
from runledger.protect.keystore import KVKeyStore, run_kid
from runledger.protect.loading import load_run
from runledger.record.digests import Digester
from runledger.record.fold import Checkpoint, fold
from runledger.sandbox.diff import diff
from runledger.sandbox.rerun import Rerunner, RerunRequest
from runledger.sdk.lifecycle import start_run
from tests.sandbox_agents.counterfactual import agent as cf

pytestmark = [pytest.mark.integration, pytest.mark.docker]
CF = "tests.sandbox_agents.counterfactual.agent"
AGENT = f"{CF}:spec"
NEW_PROMPT = "Answer in French."
MODEL_STEPS = (0, 2, 4)  # step 0 model, 1 lookup, 2 model, 3 lookup, 4 model, 5 lookup

# element -> (the --set, the version-tuple element it changes)
CHANGES: dict[str, tuple[dict[str, str], str]] = {
    "model": ({"model": f"{CF}:other_model"}, "model"),
    "prompt": ({"prompt": NEW_PROMPT}, "prompt_hash"),
    "agent": ({"agent": "tests.sandbox_agents.counterfactual.changed.agent:spec"}, "agent_version"),
    "tools": ({"tools": f"{CF}:CLEARER_TOOLS"}, "tool_schema_hashes"),
    "tool description": ({"tools": f"{CF}:REWORDED_TOOLS"}, "tool_schema_hashes"),
}


def carries(element: str, request: dict[str, Any]) -> bool:
    """Whether a request the model received carries the change of ``element``."""
    described = request["params"]["tools"][0]["function"]
    if element == "model":
        return bool(request["model"] == "witness-2")
    if element == "prompt":
        return bool(request["messages"][0]["content"] == NEW_PROMPT)
    if element == "agent":
        return bool(request["messages"][1]["content"].endswith("(v2)"))
    if element == "tools":
        return described["description"] == cf.NEW_DESCRIPTION and described["parameters"] == cf.NEW_PARAMETERS
    return described["description"] == cf.NEW_DESCRIPTION and described["parameters"] != cf.NEW_PARAMETERS


async def folded(client: LedgerClient, run_id: str) -> Checkpoint:
    return fold((await load_run(client, run_id)).records)


@pytest.fixture(autouse=True)
def fresh_witness() -> None:
    cf.reset()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fork", [0, 2])
@pytest.mark.parametrize("element", list(CHANGES))
async def test_a_counterfactual_changes_its_element_from_the_fork_and_serves_the_prefix_from_the_record(
    client: LedgerClient, rerunner: Rerunner, element: str, fork: int
) -> None:
    run_id = f"cf-{element.replace(' ', '-')}-{fork}"
    parent = await start_run(client, cf.spec(), None, run_id=run_id)
    assert parent.status == "completed", parent.error
    assert len(cf.REQUESTS) == 3 and not any(carries(element, r) for r in cf.REQUESTS)
    sent = len(cf.REQUESTS)
    change, field = CHANGES[element]
    request = RerunRequest(parent_run_id=run_id, agent=AGENT, mode="counterfactual", fork_step=fork, change=change)
    result = await rerunner.rerun(request)
    assert result.status == "completed", result.error

    # The witness, the model's own log: it was sent the model calls from the fork on, each carrying the
    # change, and nothing before the fork (served from the record, whatever the change does to them).
    received = cf.REQUESTS[sent:]
    wanted = [s for s in MODEL_STEPS if s >= fork]
    assert [r["messages"][1]["content"].split(" (")[0] for r in received] == [f"question {s // 2}" for s in wanted]
    assert all(carries(element, r) for r in received), received

    # The branch is its parent before the fork, step by step, and differs from the fork on.
    p_cp, b_cp = await folded(client, run_id), await folded(client, result.run_id)
    for s in range(fork):
        was, now = p_cp.steps[s], b_cp.steps[s]
        assert (now.kind, now.name, now.status, now.output) == (was.kind, was.name, was.status, was.output), s
    assert b_cp.parent is not None and b_cp.parent["changed"] == field
    d = await diff(client, run_id, result.run_id)
    assert d.changed == field and d.first_difference == fork
    assert result.output["code"] == ("v2" if element == "agent" else "v1")


@pytest.mark.timeout(120)
async def test_a_changed_agent_that_leaves_the_record_before_the_fork_names_the_step_the_record_and_the_call(
    client: LedgerClient, rerunner: Rerunner
) -> None:
    await start_run(client, cf.spec(), None, run_id="cf-leaves")
    sent = len(cf.REQUESTS)
    result = await rerunner.rerun(RerunRequest(
        parent_run_id="cf-leaves", agent=AGENT, mode="counterfactual", fork_step=2,
        change={"agent": "tests.sandbox_agents.counterfactual.diverging.agent:spec"},
    ))  # fmt: skip
    assert (result.status, result.reason) == ("failed", "nondeterminism"), result
    error = result.error or ""
    assert f"branch {result.run_id} step 1, before its fork at step 2" in error
    # Both digests the parent's way (under the parent's digest key), so they compare.
    parent = fold((await load_run(client, "cf-leaves")).records)
    keys = await KVKeyStore(client.js).get(run_kid(parent.agent, "cf-leaves"))
    assert keys is not None
    theirs = Digester(parent.chain_format, parent.digest_scheme, keys.digest_key)
    assert f"the parent's record has tool 'lookup' (args {theirs.digest({'q': 'a'})[:12]})" in error
    assert f"the branch's agent called tool 'lookup' (args {theirs.digest({'q': 'z'})[:12]})" in error
    assert "The branch changes agent_version" in error and "The version tuple is the recorded one" not in error
    assert len(cf.REQUESTS) == sent  # step 0 was served from the record: the model was sent nothing


@pytest.mark.timeout(120)
async def test_a_model_counterfactual_stopped_after_its_prefix_resumes_on_redelivery(
    client: LedgerClient, rerunner: Rerunner
) -> None:
    # The branch's steps before the fork hold the parent's model answers, recorded under the parent's
    # model's name; a redelivered request replays them by position as they were served, whatever model
    # the branch calls from the fork (before the fix: nondeterminism at step 0, "model 'witness-1'").
    await start_run(client, cf.spec(), None, run_id="cf-again")
    request = RerunRequest(parent_run_id="cf-again", agent=AGENT, mode="counterfactual", fork_step=2,
                           change={"model": f"{CF}:other_model"})  # fmt: skip
    sent = len(cf.REQUESTS)
    cf.HOLD.append(asyncio.Event())  # the model's first call in the branch (step 2) never returns
    first = asyncio.create_task(rerunner.rerun(request))
    for _ in range(600):
        if len(cf.REQUESTS) > sent or first.done():
            break
        await asyncio.sleep(0.05)
    assert len(cf.REQUESTS) == sent + 1 and not first.done()
    first.cancel()  # the worker stops: the request stays queued, its branch running
    with pytest.raises(asyncio.CancelledError):
        await first
    stopped = await folded(client, request.branch_run_id)
    assert stopped.status == "running" and sorted(stopped.steps) == [0, 1]
    cf.HOLD.clear()
    again = await rerunner.rerun(request)  # redelivered
    assert again.status == "completed", again.error
    assert [r["model"] for r in cf.REQUESTS[sent + 1 :]] == ["witness-2", "witness-2"]  # steps 2 and 4, anew
    b_cp = await folded(client, again.run_id)
    assert b_cp.steps[0].name == "witness-1" and b_cp.steps[2].name == "witness-2"
