"""``runledger.integrations.pydantic_ai`` against a real nats-server: a Pydantic AI agent
(tests/pydantic_ai_shop.py, Pydantic AI's own ``FunctionModel``) run by ``runledger run`` in a process
of its own, SIGKILLed at every step boundary (a named crash point: after a model request or a tool
call was recorded), then resumed by ``runledger resume``. The witnesses are files the agent
processes wrote: the model function's answered calls and the tools' own log. Across the kill and the
resume, each model call and each tool call happened exactly once. Killed from outside at a random
moment instead, the resume repeats at most the one call that was in flight, and the refund (an
effect) happens once."""

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

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

AGENT = "tests.pydantic_ai_shop:spec"
# The same agent called with Pydantic AI's blocking agent.run_sync() from a blocking agent function.
SYNC_AGENT = "tests.pydantic_ai_shop:sync_spec"
# Steps: 0 model, 1 lookup (ModelRetry), 2 model, 3 lookup, 4 model, 5 refund (an effect), 6 model.
MODEL_CALLS = ["1", "3", "5", "7"]  # each answered model call: the length of the history it was given
TOOL_CALLS = ["lookup o-1", "lookup o-1", "refund o-1"]


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# Where the agent process SIGKILLs itself (runledger.sdk.crashpoints), and how many model and tool
# calls it made by then: after each step up to the refund, after the refund acted (its outcome not
# recorded: the resume asks its reconcile) and after the refund's outcome was on its key (the
# effect's copy on the run not yet written).
KILLS = [
    ("step:0:recorded", 1, 0),
    ("step:1:recorded", 1, 1),
    ("step:2:recorded", 2, 1),
    ("step:3:recorded", 2, 2),
    ("step:4:recorded", 3, 2),
    ("effect:refund:o-1:acted", 3, 3),  # in doubt: the refund's reconcile finds it done
    ("effect:refund:o-1:recorded", 3, 3),
]


@pytest.mark.parametrize(
    ("agent", "crash_at", "models", "tools"),
    [(AGENT, *kill) for kill in KILLS] + [(SYNC_AGENT, *KILLS[2]), (SYNC_AGENT, *KILLS[5])],
)
async def test_an_agent_killed_between_calls_resumes_without_repeating_one(
    nats_url: str, client: LedgerClient, tmp_path: Path, agent: str, crash_at: str, models: int, tools: int
) -> None:
    log = tmp_path / "witness"
    log.mkdir()
    env = {"PYAI_SHOP_LOG": str(log)}
    run_id = "pyai-kill-" + crash_at.replace(":", "-")
    crashed = await asyncio.to_thread(
        runledger, nats_url, "run", "--agent", agent, "--run-id", run_id, "--input", json.dumps("refund o-1"),
        env={**env, "RUNLEDGER_CRASH_AT": crash_at},
    )  # fmt: skip
    assert crashed.returncode == -9, f"expected a SIGKILL at {crash_at}: {crashed.stdout}{crashed.stderr}"
    # The process died right after the step was recorded: the calls up to it, and no more.
    assert lines(log / "model.log") == MODEL_CALLS[:models]
    assert lines(log / "tools.log") == TOOL_CALLS[:tools]
    assert fold((await load_run(client, run_id)).records).status == "running"

    resumed = await asyncio.to_thread(runledger, nats_url, "resume", run_id, "--agent", agent, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert f"run {run_id}: completed" in resumed.stdout, resumed.stdout
    assert lines(log / "model.log") == MODEL_CALLS, "a model call was repeated (or lost) across the kill"
    assert lines(log / "tools.log") == TOOL_CALLS, "a tool call was repeated (or lost) across the kill"

    cp = fold((await load_run(client, run_id)).records)
    assert cp.status == "completed"
    assert cp.output == "done: refunded 5 on o-1"
    assert cp.committed_keys == ["refund:o-1"]
    assert [cp.steps[s].kind for s in sorted(cp.steps)] == [
        "model",
        "tool",
        "model",
        "tool",
        "model",
        "effect",
        "model",
    ]


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_an_agent_killed_at_a_random_moment_resumes_repeating_at_most_the_call_in_flight(
    nats_url: str, client: LedgerClient, tmp_path: Path, seed: int
) -> None:
    """SIGKILL from outside, at a random moment after the model's k-th answer (each call takes 0.3 s, so
    the run still has calls to make): a resume
    repeats at most the one call that was in flight (answered, not yet recorded), and the refund, an
    effect, happens exactly once (its reconcile answers when the kill came between act and record)."""
    log = tmp_path / "witness"
    log.mkdir()
    env = {"PYAI_SHOP_LOG": str(log), "PYAI_SHOP_DELAY_S": "0.3"}
    run_id = f"pyai-random-{seed}"
    rng = random.Random(seed)
    answered, moment = rng.randint(1, 3), rng.uniform(0.0, 0.6)  # within the calls after the k-th answer
    agent = start_agent(nats_url, AGENT, run_id, json.dumps("refund o-1"), env)
    try:
        await eventually(lambda: len(lines(log / "model.log")) >= answered, timeout=60)
        await asyncio.sleep(moment)
        agent.send_signal(signal.SIGKILL)
    finally:
        agent.wait(timeout=30)
    assert agent.returncode == -9, "the agent ended before the kill"

    resumed = await asyncio.to_thread(runledger, nats_url, "resume", run_id, "--agent", AGENT, env=env)
    assert resumed.returncode == 0, resumed.stderr
    cp = fold((await load_run(client, run_id)).records)
    assert cp.status == "completed", resumed.stdout
    assert cp.output == "done: refunded 5 on o-1"
    models, tools = lines(log / "model.log"), lines(log / "tools.log")
    repeated = [c for c in set(models) if models.count(c) > 1] + [c for c in set(tools) if tools.count(c) > 2]
    assert len(models) - len(set(models)) <= 1, f"more than the call in flight was repeated: {models}"
    assert tools.count("refund o-1") == 1, tools
    assert len(repeated) <= 1, (models, tools)
