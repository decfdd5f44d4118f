"""Workers that survive poison: a request that fails its worker is retried a bounded number of
times, then dead-lettered on its branch and listed, while the requests behind it go on; a re-run's
time limit is the worker's, enforced from the host; SIGTERM ends a worker with a wedged re-run
in bounded time, the re-run left for redelivery and no container behind."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from runledger.errors import CodeNotAllowedError, RunNotFoundError
from runledger.log.client import LedgerClient
from runledger.log.subjects import CMD_STREAM
from runledger.protect.loading import load_run
from runledger.record.fold import Checkpoint, fold
from runledger.sandbox import rerun as rerun_module
from runledger.sandbox.containers import SandboxPolicy, SandboxPool
from runledger.sandbox.errors import RerunDeadLetteredError
from runledger.sandbox.rerun import Rerunner, RerunRequest, RerunResult
from runledger.sandbox.worker import CONSUMER, RERUN_SUBJECT, run_worker, submit
from runledger.sdk.lifecycle import start_run
from tests.conftest import eventually
from tests.integration.sandbox.owned import containers_of
from tests.worker_agents.agents import steady_spec

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.timeout(240)]
ROOT = Path(__file__).resolve().parents[3]
MOD = "tests.worker_agents.agents"


@pytest.fixture
async def parent(client: LedgerClient) -> str:
    result = await start_run(client, steady_spec(), None, run_id="poison-parent")
    assert result.status == "completed"
    return "poison-parent"


def request(parent: str, agent: str, **fields: Any) -> RerunRequest:
    return RerunRequest(parent_run_id=parent, agent=f"{MOD}:{agent}", mode="redrive", fork_step=0, **fields)


async def branch(client: LedgerClient, req: RerunRequest) -> tuple[list[str], Checkpoint] | None:
    try:
        log = await load_run(client, req.branch_run_id)
    except RunNotFoundError:
        return None
    return [r.event.type for r in log.records], fold(log.records)


async def ended(client: LedgerClient, *reqs: RerunRequest) -> bool:
    for req in reqs:
        found = await branch(client, req)
        if found is None or found[1].status not in ("completed", "failed"):
            return False
    return True


def worker(url: str, log: Path, *options: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "runledger", "worker", "--nats", url, "--pool", "0", *options],
            cwd=ROOT, env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def cli(url: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "runledger", *args, "--nats", url], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


async def queued(client: LedgerClient) -> int:
    return (await client.js.stream_info(CMD_STREAM)).state.messages


def assert_dead_lettered(types: list[str], cp: Checkpoint, deliveries: int, *fragments: str) -> None:
    assert types[-1] == "run.failed" and types.count("run.failed") == 1, types
    assert cp.failure_reason == "exception"
    error = cp.error or {}
    assert error["type"] == "RerunDeadLetteredError"
    for fragment in (f"dead-lettered after {deliveries} deliveries", *fragments):
        assert fragment in error["message"], error["message"]


async def test_a_poison_request_is_retried_then_dead_lettered_and_the_worker_serves_on(
    client: LedgerClient, nats_url: str, docker: Any, sandbox_image: str, parent: str, tmp_path: Path
) -> None:
    poison = request(parent, "exploding_spec")
    good = request(parent, "steady_spec", timeout_s=600)  # queued after the poison, asking for too much time
    for req in (poison, good):
        await submit(client, req)
    log = tmp_path / "worker.log"
    proc = worker(nats_url, log, "--max-attempts", "3", "--retry-delay", "0.3", "--timeout", "60")
    try:
        await eventually(lambda: ended(client, poison, good), timeout=120, interval=0.5)
        assert proc.poll() is None, log.read_text()  # the poison did not take the worker down

        found = await branch(client, good)
        assert found is not None and found[1].status == "completed"
        found = await branch(client, poison)
        assert found is not None
        types, cp = found
        # Never ran (its agent cannot be loaded): the branch was started to hold the dead letter.
        assert types == ["run.started", "run.forked", "run.failed"]
        assert_dead_lettered(types, cp, 3, "RuntimeError: the exploding agent's factory raised on the host")
        assert "exploding_spec" in (cp.error or {}).get("traceback", "")
        await eventually(lambda: empty(client), timeout=10)  # the dead letter terminated, the good one acked

        dead = cli(nats_url, "reruns", "--dead")
        assert poison.request_id in dead and good.request_id not in dead
        assert "DEAD LETTER" in dead
        listed = cli(nats_url, "reruns")
        assert poison.request_id in listed and good.request_id in listed
        runs = cli(nats_url, "runs", "--status", "failed", "--branches")
        assert poison.branch_run_id in runs and "dead-lettered after 3 deliveries" in runs
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 60)
    out = log.read_text()
    assert code == 0, out
    assert out.count(f"re-run {poison.request_id}: error:") == 3, out  # two retries, then the dead letter
    assert f"re-run {good.request_id}: branch {good.branch_run_id} completed" in out
    assert "time limit capped at the worker's 60s (the request asked for 600s)" in out
    await eventually(lambda: not containers_of(docker, proc.pid), timeout=20)


async def test_a_queued_request_naming_os_abort_is_dead_lettered_at_once_without_any_call(
    client: LedgerClient, nats_url: str, docker: Any, sandbox_image: str, parent: str, tmp_path: Path
) -> None:
    # As an attacker with the operator's queue would: published raw, past submit's own check.
    hostile = [
        RerunRequest(parent_run_id=parent, agent=f"{MOD}:steady_spec", mode="counterfactual", fork_step=0,
                     change={"model": "os:abort"}),
        RerunRequest(parent_run_id=parent, agent="os:abort", mode="redrive", fork_step=0),
    ]  # fmt: skip
    with pytest.raises(CodeNotAllowedError, match="os:abort"):
        await submit(client, hostile[0])
    assert await queued(client) == 0
    for req in hostile:
        await client.js.publish(RERUN_SUBJECT, req.model_dump_json().encode(),
                                headers={"Nats-Msg-Id": f"rerun:{req.request_id}"})  # fmt: skip
    good = request(parent, "steady_spec")
    await submit(client, good)
    log = tmp_path / "worker.log"
    proc = worker(nats_url, log, "--max-attempts", "3", "--retry-delay", "0.3", "--timeout", "60")
    try:
        await eventually(lambda: ended(client, *hostile, good), timeout=120, interval=0.5)
        assert proc.poll() is None, log.read_text()  # before: SIGABRT, and the next worker too
        for req, what in zip(hostile, ("model", "agent"), strict=True):
            found = await branch(client, req)
            assert found is not None
            types, cp = found
            assert types == ["run.started", "run.forked", "run.failed"]  # nothing of it ran
            assert_dead_lettered(types, cp, 1, f"CodeNotAllowedError: {what} 'os:abort' is not on this host's "
                                 "allow-list", "$RUNLEDGER_ALLOW_CODE=")  # fmt: skip
        found = await branch(client, good)
        assert found is not None and found[1].status == "completed"
        await eventually(lambda: empty(client), timeout=10)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 60)
    out = log.read_text()
    assert code == 0, out
    for req in hostile:
        assert out.count(f"re-run {req.request_id}: error:") == 1, out  # dead-lettered on its first delivery
    await eventually(lambda: not containers_of(docker, proc.pid), timeout=20)


async def empty(client: LedgerClient) -> bool:
    return await queued(client) == 0


async def test_drive_raising_unexpectedly_is_retried_on_its_branch_then_dead_lettered(
    client: LedgerClient, docker: Any, sandbox_image: str, parent: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    poison = request(parent, "steady_spec")
    good = request(parent, "steady_spec")
    real_drive = rerun_module.drive
    calls: list[str] = []

    async def poisoned_drive(run: Any, spec: Any, **kwargs: Any) -> Any:
        if run.run_id == poison.branch_run_id:
            calls.append(run.run_id)
            # What a lone surrogate in a guest's outcome did to the host: raised out of drive().
            raise UnicodeEncodeError("utf-8", "output \ud800", 7, 8, "surrogates not allowed")
        return await real_drive(run, spec, **kwargs)

    monkeypatch.setattr(rerun_module, "drive", poisoned_drive)
    for req in (poison, good):
        await submit(client, req)
    seen: list[tuple[str, RerunResult | Exception]] = []
    handled = await asyncio.wait_for(
        run_worker(client, docker, policy=SandboxPolicy(image=sandbox_image), pool_size=0, max_attempts=3,
                   retry_delay_s=0.2, max_requests=4, on_result=lambda r, o: seen.append((r.request_id, o))),
        timeout=150,
    )  # fmt: skip
    assert handled == 4  # three deliveries of the poison, one of the good request: the worker went on
    assert len(calls) == 3
    outcomes = [o for rid, o in seen if rid == poison.request_id]
    assert [type(o).__name__ for o in outcomes] == ["UnicodeEncodeError", "UnicodeEncodeError",
                                                    "RerunDeadLetteredError"]  # fmt: skip
    assert isinstance(outcomes[-1], RerunDeadLetteredError) and outcomes[-1].deliveries == 3
    [good_outcome] = [o for rid, o in seen if rid == good.request_id]
    assert isinstance(good_outcome, RerunResult) and good_outcome.status == "completed"

    found = await branch(client, poison)
    assert found is not None
    types, cp = found
    # Each retry resumed the same branch (fenced); the dead letter ended it.
    assert types == ["run.started", "run.forked", "run.resumed", "run.resumed", "run.failed"]
    assert_dead_lettered(types, cp, 3, "UnicodeEncodeError", "\\ud800")
    assert "surrogates not allowed" in (cp.error or {}).get("traceback", "")
    assert await queued(client) == 0
    assert not containers_of(docker, os.getpid())


async def test_a_request_whose_worker_died_on_its_last_attempt_is_dead_lettered_not_run_again(
    client: LedgerClient, nats_url: str, docker: Any, sandbox_image: str, parent: str, tmp_path: Path
) -> None:
    req = request(parent, "steady_spec")
    await submit(client, req)
    options = ("--max-attempts", "1", "--ack-wait", "2", "--max-requests", "1")
    doomed = worker(nats_url, tmp_path / "doomed.log", *options, env={"RUNLEDGER_CRASH_AT": "step:1:recorded"})
    assert await asyncio.to_thread(doomed.wait, 90) == -signal.SIGKILL, (tmp_path / "doomed.log").read_text()
    found = await branch(client, req)
    assert found is not None and found[0][-1] == "model.called"  # it died mid-re-run

    second = worker(nats_url, tmp_path / "second.log", *options)
    assert await asyncio.to_thread(second.wait, 90) == 0, (tmp_path / "second.log").read_text()
    found = await branch(client, req)
    assert found is not None
    types, cp = found
    assert "run.resumed" not in types  # given up on, not run a second time
    assert_dead_lettered(types, cp, 1, "ended without an outcome (its worker died or was stopped)")
    assert (
        f"re-run {req.request_id}: error: re-run request {req.request_id} dead-lettered"
        in (tmp_path / "second.log").read_text()
    )
    assert await queued(client) == 0
    await eventually(lambda: not containers_of(docker, doomed.pid, second.pid), timeout=20)


async def test_a_request_asking_for_more_time_than_the_worker_allows_is_capped_and_killed_by_the_host(
    client: LedgerClient, docker: Any, sandbox_image: str, parent: str
) -> None:
    pool = SandboxPool(docker, SandboxPolicy(image=sandbox_image, timeout_s=4), size=0)
    try:
        started = time.monotonic()
        result = await Rerunner(client, pool).rerun(request(parent, "wedged_spec", timeout_s=600))
        elapsed = time.monotonic() - started
        assert result.status == "failed" and result.reason == "sandbox", result
        assert (result.time_limit_s, result.requested_time_limit_s) == (4, 600)
        assert "capped at the worker's 4s (the request asked for 600s)" in result.time_limit_note
        assert "wall-clock limit of 4s (the worker's limit; the request asked for 600s)" in (result.error or "")
        assert "container was killed" in (result.error or "")
        assert elapsed < 4 + 30  # a cold start, the limit, the kill: not the request's ten minutes
        # Under the worker's limit, the request's own time is kept, and nothing is said.
        ok = await Rerunner(client, pool).rerun(request(parent, "steady_spec", timeout_s=3))
        assert ok.status == "completed" and (ok.time_limit_s, ok.requested_time_limit_s) == (3, None)
        assert ok.time_limit_note == ""
    finally:
        await pool.close()
    assert not containers_of(docker, os.getpid())


async def test_sigterm_stops_a_worker_with_a_wedged_rerun_in_bounded_time_leaving_it_for_redelivery(
    client: LedgerClient, nats_url: str, docker: Any, sandbox_image: str, parent: str, tmp_path: Path
) -> None:
    req = request(parent, "wedged_spec", timeout_s=300)
    await submit(client, req)
    log = tmp_path / "worker.log"
    proc = worker(nats_url, log, "--timeout", "300", "--drain", "2", "--ack-wait", "30")
    try:
        # Wedged: its first step recorded, the guest silent, its container running.
        async def wedged() -> bool:
            found = await branch(client, req)
            return found is not None and found[0][-1] == "tool.called" and bool(containers_of(docker, proc.pid))

        await eventually(wedged, timeout=90, interval=0.3)
        await asyncio.sleep(1.0)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 40)
        stopped_in = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0, log.read_text()
    assert stopped_in < 2 + 15, stopped_in  # the drain, then the kill and the clean-up
    assert "interrupting them" in log.read_text()
    assert containers_of(docker, proc.pid) == []  # the wedged container was killed, none left behind

    found = await branch(client, req)
    assert found is not None
    types, cp = found
    assert cp.status == "running" and "run.failed" not in types  # not failed: left for redelivery
    # The request was nak'ed, not lost: the next worker gets it at once, as its second delivery.
    sub = await client.js.pull_subscribe(RERUN_SUBJECT, durable=CONSUMER, stream=CMD_STREAM)
    try:
        [msg] = await sub.fetch(1, timeout=10)
        assert RerunRequest.model_validate_json(msg.data).request_id == req.request_id
        assert msg.metadata.num_delivered == 2
        await msg.term()
    finally:
        await sub.unsubscribe()


async def test_sigterm_ends_a_worker_whose_host_tool_is_wedged_in_a_thread(
    client: LedgerClient, nats_url: str, docker: Any, sandbox_image: str, parent: str, tmp_path: Path
) -> None:
    """Nothing cancels a thread: the interpreter would wait an hour for it at exit. The watchdog
    armed by the signal ends the process 30 s after the drain, its sandboxes removed first."""
    req = RerunRequest(parent_run_id=parent, agent=f"{MOD}:hanging_spec", mode="live", fork_step=1, timeout_s=300)
    await submit(client, req)
    log = tmp_path / "worker.log"
    proc = worker(nats_url, log, "--timeout", "300", "--drain", "1", "--ack-wait", "30")
    try:

        async def wedged() -> bool:  # step 0 served from the record, the live tool of step 1 in its thread
            found = await branch(client, req)
            return found is not None and found[0][-1] == "tool.called" and bool(containers_of(docker, proc.pid))

        await eventually(wedged, timeout=90, interval=0.3)
        await asyncio.sleep(1.0)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 90)
        stopped_in = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = log.read_text()
    assert code == 0, out  # the worker had finished: only the wedged thread held the exit
    assert 1 + 30 <= stopped_in < 1 + 30 + 15, stopped_in
    assert "exiting now" in out
    assert containers_of(docker, proc.pid) == []
    found = await branch(client, req)
    assert found is not None and found[1].status == "running"  # left for redelivery
