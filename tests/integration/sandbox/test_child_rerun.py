"""Child runs in sandbox re-runs: the guest's ``run.child`` is answered from the parent's record
(a re-run never starts a child: its code would run on the host), and a live re-run past the fork
refuses a child."""

from __future__ import annotations

from pathlib import Path

import pytest

from runledger.log.client import LedgerClient
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from runledger.sandbox.rerun import Rerunner, RerunRequest
from runledger.sdk.lifecycle import start_run
from tests.agents import calls, family_sandboxed_spec

pytestmark = [pytest.mark.integration, pytest.mark.docker]
AGENT = "tests.agents:family_sandboxed_spec"


async def test_children_are_served_from_the_record_and_refused_live(
    client: LedgerClient, rerunner: Rerunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "calls.log"
    monkeypatch.setenv("TEST_CALLS_LOG", str(log))
    parent = await start_run(client, family_sandboxed_spec(), {"x": 4}, run_id="p-child")
    assert parent.status == "completed", parent
    ran = len(calls(log))

    redrive = await rerunner.rerun(RerunRequest(parent_run_id="p-child", agent=AGENT, mode="redrive", fork_step=1))
    assert (redrive.status, redrive.output) == ("completed", parent.output), redrive.error
    cp = fold((await load_run(client, redrive.run_id)).records)
    assert [(s.kind, s.status, s.child_run_id) for _, s in sorted(cp.steps.items())] == [
        ("child", "completed", "p-child-c0"), ("child", "completed", "p-child-c1"), ("tool", "ok", None),
    ]  # fmt: skip
    assert len(calls(log)) == ran  # no child ran, and redrive served the tool from the record
    # (the guest sends the child and the tool, called at once with asyncio.gather, in call order)

    live = await rerunner.rerun(RerunRequest(parent_run_id="p-child", agent=AGENT, mode="live", fork_step=1))
    assert live.status == "failed" and "does not start child runs" in (live.error or ""), live
    assert len(calls(log)) == ran
