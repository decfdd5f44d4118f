"""Ordinary agent code: parallel steps in one run, and replay that returns what live returned.

The agent (tests.agents:ordinary) asks for 8 lookups in one model turn, puts their results
into the next prompt with ``json.dumps`` (no ``sort_keys``) and runs two effects at once.
Crashes are SIGKILLs at random moments of a subprocess, not named points.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from runledger import AgentSpec, Run, ScriptedModel
from runledger.log.client import LedgerClient
from runledger.ops.verify import verify_runs
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from runledger.sdk.lifecycle import resume_run, start_run
from tests.agents import calls, ordinary_spec

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
AGENT = "tests.agents:ordinary_spec"


async def test_eight_parallel_tool_calls_and_two_parallel_effects(
    client: LedgerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_CALLS_LOG", str(tmp_path / "calls.log"))
    monkeypatch.setenv("TEST_TOOL_DELAY", "0.02")
    result = await start_run(client, ordinary_spec(), {"order": "o-1"}, run_id="par-1")
    assert result.status == "completed", result
    cp = fold((await load_run(client, "par-1")).records)
    kinds = [(s.kind, s.name) for _, s in sorted(cp.steps.items())]
    assert kinds == [("model", "scripted-ordinary")] + [("tool", "lookup")] * 8 + [("model", "scripted-ordinary")] + [
        ("effect", "charge"),
        ("effect", "notify"),
    ]
    # Each lookup step holds the result of its own call (steps are numbered in call order).
    assert [cp.steps[k].output["zeta"] for k in range(1, 9)] == [s * 3 for s in range(8)]
    assert sorted(c["call"] for c in calls(tmp_path / "calls.log")) == ["charge", "notify"]
    assert all(r.ok for r in await verify_runs(client, "par-1"))


async def test_a_resume_returns_what_live_returned_in_key_order(client: LedgerClient) -> None:
    """Live and replayed values are the same, compared as text without sort_keys."""
    seen: dict[str, list[str]] = {"live": [], "replay": []}
    phase = ["live"]

    def tool(args: Any) -> Any:
        return {"z": 1, "a": {"y": 2.0, "b": [3, {"q": None, "c": "x"}]}, "m": 1e16, "k": 1e-07}

    async def agent(run: Run) -> str:
        out = await run.tool("t", {"b": 1, "a": 2}, fn=tool)
        seen[phase[0]].append(json.dumps(out) + json.dumps(run.input))
        reply = await run.model([{"role": "user", "content": json.dumps(out)}])
        await run.approval("go", {"text": reply.content})
        return reply.content

    spec = AgentSpec("ordered", agent, ScriptedModel(lambda m: "ok:" + str(m[-1]["content"])), agent_version="v1")
    first = await start_run(client, spec, {"zz": 1, "aa": [2, {"d": 1, "c": 2}]}, run_id="ord-1")
    assert first.status == "suspended"
    from runledger.ops.decisions import approve

    await approve(client, "ord-1", first.pending[0], by="op")
    phase[0] = "replay"
    second = await resume_run(client, spec, "ord-1")
    assert second.status == "completed", second
    assert seen["live"] == seen["replay"]


def _cli(url: str, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "runledger", *args],
        cwd=ROOT,
        env={**os.environ, "RUNLEDGER_NATS_URL": url, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _checkpoint(url: str, run_id: str) -> dict[str, Any] | None:
    shown = subprocess.run(
        [sys.executable, "-m", "runledger", "checkpoint", run_id, "--json"],
        cwd=ROOT, env={**os.environ, "RUNLEDGER_NATS_URL": url}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if shown.returncode != 0:
        assert "no run" in shown.stderr, shown.stderr
        return None
    result: dict[str, Any] = json.loads(shown.stdout)
    return result


def _finish(url: str, run_id: str, env: dict[str, str]) -> dict[str, Any]:
    """Resume until the run ends (start it again if the kill came before its first event)."""
    err = ""
    for _ in range(5):
        cp = _checkpoint(url, run_id)
        if cp is not None and cp["status"] in ("completed", "failed"):
            return cp
        args = ("resume", run_id, "--agent", AGENT) if cp is not None else (
            "run", "--agent", AGENT, "--run-id", run_id, "--input", '{"order": "ref"}')  # fmt: skip
        _, err = _cli(url, *args, env=env).communicate(timeout=60)
    raise AssertionError(f"{run_id} did not finish: {_checkpoint(url, run_id)} {err}")


@pytest.mark.timeout(600)
def test_random_sigkills_of_parallel_steps_resume_to_the_same_result(nats_url: str, tmp_path: Path) -> None:
    rounds = int(os.environ.get("RUNLEDGER_PARALLEL_CRASH_ROUNDS", "50"))
    rng = random.Random(int(os.environ.get("RUNLEDGER_TEST_SEED", "0")) or None)
    # The reference: one uncrashed run, timed to draw the kill moments from.
    ref_log = tmp_path / "ref.log"
    env = {"TEST_CALLS_LOG": str(ref_log), "TEST_TOOL_DELAY": "0.05"}
    started = time.monotonic()
    proc = _cli(nats_url, "run", "--agent", AGENT, "--run-id", "ref", "--input", '{"order": "ref"}', env=env)
    _, err = proc.communicate(timeout=60)
    duration = time.monotonic() - started
    assert proc.returncode == 0, err
    reference = _checkpoint(nats_url, "ref")
    assert reference is not None and reference["status"] == "completed"
    killed = 0
    for i in range(rounds):
        run_id = f"crash-{i}"
        log = tmp_path / f"{run_id}.log"
        env = {"TEST_CALLS_LOG": str(log), "TEST_TOOL_DELAY": "0.05"}
        proc = _cli(nats_url, "run", "--agent", AGENT, "--run-id", run_id, "--input", '{"order": "ref"}', env=env)
        time.sleep(rng.uniform(0.0, duration))
        if proc.poll() is None:
            proc.kill()
            killed += 1
        proc.communicate(timeout=60)
        cp = _finish(nats_url, run_id, env)
        assert cp["status"] == "completed", (run_id, cp)
        # Same final state as the uncrashed run: the same decision from the same prompt text.
        assert cp["output"] == reference["output"], run_id
        by_name: dict[str, int] = {}
        for c in calls(log):
            by_name[c["call"]] = by_name.get(c["call"], 0) + 1
        assert by_name == {"charge": 1, "notify": 1}, (run_id, by_name)
    assert killed > 0, "no round was killed mid-run: the kill moments are drawn from the run's duration"

    async def verify() -> None:
        from runledger.log.client import connect

        async with await connect(nats_url) as client:
            results = await verify_runs(client)
            assert results and all(r.ok for r in results), [r for r in results if not r.ok]

    asyncio.run(verify())


async def test_eight_tool_calls_are_in_flight_at_once(client: LedgerClient) -> None:
    """Eight parallel calls of one tool meet at a barrier of eight: an SDK that ran them one at a time
    (under one lock, say) would leave the first waiting there alone, and the run would fail."""
    barrier = asyncio.Barrier(8)
    met: list[int] = []

    async def lookup(shard: int) -> dict[str, int]:
        async with asyncio.timeout(10):
            await barrier.wait()
        met.append(shard)
        return {"shard": shard}

    async def agent(run: Run) -> list[Any]:
        return list(await asyncio.gather(*(run.tool("lookup", {"shard": s}, fn=lookup) for s in range(8))))

    spec = AgentSpec("barrier", agent, ScriptedModel([]), agent_version="v1")
    result = await start_run(client, spec, {}, run_id="par-barrier")
    assert result.status == "completed", result
    assert sorted(met) == list(range(8))
    assert [r["shard"] for r in result.output] == list(range(8))  # each step holds its own call's result
