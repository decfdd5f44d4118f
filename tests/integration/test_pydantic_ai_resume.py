"""Pydantic AI resumes whatever order a provider's argument dicts come in: agents written as users
write them (tests/pydantic_ai_counter.py: a ``FunctionModel`` whose tool calls' argument dicts are not
in alphabetical order and hold whole-number floats, Pydantic AI's own ``TestModel``, and the shipped
example), each run by ``runledger run`` in a process of its own, SIGKILLed at a random moment (or, for
the example, which has no delay to kill inside, at a named step boundary), then resumed by
``runledger resume``. Every trial completes, and the charge (an effect) happened once: the tools' own
log is the witness. Before the rule that live hands the agent the reply the record keeps, a resume
whose journal held a model request made after an unsorted tool call was refused as nondeterminism."""

from __future__ import annotations

import asyncio
import json
import random
import signal
from pathlib import Path

import pytest

from runledger import LedgerClient, load_run
from runledger.record.fold import fold
from tests.conftest import eventually
from tests.integration.processes import runledger, start_agent

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

DELAY_S = 0.25  # each tool call takes this long: a kill lands inside a run, not after it
AGENTS = {
    "function": "tests.pydantic_ai_counter:function_spec",
    "testmodel": "tests.pydantic_ai_counter:testmodel_spec",
}


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("model", sorted(AGENTS))
async def test_a_run_killed_at_a_random_moment_resumes_and_charges_once(
    nats_url: str, client: LedgerClient, tmp_path: Path, model: str, seed: int
) -> None:
    log = tmp_path / "witness"
    log.mkdir()
    env = {"PYAI_COUNTER_LOG": str(log), "PYAI_COUNTER_DELAY_S": str(DELAY_S)}
    run_id = f"pyai-{model}-{seed}"
    rng = random.Random(seed)
    # After the k-th tool execution (its log line is written as it returns), within the next one.
    executed, moment = rng.randint(1, 2), rng.uniform(0.0, DELAY_S)
    agent = start_agent(nats_url, AGENTS[model], run_id, json.dumps("count, charge, count"), env)
    try:
        await eventually(lambda: len(lines(log / "tools.log")) >= executed or agent.poll() is not None, timeout=60)
        await asyncio.sleep(moment)
        agent.send_signal(signal.SIGKILL)
    finally:
        agent.wait(timeout=30)
    assert agent.returncode == -9, f"the agent ended before the kill: {agent.stderr.read() if agent.stderr else ''}"

    resumed = await asyncio.to_thread(runledger, nats_url, "resume", run_id, "--agent", AGENTS[model], env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    cp = fold((await load_run(client, run_id)).records)
    assert cp.status == "completed", resumed.stdout + resumed.stderr
    tools = lines(log / "tools.log")
    charges = [t for t in tools if t.startswith("charge ")]
    assert len(charges) == 1, f"the charge happened {len(charges)} times: {tools}"
    assert len(cp.committed_keys) == 1, cp.committed_keys
    assert len(tools) - len(set(tools)) <= 1, f"more than the call in flight was repeated: {tools}"


# The shipped example's step boundaries: after each model request and tool call was recorded, and after
# the refund's outcome was on its key (its copy on the run not yet written).
EXAMPLE = "runledger.examples.pydantic_ai_support.agent:spec"
EXAMPLE_KILLS = [*(f"step:{k}:recorded" for k in range(5)), "effect:refund:order-8891:recorded"]


@pytest.mark.parametrize("crash_at", EXAMPLE_KILLS)
async def test_the_shipped_example_killed_at_each_step_resumes(
    nats_url: str, client: LedgerClient, crash_at: str
) -> None:
    run_id = "pyai-example-" + crash_at.replace(":", "-")
    question = json.dumps("Refund order-8891, it arrived broken.")
    crashed = await asyncio.to_thread(
        runledger, nats_url, "run", "--agent", EXAMPLE, "--run-id", run_id, "--input", question,
        env={"RUNLEDGER_CRASH_AT": crash_at},
    )  # fmt: skip
    assert crashed.returncode == -9, f"expected a SIGKILL at {crash_at}: {crashed.stdout}{crashed.stderr}"
    resumed = await asyncio.to_thread(runledger, nats_url, "resume", run_id, "--agent", EXAMPLE)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    log = await load_run(client, run_id)
    cp = fold(log.records)
    assert cp.status == "completed", resumed.stdout + resumed.stderr
    assert cp.committed_keys == ["refund:order-8891"]
    assert [cp.steps[s].kind for s in sorted(cp.steps)] == ["model", "tool", "model", "effect", "model"]
    assert sum(1 for r in log.records if r.event.type == "effect.intended") == 1, "the refund was claimed again"


async def test_an_effect_in_doubt_is_settled_with_the_tools_plain_return_value(
    nats_url: str, client: LedgerClient, tmp_path: Path
) -> None:
    """Killed after the charge acted, with no reconcile: the resume stops on the effect in doubt; an
    operator settles it with the tool's plain return value (what the charge returned, as JSON), and the
    resumed agent hands it to the model as the tool's return (before, the model got a validation error
    as the tool's result and the run "completed" with it)."""
    log = tmp_path / "witness"
    log.mkdir()
    env = {"PYAI_COUNTER_LOG": str(log), "PYAI_COUNTER_NO_RECONCILE": "1"}
    agent, run_id = AGENTS["function"], "pyai-resolve"
    crashed = await asyncio.to_thread(
        runledger, nats_url, "run", "--agent", agent, "--run-id", run_id, "--input", json.dumps("charge"),
        env={**env, "RUNLEDGER_CRASH_AT": "effect:charge:o-1:acted"},
    )  # fmt: skip
    assert crashed.returncode == -9, crashed.stdout + crashed.stderr
    waiting = await asyncio.to_thread(runledger, nats_url, "resume", run_id, "--agent", agent, env=env)
    assert fold((await load_run(client, run_id)).records).status == "suspended", waiting.stdout + waiting.stderr

    result = json.dumps({"order": "o-1", "charged": 30, "currency": "EUR"})
    settled = await asyncio.to_thread(
        runledger, nats_url, "effects", "resolve", "charge:o-1", "--committed", "--by", "alice", "--result", result
    )
    assert settled.returncode == 0, settled.stdout + settled.stderr
    resumed = await asyncio.to_thread(runledger, nats_url, "resume", run_id, "--agent", agent, env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    log_of_run = await load_run(client, run_id)
    cp = fold(log_of_run.records)
    assert cp.status == "completed"
    # The model's next request carries the charge's return as the tool's return, not an error.
    requests = [r.event.payload.get("request") for r in log_of_run.records if r.event.type == "model.called"]
    returned = [m for m in requests[2]["messages"] if m.get("role") == "tool"][-1]
    assert json.loads(returned["content"]) == {"order": "o-1", "charged": 30, "currency": "EUR"}, returned
    assert [t.split(" ")[0] for t in lines(log / "tools.log")].count("charge") == 1
