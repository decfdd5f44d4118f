"""Crash-safe runs: SIGKILL the agent at every step boundary and inside every effect, resume,
and count the payments service's own log. No sleeps: processes are waited for."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runledger.examples.refund_agent.agent import TICKETS
from runledger.sdk.holder import is_gone
from tests.agents import calls

# runledger() waits up to 60 s a call and a test makes up to six calls.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]
AGENT = "runledger.examples.refund_agent.agent:spec"
T1001 = next(t for t in TICKETS if t["ticket"] == "T-1001")  # a small refund: 5 steps, 2 effects
T1004 = next(t for t in TICKETS if t["ticket"] == "T-1004")  # a large refund: needs approval


@pytest.fixture
def payments(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The payments service in its own process (it must outlive the agents we kill)."""
    log = tmp_path / "payments.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runledger.examples.refund_agent.payments", "--log", str(log)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    try:
        yield url, log
    finally:
        proc.kill()
        proc.wait()


# Two live resumes racing: the loser finds the key claimed by a process that is alive, which it must
# wait for (a short lease keeps that quick). A SIGKILLed holder is not waited for: the crash tests
# run with the default 30 s lease and the resume sees that the holder is gone (runledger.sdk.holder).
LEASE = {"RUNLEDGER_EFFECT_LEASE_S": "0.5"}


def runledger(url: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runledger", *args],
        cwd=ROOT,
        env={**os.environ, "RUNLEDGER_NATS_URL": url, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def agent_env(payments: tuple[str, Path], tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"REFUND_PAYMENTS_URL": payments[0], "REFUND_OUTBOX": str(tmp_path / "outbox"), **extra}


def emails(tmp_path: Path) -> list[dict[str, Any]]:
    sent = tmp_path / "outbox" / "sent.jsonl"
    return [json.loads(x) for x in sent.read_text().splitlines()] if sent.exists() else []


def status_of(url: str, run_id: str) -> dict[str, Any]:
    shown = runledger(url, "checkpoint", run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    result: dict[str, Any] = json.loads(shown.stdout)
    return result


CRASH_POINTS = (
    ["run:started"]
    + [f"step:{k}:recorded" for k in range(3)]
    + [f"effect:refund:order-8891:{p}" for p in ("claimed", "acted", "recorded")]
    + ["step:3:recorded"]
    + [f"effect:email:T-1001:{p}" for p in ("claimed", "acted", "recorded")]
)


@pytest.mark.parametrize("crash_at", CRASH_POINTS)
def test_crash_anywhere_then_resume_refunds_and_emails_exactly_once(
    crash_at: str, nats_url: str, payments: tuple[str, Path], tmp_path: Path
) -> None:
    env = agent_env(payments, tmp_path)
    run_id = "crash-" + crash_at.replace(":", "-").replace(".", "-")
    crashed = runledger(
        nats_url,
        "run",
        "--agent",
        AGENT,
        "--input",
        json.dumps(T1001),
        "--run-id",
        run_id,
        env={**env, "RUNLEDGER_CRASH_AT": crash_at},
    )
    assert crashed.returncode == -9, f"expected a SIGKILL at {crash_at}: {crashed.stdout}{crashed.stderr}"
    assert status_of(nats_url, run_id)["status"] == "running"

    resumed = runledger(nats_url, "resume", run_id, "--agent", AGENT, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert f"run {run_id}: completed" in resumed.stdout
    # The claim's holder was SIGKILLed on this host: the resume sees it is gone and does not wait
    # out its 30 s lease (it would, and say so, for a holder that may only be paused).
    assert "holds its lease" not in resumed.stderr, resumed.stderr

    refunds = [c for c in calls(payments[1]) if c["order"] == "order-8891"]
    assert len(refunds) == 1, refunds
    assert len([e for e in emails(tmp_path) if e["ticket"] == "T-1001"]) == 1
    cp = status_of(nats_url, run_id)
    assert cp["status"] == "completed"
    assert cp["output"]["refund"]["refund_id"] == refunds[0]["refund_id"]
    assert sorted(cp["committed_keys"]) == ["email:T-1001", "refund:order-8891"]
    assert runledger(nats_url, "verify", run_id).returncode == 0
    # Resuming a completed run says so and does nothing.
    again = runledger(nats_url, "resume", run_id, "--agent", AGENT, env=env)
    assert again.returncode == 0 and "nothing to do" in again.stdout
    assert len(calls(payments[1])) == 1


def test_two_resumes_at_once_exactly_one_proceeds(nats_url: str, payments: tuple[str, Path], tmp_path: Path) -> None:
    env = agent_env(payments, tmp_path)
    crash = {**env, "RUNLEDGER_CRASH_AT": "effect:refund:order-8891:acted"}
    assert (
        runledger(
            nats_url, "run", "--agent", AGENT, "--input", json.dumps(T1001), "--run-id", "twice", env=crash
        ).returncode
        == -9
    )
    barrier = {**env, "RUNLEDGER_PAUSE_AT": "resume:loaded", "RUNLEDGER_PAUSE_DIR": str(tmp_path / "barrier")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "runledger", "resume", "--nats", nats_url, "twice", "--agent", AGENT],
            cwd=ROOT,
            env={**os.environ, **LEASE, **barrier},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outcomes = [(p.wait(timeout=60), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in outcomes)
    assert codes == [0, 4], outcomes  # the loser: Exit.ERROR, fenced out
    loser = next(err for code, _, err in outcomes if code == 4)
    assert "another writer owns" in loser
    assert len(calls(payments[1])) == 1
    assert len(emails(tmp_path)) == 1
    assert status_of(nats_url, "twice")["status"] == "completed"


def test_a_pending_approval_survives_a_crash_and_a_resume(
    nats_url: str, payments: tuple[str, Path], tmp_path: Path
) -> None:
    env = agent_env(payments, tmp_path)
    crashed = runledger(
        nats_url,
        "run",
        "--agent",
        AGENT,
        "--input",
        json.dumps(T1004),
        "--run-id",
        "appr",
        env={**env, "RUNLEDGER_CRASH_AT": "step:3:recorded"},
    )
    assert crashed.returncode == -9
    cp = status_of(nats_url, "appr")
    assert cp["status"] == "suspended"
    (request,) = cp["pending_approvals"]
    assert cp["pending_approvals"][request]["args"] == {"order": "order-7777", "amount": 950.0}

    waiting = runledger(nats_url, "resume", "appr", "--agent", AGENT, env=env)
    assert waiting.returncode == 5 and "nothing to do" in waiting.stdout and request in waiting.stdout
    listed = runledger(nats_url, "runs")
    assert "awaiting approval " + request in listed.stdout
    assert calls(payments[1]) == []

    approved = runledger(nats_url, "approve", "appr", request, "--by", "alice")
    assert approved.returncode == 0, approved.stderr
    done = runledger(nats_url, "resume", "appr", "--agent", AGENT, env=env)
    assert done.returncode == 0 and "completed" in done.stdout, done.stderr
    assert [c["order"] for c in calls(payments[1])] == ["order-7777"]


def test_an_in_doubt_effect_without_reconcile_stops_and_is_resolved_through_the_cli(
    nats_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "calls.log"
    env = {"TEST_CALLS_LOG": str(log)}
    agent = "tests.agents:unreconciled_spec"
    crashed = runledger(
        nats_url,
        "run",
        "--agent",
        agent,
        "--run-id",
        "doubt",
        env={**env, "RUNLEDGER_CRASH_AT": "effect:charge:inv-1:acted"},
    )
    assert crashed.returncode == -9
    assert len(calls(log)) == 1  # it acted, then died before recording

    stopped = runledger(nats_url, "resume", "doubt", "--agent", agent, env=env)
    assert "suspended (effect_in_doubt)" in stopped.stdout
    assert "runledger effects resolve charge:inv-1 --committed" in stopped.stdout
    assert len(calls(log)) == 1  # nobody guessed
    assert "effect in doubt charge:inv-1" in runledger(nats_url, "runs").stdout

    resolved = runledger(
        nats_url,
        "effects",
        "resolve",
        "charge:inv-1",
        "--committed",
        "--by",
        "bob",
        "--result",
        '{"done": {"amount": 5}}',
    )
    assert resolved.returncode == 0, resolved.stderr
    done = runledger(nats_url, "resume", "doubt", "--agent", agent, env=env)
    assert done.returncode == 0 and "completed" in done.stdout, done.stdout + done.stderr
    assert len(calls(log)) == 1
    assert status_of(nats_url, "doubt")["output"]["charged"] == {"done": {"amount": 5}}


async def on_the_page(url: str, db: Path, run_id: str) -> tuple[list[str], str]:
    """What the page shows of ``run_id``: its row's keys in doubt (the list) and its first effect's state."""
    from runledger.log.client import connect
    from runledger.ui.listing import RunFilter, run_page
    from runledger.ui.projection import ProjectionFollower
    from runledger.ui.runview import effects, read_run, settled
    from runledger.ui.viewers import Viewer

    client = await connect(url)
    follower = ProjectionFollower(client, db)
    try:
        await follower.start()
        assert await follower.caught_up(timeout=30)
        viewer = Viewer("local", "local", client)
        (row,) = [r for r in (await run_page(follower, viewer, RunFilter())).rows if r.run_id == run_id]
        _log, cp = await read_run(viewer, run_id)
        return row.in_doubt, (await settled(viewer, effects(cp)))[0].state
    finally:
        await follower.close()
        await client.close()


def test_a_reconcile_that_raises_leaves_the_key_in_doubt_and_the_run_resumable(nats_url: str, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    env = {"TEST_CALLS_LOG": str(log)}
    agent = "tests.agents:unreachable_spec"
    crashed = runledger(
        nats_url, "run", "--agent", agent, "--run-id", "unreach",
        env={**env, "RUNLEDGER_CRASH_AT": "effect:charge:inv-2:acted"},
    )  # fmt: skip
    assert crashed.returncode == -9 and len(calls(log)) == 1  # it acted, then died before recording

    stopped = runledger(nats_url, "resume", "unreach", "--agent", agent, env=env)
    assert stopped.returncode == 5, stopped.stderr  # Exit.SUSPENDED: waiting on a human
    assert stopped.stdout == (
        "run unreach: suspended (effect_in_doubt)\n"
        "run unreach step 0: effect 'charge:inv-2' was claimed but has no recorded outcome (the process died "
        "between claim and record) and its reconcile function failed (ConnectionError: payments service "
        "unreachable), so nobody knows whether it happened. Check the external system, then run `runledger "
        "effects resolve charge:inv-2 --committed --by NAME` or `--not-committed --by NAME`, and resume the run "
        "(or resume it once the reconcile's service answers again)\n"
    )
    assert status_of(nats_url, "unreach")["status"] == "suspended"
    assert "effect in doubt charge:inv-2" in runledger(nats_url, "runs").stdout
    assert asyncio.run(on_the_page(nats_url, tmp_path / "before.duckdb", "unreach")) == (["charge:inv-2"], "in_doubt")

    resolved = runledger(
        nats_url, "effects", "resolve", "charge:inv-2", "--committed", "--by", "bob", "--result", '{"done": 7}'
    )
    assert resolved.returncode == 0, resolved.stderr
    assert resolved.stdout == (
        "effect charge:inv-2 resolved as committed (now committed); continue run unreach with "
        "`runledger resume unreach --agent MODULE:ATTR` (the spec of agent unreachable)\n"
    )
    listed = runledger(nats_url, "runs").stdout
    assert "effect in doubt" not in listed
    assert "effect charge:inv-2 settled: `runledger resume unreach --agent MODULE:ATTR` continues" in listed
    assert asyncio.run(on_the_page(nats_url, tmp_path / "after.duckdb", "unreach")) == ([], "committed")

    done = runledger(nats_url, "resume", "unreach", "--agent", agent, env=env)
    assert done.returncode == 0 and "completed" in done.stdout, done.stdout + done.stderr
    assert len(calls(log)) == 1
    assert status_of(nats_url, "unreach")["output"] == {"charged": {"done": 7}}


async def page_status(url: str, db: Path, run_id: str) -> tuple[str, str]:
    """The status the page shows of ``run_id``: in the run list, and on the run's own page."""
    from runledger.log.client import connect
    from runledger.ops.trace import record_status
    from runledger.ui.listing import RunFilter, run_page
    from runledger.ui.projection import ProjectionFollower
    from runledger.ui.runview import read_run
    from runledger.ui.viewers import Viewer

    client = await connect(url)
    follower = ProjectionFollower(client, db)
    try:
        await follower.start()
        assert await follower.caught_up(timeout=30)
        viewer = Viewer("local", "local", client)
        (row,) = [r for r in (await run_page(follower, viewer, RunFilter())).rows if r.run_id == run_id]
        log, cp = await read_run(viewer, run_id)
        return row.status, record_status(log, cp)[0]
    finally:
        await follower.close()
        await client.close()


def test_a_crashed_run_shows_as_stalled_not_running(nats_url: str, tmp_path: Path) -> None:
    env = {"TEST_CALLS_LOG": str(tmp_path / "calls.log")}
    agent = "tests.agents:unreconciled_spec"
    crashed = runledger(
        nats_url, "run", "--agent", agent, "--run-id", "gone", env={**env, "RUNLEDGER_CRASH_AT": "run:started"}
    )
    assert crashed.returncode == -9
    listed = runledger(nats_url, "runs").stdout
    (line,) = [x for x in listed.splitlines() if x.startswith("gone ")]
    assert line.split()[2] == "stalled", listed
    assert "its process is gone (crashed?): `runledger resume gone --agent MODULE:ATTR` continues it" in line
    assert "status stalled" in runledger(nats_url, "show", "gone").stdout
    assert asyncio.run(page_status(nats_url, tmp_path / "page.duckdb", "gone")) == ("stalled", "stalled")
    # The checkpoint (and the projection's checkpoints.checkpoint, for SQL) names the holder, which is gone.
    holder = status_of(nats_url, "gone")["holder"]
    assert holder and is_gone(holder)

    done = runledger(nats_url, "resume", "gone", "--agent", agent, env=env)
    assert done.returncode == 0 and "completed" in done.stdout, done.stdout + done.stderr
    assert "stalled" not in runledger(nats_url, "runs").stdout


def test_a_result_served_from_an_earlier_runs_key_says_so(nats_url: str, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    env = {"TEST_CALLS_LOG": str(log)}
    first = runledger(nats_url, "run", "--agent", "tests.agents:refunder_spec", "--run-id", "refund-1", env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout == 'run refund-1: completed\n{"done": {"order": "o-1"}}\n'  # done here: nothing to add
    again = runledger(nats_url, "run", "--agent", "tests.agents:refunder_spec", "--run-id", "refund-2", env=env)
    assert again.returncode == 0, again.stderr
    assert again.stdout == (
        'run refund-2: completed\n{"done": {"order": "o-1"}}\n'
        "note: effect 'refund:o-1' (step 0) was not done again: its key was committed by run refund-1, whose "
        "recorded result was served (`runledger effects show refund:o-1`)\n"
    )
    assert len(calls(log)) == 1


def test_not_committed_resolution_lets_the_resume_act_once(nats_url: str, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    env = {"TEST_CALLS_LOG": str(log)}
    agent = "tests.agents:unreconciled_spec"
    crashed = runledger(
        nats_url,
        "run",
        "--agent",
        agent,
        "--run-id",
        "doubt2",
        env={**env, "RUNLEDGER_CRASH_AT": "effect:charge:inv-1:claimed"},
    )
    assert crashed.returncode == -9 and calls(log) == []
    runledger(nats_url, "resume", "doubt2", "--agent", agent, env=env)
    assert runledger(nats_url, "effects", "resolve", "charge:inv-1", "--not-committed", "--by", "bob").returncode == 0
    done = runledger(nats_url, "resume", "doubt2", "--agent", agent, env=env)
    assert "completed" in done.stdout, done.stdout + done.stderr
    assert len(calls(log)) == 1


def test_budget_continues_from_the_recorded_spend(nats_url: str, tmp_path: Path) -> None:
    agent = "tests.agents:spender_spec"
    crashed = runledger(
        nats_url, "run", "--agent", agent, "--run-id", "budget", env={"RUNLEDGER_CRASH_AT": "step:1:recorded"}
    )
    assert crashed.returncode == -9
    assert status_of(nats_url, "budget")["spent"]["tokens"] == 80
    resumed = runledger(nats_url, "resume", "budget", "--agent", agent)
    assert "failed (budget_exhausted)" in resumed.stdout
    cp = status_of(nats_url, "budget")
    # One more call (80 -> 120) and the limit stops it: not 100 tokens later.
    assert cp["spent"]["tokens"] == 120 and cp["spent"]["turns"] == 3
    assert cp["failure_reason"] == "budget_exhausted"
    again = runledger(nats_url, "resume", "budget", "--agent", agent)
    assert "nothing to do" in again.stdout and status_of(nats_url, "budget")["spent"]["tokens"] == 120
    # Only an explicit, recorded grant adds budget.
    assert runledger(nats_url, "budget", "grant", "budget", "--tokens", "80", "--by", "carol").returncode == 0
    more = runledger(nats_url, "resume", "budget", "--agent", agent)
    assert "failed (budget_exhausted)" in more.stdout
    cp = status_of(nats_url, "budget")
    assert cp["limits"]["tokens"] == 180 and cp["spent"]["tokens"] == 200
