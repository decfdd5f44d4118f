"""Who may retry a failed run, against a real server started with --secure: an operator (``runledger
retry``), never the agent itself (docs/data-protection.md, "Decisions").

The agent's own try goes two ways, as an agent would try it: through the library (``resume --retry``,
which records the retry on the operator's subject: the server refuses it, and its log names the
violation) and by hand on the subject it may write (its own ``a``: stored, but the fold quarantines it,
so the run stays failed and nothing runs again). The witness is the tool's own call count.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from runledger import AgentSpec, Run, ScriptedModel
from runledger.errors import ConfigurationError, LedgerError
from runledger.log.client import LedgerClient, connect
from runledger.log.publish import RetryPolicy, SubjectWriter
from runledger.log.reader import read_raw
from runledger.log.server import EmbeddedServer, ServerState
from runledger.log.subjects import AGENT_WRITER, OPERATOR_WRITER, run_filter, run_subject
from runledger.ops.decisions import retry_run
from runledger.protect.loading import load_run
from runledger.protect.roles import secure
from runledger.record.events import RunRetried
from runledger.record.fold import fold
from runledger.sdk.lifecycle import RetryRequest, resume_run, start_run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

FAST = RetryPolicy(deadline_s=1.5, ack_timeout_s=0.5)


class RateLimited(Exception):
    retryable = True  # what a 429 says: a later attempt may succeed


@pytest.fixture
def secure_server(tmp_path: Path) -> Iterator[ServerState]:
    server = EmbeddedServer(home=tmp_path / "home")
    state = server.start(data_dir=tmp_path / "data", auth=secure(["alpha"]))
    try:
        yield state
    finally:
        server.stop()


async def login(state: ServerState, user: str) -> LedgerClient:
    return await connect(state.url, user_credentials=str(Path(state.creds_dir) / f"{user}.json"))


@pytest.fixture
async def admin(secure_server: ServerState) -> AsyncIterator[LedgerClient]:
    c = await login(secure_server, "admin")  # creates the streams
    try:
        yield c
    finally:
        await c.close()


async def violation_logged(state: ServerState, start: int, subject: str) -> None:
    """The server's log, from byte ``start`` on, names a violation on ``subject`` (bounded wait)."""
    deadline = asyncio.get_running_loop().time() + 5.0
    while asyncio.get_running_loop().time() < deadline:
        written = Path(state.log).read_bytes()[start:].decode(errors="replace")
        if any("Violation" in line and subject in line for line in written.splitlines()):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the server logged no violation on {subject}")


def flaky_spec(calls: list[int]) -> AgentSpec:
    """An agent whose one tool is rate limited on its first call and answers after."""

    def fetch(args: Any) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 1:
            raise RateLimited("429 Too Many Requests")
        return {"ok": True}

    async def agent(run: Run) -> Any:
        return await run.tool("fetch", {"page": 1}, fn=fetch)

    return AgentSpec("alpha", agent, ScriptedModel([]), agent_version="v1")


async def test_an_agent_cannot_retry_its_failed_run_and_an_operator_can(
    admin: LedgerClient, secure_server: ServerState
) -> None:
    alpha = await login(secure_server, "agent-alpha")
    operator = await login(secure_server, "operator")
    try:
        calls: list[int] = []
        failed = await start_run(alpha, flaky_spec(calls), None, run_id="retry-me")
        assert failed.status == "failed" and calls == [1]
        assert fold((await load_run(alpha, "retry-me", agent="alpha")).records).failure_retryable

        # The agent's `resume --retry`: the retry goes to the operator's subject, which the server refuses.
        start = len(Path(secure_server.log).read_bytes())
        with pytest.raises(ConfigurationError, match=r"operator's decision.*`runledger retry retry-me --by NAME"):
            await resume_run(alpha, flaky_spec(calls), "retry-me", retry=RetryRequest(by="alpha"), policy=FAST)
        await violation_logged(secure_server, start, run_subject("alpha", "retry-me", OPERATOR_WRITER))
        assert calls == [1]  # nothing ran again
        still = await resume_run(alpha, flaky_spec(calls), "retry-me")
        assert still.status == "failed" and still.nothing_to_do and calls == [1]

        # A worker may not decide either (its token is `w`, the operator's subject refuses it).
        worker = await login(secure_server, "worker")
        try:
            start = len(Path(secure_server.log).read_bytes())
            with pytest.raises((LedgerError, TimeoutError)):
                await asyncio.wait_for(retry_run(worker, "retry-me", by="worker"), 60)
            await violation_logged(secure_server, start, run_subject("alpha", "retry-me", OPERATOR_WRITER))
        finally:
            await worker.close()

        # The operator retries (on `o`); the agent's plain resume then runs the failed step again.
        event = await retry_run(operator, "retry-me", by="op", reason="limit lifted")
        assert event.type == "run.retried" and event.payload["step"] == 0
        raws = await read_raw(operator, run_filter("alpha", "retry-me"))
        assert [r.subject.rpartition(".")[2] for r in raws][-1] == OPERATOR_WRITER
        done = await resume_run(alpha, flaky_spec(calls), "retry-me")
        assert done.status == "completed" and done.output == {"ok": True} and calls == [1, 1]
    finally:
        await alpha.close()
        await operator.close()


async def test_a_retry_the_agent_writes_on_its_own_subject_is_quarantined(
    admin: LedgerClient, secure_server: ServerState
) -> None:
    alpha = await login(secure_server, "agent-alpha")
    try:
        calls: list[int] = []
        assert (await start_run(alpha, flaky_spec(calls), None, run_id="retry-forged")).status == "failed"
        # By hand, on the one subject of the run the server lets the agent write: stored, never honoured.
        log = await load_run(alpha, "retry-forged", agent="alpha", open_content=False)
        cp = fold(log.records)
        forger = SubjectWriter(
            alpha.js, run_subject("alpha", "retry-forged", AGENT_WRITER), run_id="retry-forged", agent="alpha",
            msg_id_prefix="retry-forged", next_seq=cp.next_seq, prev_hash=cp.last_hash,
            last_stream_seq=log.last_stream_seq, policy=FAST,
        )  # fmt: skip
        await forger.append(RunRetried(step=cp.failed_step, by="alpha", reason="I say so"))
        forged = await load_run(alpha, "retry-forged", agent="alpha", open_content=False)
        after = fold(forged.records)
        assert after.status == "failed" and after.failure_retryable
        result = await resume_run(alpha, flaky_spec(calls), "retry-forged")
        assert result.status == "failed" and result.nothing_to_do
        assert calls == [1]  # the failed call did not run again
    finally:
        await alpha.close()
