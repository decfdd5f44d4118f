"""The in-process replayer (runledger.testing) over the golden recordings of tests/fixtures/recordings:
no server, no Docker. Recorded runs replay as recorded; changed code is reported as a value naming the
step, what the record has and what the code did; nothing the record cannot answer ever runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from runledger.errors import ConfigurationError, PayloadUnavailableError
from runledger.examples.refund_agent import agent as refund
from runledger.testing import Recording, Replayer, read_recordings, write_recordings
from tests import recorded_agents
from tests.agents import ordinary_spec

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "fixtures" / "recordings"


def _replay(spec: Any, name: str) -> list[Any]:
    return Replayer(spec).replay_paths(GOLDEN / f"{name}.jsonl")


def test_golden_recordings_of_the_example_agent_replay_as_recorded() -> None:
    results = _replay(refund.spec(), "refund-agent")
    assert [r.recorded for r in results] == [
        "completed", "completed", "failed: exception", "suspended: approval", "completed", "completed",
    ]  # fmt: skip
    assert all(r.ok for r in results), [str(r) for r in results if not r.ok]
    assert [r.replayed for r in results] == [r.recorded for r in results]
    assert [r.steps for r in results] == [5, 3, 2, 4, 6, 4]  # the approved run: 6 (its approval)


def test_ordinary_agent_code_replays_parallel_calls_and_keyword_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_CALLS_LOG", "/nonexistent/calls.log")  # read by the agent, never written on replay
    recorded_agents.CALLS.clear()
    ordinary = _replay(ordinary_spec(), "ordinary")  # 8 lookups at once, unsorted results, 2 effects at once
    shop = _replay(recorded_agents.shop_spec(), "shop")  # keyword tools called together, a keyed effect
    assert all(r.ok for r in ordinary + shop), [str(r) for r in ordinary + shop if not r.ok]
    assert [r.steps for r in ordinary] == [12] and [r.steps for r in shop] == [9, 9]
    assert recorded_agents.CALLS == []  # every tool and effect was answered by the record


def test_a_changed_decision_is_named_by_its_step() -> None:
    cautious = _replay(recorded_agents.cautious_refund_spec(), "refund-agent")
    first = cautious[0]  # T-1001, a refund of 49.90: the changed code asks for an approval first
    assert not first.ok and first.replayed == "diverged"
    assert first.divergence is not None and first.divergence.step == 3
    assert first.divergence.expected.startswith("effect 'refund'")
    assert first.divergence.got.startswith("approval 'refund'")
    assert "step 3: expected effect 'refund'" in str(first) and first.run_id in str(first)
    assert all(r.ok for r in cautious[1:])  # no other ticket refunds between 40 and 500

    strict = _replay(recorded_agents.strict_refund_spec(), "refund-agent")  # another model
    assert {r.divergence.step for r in strict if r.divergence} == {0} and not any(r.ok for r in strict)
    assert strict[0].divergence is not None and "scripted-strict-1" in strict[0].divergence.got
    assert strict[0].version_changes["model"] == ("scripted-support-1", "scripted-strict-1")


def test_changed_arguments_are_shown_side_by_side() -> None:
    result = _replay(recorded_agents.shop_other_warehouse_spec(), "shop")[0]
    assert result.divergence is not None and result.divergence.step == 1
    assert '- "warehouse": "main"' in result.divergence.detail
    assert '+ "warehouse": "north"' in result.divergence.detail


def test_a_call_past_the_record_is_a_divergence_and_never_runs() -> None:
    recorded_agents.CALLS.clear()
    result = _replay(recorded_agents.shop_checks_again_spec(), "shop")[0]
    assert result.divergence is not None and result.divergence.step == 9
    assert result.divergence.expected == "no step 9: the run completed after step 8"
    assert result.divergence.got == "tool 'stock'"
    assert recorded_agents.CALLS == []


def test_a_changed_output_is_a_divergence_of_the_outcome() -> None:
    async def louder(run: Any) -> Any:
        return {**(await refund.handle_ticket(run)), "extra": True}

    result = _replay(replace(refund.spec(), fn=louder), "refund-agent")[0]
    assert result.divergence is not None and result.divergence.step is None
    assert '"extra":true' in result.divergence.got and "the outcome: expected the output" in str(result)


def test_a_record_that_ends_open_replays_to_its_end(tmp_path: Path) -> None:
    whole = read_recordings(GOLDEN / "refund-agent.jsonl")[0]
    crashed = Recording(whole.run_id, whole.agent, whole.records[:-3])  # no outcome, its last steps gone
    path = tmp_path / "crashed.jsonl"
    write_recordings(path, [crashed])
    (result,) = Replayer(refund.spec()).replay_paths(path)
    assert result.ok and result.recorded == "running" and result.replayed == "end of record"

    # Approved by an operator, not resumed yet: the code goes on past the approval, where the record ends.
    approved = read_recordings(GOLDEN / "refund-agent.jsonl")[4]
    types = [r.event.type for r in approved.records]
    waiting = Recording(approved.run_id, approved.agent, approved.records[: types.index("approval.resolved") + 1])
    write_recordings(path, [waiting])
    (result,) = Replayer(refund.spec()).replay_paths(path)
    assert result.ok and result.recorded == "suspended: approval" and result.replayed == "end of record"


def test_a_recording_must_be_whole_and_readable(tmp_path: Path) -> None:
    lines = (GOLDEN / "shop.jsonl").read_text().splitlines()
    truncated = tmp_path / "truncated.jsonl"
    truncated.write_text("\n".join(lines[:5]) + "\n")
    with pytest.raises(ConfigurationError, match="truncated or edited"):
        read_recordings(truncated)
    newer = tmp_path / "newer.jsonl"
    newer.write_text(json.dumps({**json.loads(lines[0]), "recording": 99}) + "\n")
    with pytest.raises(ConfigurationError, match="newer than this runledger reads"):
        read_recordings(newer)
    hashed = tmp_path / "hashed.jsonl"  # content that was never opened (capture=hash-only)
    event_lines = [json.loads(line) for line in lines[1:]]
    for line in event_lines:
        if line["event"]["type"] == "tool.called":
            line["event"]["payload"]["output"] = {"$hash": "ab" * 32, "size": 12}
            break
    hashed.write_text("\n".join([lines[0], *(json.dumps(x) for x in event_lines)]) + "\n")
    with pytest.raises(PayloadUnavailableError, match="hash-only"):
        read_recordings(hashed)


def test_another_agents_recording_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="recorded by agent 'shop'"):
        _replay(refund.spec(), "shop")


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TEST_CALLS_LOG": str(tmp_path / "calls.log")}
    env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)  # the plugin is found through its entry point, as users get it
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfs", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100,
    )  # fmt: skip


def test_the_pytest_plugin_makes_one_test_per_recorded_run(tmp_path: Path) -> None:
    recordings = tmp_path / "recordings"
    recordings.mkdir()
    for name in ("refund-agent", "shop"):
        (recordings / f"{name}.jsonl").write_text((GOLDEN / f"{name}.jsonl").read_text())
    agent = "runledger.examples.refund_agent.agent:spec"
    passed = _pytest(tmp_path, "--runledger-replay", str(recordings), "--runledger-agent", agent)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "6 passed, 2 skipped" in passed.stdout, passed.stdout  # the shop's runs are another agent's
    assert "recorded by agent 'shop'" in passed.stdout

    changed = "tests.recorded_agents:cautious_refund_spec"
    failed = _pytest(
        tmp_path, "--runledger-replay", str(recordings / "refund-agent.jsonl"), "--runledger-agent", changed
    )
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "1 failed, 5 passed" in failed.stdout, failed.stdout
    first = read_recordings(GOLDEN / "refund-agent.jsonl")[0].run_id
    assert f"refund-agent.jsonl::{first}" in failed.stdout
    assert "step 3: expected effect 'refund'" in failed.stdout and "got approval 'refund'" in failed.stdout

    missing = _pytest(tmp_path, "--runledger-replay", str(recordings))
    assert missing.returncode != 0 and "--runledger-agent MODULE:ATTR" in missing.stderr
