"""Regression tests from a fix, in the test process (runledger.testing), on the in-memory ledger.

The fix's branch (a prompt counterfactual re-driven live at the decision, through the real ``Rerunner``,
broker and guest, the guest in this process) is exported and replays clean against the code that produced
it, its simulated booking included. The original failures replay as the seed's deterministic re-drive: the
model live from the decision, everything else from the record, so a prompt fix is exercised in a plain
pytest run (the fixed prompt completes where the old one fails again), and a candidate that would need a
live tool or effect is refused, never run."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from runledger.log.client import LedgerClient
from runledger.log.memory import MemoryLedger
from runledger.sandbox.rerun import Rerunner, RerunRequest
from runledger.sdk.agent import CodeAllowList
from runledger.sdk.lifecycle import start_run
from runledger.testing import Replayer, read_recordings
from runledger.testing.export import export_runs
from tests import tripbot
from tests.run_contract import InProcessPool

REPO = Path(__file__).resolve().parents[2]
CURRENCY, LONG_STAY = 14, 3  # trip 14 is in Bern (a franc quote); trip 3 stays 10 nights


@pytest.fixture
async def client() -> AsyncIterator[LedgerClient]:
    client = await MemoryLedger().connect()
    yield client
    await client.close()


async def _failure(client: LedgerClient, n: int, cause: str) -> str:
    t = tripbot.trip(n)
    assert tripbot.cause(t) == cause, t
    result = await start_run(client, tripbot.spec(), t, run_id=f"trip-{n}")
    assert result.status == "failed", result
    return result.run_id


async def test_the_fixs_exported_branch_replays_clean_simulated_effect_included(
    client: LedgerClient, tmp_path: Path
) -> None:
    run_id = await _failure(client, CURRENCY, "currency")
    request = RerunRequest(
        parent_run_id=run_id, agent="tests.tripbot:spec", mode="counterfactual", base_mode="live", fork_step=2,
        change={"prompt": tripbot.FIXED_PROMPT},
    )  # fmt: skip
    tripbot.BOOKED.clear()
    result = await Rerunner(client, InProcessPool(str(tmp_path)), allowed=CodeAllowList((".", "tests"))).rerun(request)
    assert result.status == "completed", result
    assert tripbot.BOOKED == []  # the booking was simulated: a live branch books nothing new
    await export_runs(client, [result.run_id], tmp_path / "fix.jsonl")
    (recording,) = read_recordings(tmp_path / "fix.jsonl")
    assert "effect.simulated" in [r.event.type for r in recording.records]

    fixed = await Replayer(tripbot.fixed_spec()).replay(recording)
    assert fixed.ok, str(fixed)
    assert fixed.replayed == "completed" and fixed.steps == 5
    assert "CHF" in fixed.output["confirmation"]
    # The code before the fix asks the model otherwise at the fork (before it, as in the branch, the model's
    # answers are the record's whatever the prompt): named there, not at the booking.
    before = await Replayer(tripbot.spec()).replay(recording)
    assert not before.ok and before.divergence is not None and before.divergence.step == 2, str(before)
    assert tripbot.BOOKED == []


async def test_a_prompt_fix_is_exercised_with_the_model_live_from_the_decision(
    client: LedgerClient, tmp_path: Path
) -> None:
    run_id = await _failure(client, LONG_STAY, "long stay")
    await export_runs(client, [run_id], tmp_path / "failure.jsonl")
    (recording,) = read_recordings(tmp_path / "failure.jsonl")
    tripbot.BOOKED.clear()

    # As recorded, the model's replies come from the record: the prompt fix is never asked.
    assert not (await Replayer(tripbot.fixed_spec()).replay(recording)).ok
    fixed = await Replayer(tripbot.fixed_spec(), live_model_from="decision").replay(recording)
    assert fixed.ok, str(fixed)
    assert fixed.live_from == 4 and fixed.live_calls == 1 and fixed.replayed == "completed"
    assert "total" in fixed.output["confirmation"]
    assert str(fixed) == f"run {run_id} re-driven with the model live from step 4: completed (1 live model calls)"
    # The code before the fix, its model live from the same step, fails again: the test fails.
    old = await Replayer(tripbot.spec(), live_model_from="decision").replay(recording)
    assert not old.ok and old.replayed == "failed: exception", str(old)
    assert old.divergence is not None and old.divergence.got.startswith("the run failed: exception (ValueError")
    # A model given to the replayer answers instead of the agent's own, from the decision by default.
    given = await Replayer(tripbot.spec(), model=tripbot.fixed_spec().model).replay(recording)
    assert not given.ok  # the old prompt: the scripted model reads the prompt, not who calls it
    assert tripbot.BOOKED == []  # the booking was served from the record every time


async def test_a_candidate_that_needs_a_live_tool_or_effect_is_refused(client: LedgerClient, tmp_path: Path) -> None:
    currency = await _failure(client, CURRENCY, "currency")
    long_stay = await _failure(client, LONG_STAY, "long stay")
    await export_runs(client, [currency, long_stay], tmp_path / "failures.jsonl")
    first, second = read_recordings(tmp_path / "failures.jsonl")
    tripbot.BOOKED.clear()

    # The fixed prompt books the franc trip: a booking the failed run never made, so the record cannot answer.
    booking = await Replayer(tripbot.fixed_spec(), live_model_from=2).replay(first)
    assert not booking.ok and booking.replayed == "refused: needs a live call"
    assert booking.divergence is not None and booking.divergence.step == 3
    assert "needs a live tool" in booking.divergence.got and "runledger rerun" in booking.divergence.got
    # A model that asks for another quote: a tool call with arguments the record does not have.
    requote = await Replayer(tripbot.requote_spec(), live_model_from=2).replay(second)
    assert not requote.ok and requote.divergence is not None and requote.divergence.step == 3
    assert "tool 'quote'" in requote.divergence.got and "needs a live tool" in requote.divergence.got
    assert tripbot.BOOKED == []


def test_the_pytest_plugin_replays_with_the_live_model(tmp_path: Path) -> None:
    async def record() -> None:
        client = await MemoryLedger().connect()
        run_id = await _failure(client, LONG_STAY, "long stay")
        await export_runs(client, [run_id], tmp_path / "failure.jsonl")
        await client.close()

    asyncio.run(record())
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)  # the plugin is found through its entry point, as users get it

    def pytest_(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", "--runledger-replay",
             str(tmp_path / "failure.jsonl"), *args],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    fixed = pytest_("--runledger-agent", "tests.tripbot:fixed_spec", "--runledger-replay-live-model")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "1 passed" in fixed.stdout
    old = pytest_("--runledger-agent", "tests.tripbot:spec", "--runledger-replay-live-model")
    assert old.returncode == 1, old.stdout + old.stderr
    assert "re-driven with the model live from step 4" in old.stdout and "ValueError" in old.stdout
