"""A fix made in place (the agent's own package edited after the record) re-runs as a counterfactual of the
agent element, and the plan says where it forks and whether the change is exercised there: through
``main`` on the in-memory ledger, with a package agent written outside the project (tests/tripbot.py).
Nothing here starts a sandbox (the plan's image check is reported as not done)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import runledger.cli.connect
import runledger.sandbox.cli as sandbox_cli
from runledger.cli.app import main
from runledger.cli.exits import Exit
from runledger.log.memory import MEMORY_URL, MemoryLedger
from runledger.sandbox.errors import DockerUnavailableError
from runledger.sdk.agent import ALLOW_CODE_ENV
from tests import tripbot_package as tripbot


@pytest.fixture
def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The package's name; every command reaches one in-memory ledger, and no Docker engine."""
    memory = MemoryLedger()

    async def connect(url: str, **options: Any) -> Any:
        return await memory.connect()

    def no_docker() -> Any:
        raise DockerUnavailableError("none in this test")

    monkeypatch.setattr(runledger.cli.connect, "connect", connect)
    monkeypatch.setattr(sandbox_cli, "docker_client", no_docker)
    package = f"tripbot_{tmp_path.name[-12:].replace('-', '_')}"
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    monkeypatch.setenv(ALLOW_CODE_ENV, f".,{package}")
    tripbot.write(tmp_path / "code", package, "tripbot")
    yield package
    tripbot.forget(package)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([*argv, "--nats", MEMORY_URL])
    out, err = capsys.readouterr()
    return code, out, err


def test_an_edit_in_place_reruns_as_an_agent_counterfactual_and_resume_still_refuses(
    bot: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ref = f"{bot}.agent:spec"
    trip = json.dumps(tripbot.TRIPS[1])  # CHF: the model answers what the agent cannot unpack
    code, out, _ = cli(capsys, "run", "--agent", ref, "--run-id", "trip-TR-02", "--input", trip)
    assert code == Exit.FAILED and "too many values to unpack" in out, out

    # Forked at the decision (the model's price, step 2), not at the failing step (3): a model change is
    # exercised there. Forked after the last model call, the plan says it never will be.
    model = f"model={bot}.agent:mapping_model"
    code, out, _ = cli(capsys, "rerun", "trip-TR-02", "--agent", ref, "--mode", "counterfactual", "--set", model,
                       "--base-mode", "live", "--plan")  # fmt: skip
    assert code == Exit.OK, out
    assert (
        "on live from step 2\n" in out
        and "fork at step 2: the decision: the last model call at or before step 3" in out
    )
    assert "exercised: the model is called from the fork on (step 2 in the record)" in out, out
    code, out, _ = cli(capsys, "rerun", "trip-TR-02", "--agent", ref, "--mode", "counterfactual", "--set", model,
                       "--at-step", "3", "--plan", "--json")  # fmt: skip
    plan = json.loads(out)
    assert code == Exit.OK and plan["exercise"]["exercised"] is False, plan
    assert "no model call from step 3 on" in plan["exercise"]["why"]

    recorded = tripbot.write(tmp_path / "code", bot, "tripbot", fixed=True)  # the user edits the agent
    assert recorded == ref
    for mode in ("live", "redrive"):
        code, out, err = cli(capsys, "rerun", "trip-TR-02", "--agent", ref, "--mode", mode, "--plan", "--json")
        plan = json.loads(out)
        assert code == Exit.OK and plan["ok"], (plan["problems"], err)
        assert (plan["mode"], plan["base_mode"], plan["changed"], plan["in_place"]) == (
            "counterfactual", mode, "agent_version", True)  # fmt: skip
        assert plan["change"] == f"agent code changed: {plan['changed_from']} -> {plan['changed_to']}"
        assert plan["changed_from"].startswith("code:") and plan["changed_from"] != plan["changed_to"]
        assert plan["exercise"]["exercised"] is True and "not checked whether the agent loads" in err
    code, out, _ = cli(capsys, "rerun", "trip-TR-02", "--agent", ref, "--mode", "counterfactual",
                       "--set", f"agent={ref}", "--plan")  # fmt: skip
    assert code == Exit.OK and "agent code changed: code:" in out and "would refuse" not in out, out
    # Another change on top of the edited code would be two elements: refused, saying which.
    code, out, _ = cli(capsys, "rerun", "trip-TR-02", "--agent", ref, "--mode", "counterfactual", "--set", model,
                       "--plan")  # fmt: skip
    assert code == Exit.REFUSED, out
    assert "is not the code that recorded run trip-TR-02 (agent code changed: code:" in out
    assert "--set model=... changes the model as well" in out
    # resume continues the same run: it runs no other code on it (a failed run: nothing to do), and says
    # where a fix is tried.
    code, out, err = cli(capsys, "resume", "trip-TR-02", "--agent", ref)
    assert code == Exit.FAILED and "run trip-TR-02 is failed: nothing to do" in out, (out, err)
    assert f"`runledger rerun trip-TR-02 --agent {ref} --mode live --local`" in out


def test_edited_code_that_changes_the_prompt_too_is_refused_naming_both(
    bot: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ref = f"{bot}.agent:spec"
    assert cli(capsys, "run", "--agent", ref, "--run-id", "trip-p", "--input", json.dumps(tripbot.TRIPS[1]))[0] == 1
    source = tmp_path / "code" / bot / "agent.py"
    source.write_text(source.read_text().replace("Answer: AMOUNT EUR.", "Answer with AMOUNT EUR only."))
    tripbot.forget(bot)
    code, out, _ = cli(capsys, "rerun", "trip-p", "--agent", ref, "--mode", "redrive", "--plan")
    assert code == Exit.REFUSED, out
    assert "agent_version: recorded 'code:" in out and "prompt_hash: recorded" in out, out
    assert "try each of those with its own --set" in out
