"""Hostile replayed content and hostile agent code: contained, reported, nothing committed,
no container left behind, and the same pool keeps serving."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from runledger.log.client import LedgerClient
from runledger.protect.loading import load_run
from runledger.protect.redaction import Redactor
from runledger.record.fold import fold
from runledger.sandbox.containers import Sandbox, SandboxPolicy, SandboxPool
from runledger.sandbox.rerun import Rerunner, RerunRequest
from runledger.sdk.lifecycle import start_run
from tests.sandbox_agents.hostile import benign_spec

pytestmark = [pytest.mark.integration, pytest.mark.docker]
MOD = "tests.sandbox_agents.hostile"
LIMIT_S = 8.0  # the hostile re-runs' wall-clock limit
MEMORY = 128 * 1024 * 1024  # and their memory limit
# From the test's start of a re-run to its container's kill: what the re-run does before its clock starts
# (read the parent, open the branch) and the kill. Less than the limit: a timer twice as long is not in it.
SLACK_S = 5.0


@dataclass(frozen=True)
class Ended:
    """A sandbox's container as the engine saw it just before its removal, asked by the test."""

    state: dict[str, Any]  # docker inspect's State: OOMKilled, Running, ExitCode
    memory: int  # the memory limit the engine enforced (HostConfig.Memory)
    at: float  # time.monotonic() of the removal (for a running container, its kill)


class InspectedPool(SandboxPool):
    """A pool whose every removal first asks the engine how the container ended: the engine's own
    verdict, not the text runledger recorded about it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ended: list[Ended] = []

    async def discard(self, sandbox: Sandbox, state: dict[str, Any] | None = None) -> None:
        at = time.monotonic()
        try:
            attrs = await asyncio.to_thread(self.docker.api.inspect_container, sandbox.container_id)
        except docker.errors.NotFound:
            pass  # removed twice (close() after a re-run's own removal)
        else:
            self.ended.append(Ended(attrs["State"], attrs["HostConfig"]["Memory"], at))
        await super().discard(sandbox, state)


@pytest.fixture
def nats_port(nats_url: str) -> int:
    return int(nats_url.rsplit(":", 1)[1])


@pytest.fixture
async def parent(client: LedgerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nats_port: int) -> str:
    monkeypatch.setenv("TEST_PAYMENTS_LOG", str(tmp_path / "pay.log"))
    # The input names the host's real NATS port: the network probe aims at a server that listens.
    result = await start_run(client, benign_spec(), {"nats_port": nats_port}, run_id="hostile-parent")
    assert result.status == "completed"
    return "hostile-parent"


def paid(tmp_path: Path) -> list[str]:
    log = tmp_path / "pay.log"
    return log.read_text().splitlines() if log.exists() else []


async def test_prompt_injection_in_a_recorded_tool_output_commits_nothing(
    client: LedgerClient, rerunner: Rerunner, parent: str, tmp_path: Path
) -> None:
    assert len(paid(tmp_path)) == 1  # the gullible original obeyed the injection
    result = await rerunner.rerun(RerunRequest(parent_run_id=parent, agent=f"{MOD}:benign_spec", mode="live",
                                               fork_step=0))  # fmt: skip
    assert result.status == "completed"
    assert len(paid(tmp_path)) == 1  # the committed key returns its recorded result; nothing paid again
    other = await start_run(client, benign_spec(), None, run_id="hostile-parent-2")
    assert other.status == "completed"
    assert len(paid(tmp_path)) == 1  # even a new live run cannot pay the same key twice


# An innocuous host variable the redactor leaves as it is (checked): were it visible in the
# sandbox, the recorded error would show it. ``{nats_port}`` is the test's NATS server's port.
CANARY_NAME, CANARY_VALUE = "RL_HOST_CANARY", "teal-harbor-5521"
HOSTILE = [
    ("connect_spec", "exception", ["network attempts", "127.0.0.1:{nats_port}': 'ConnectionRefusedError",
                                   "172.17.0.1:{nats_port}': 'OSError", "1.1.1.1:80': 'OSError"]),
    ("env_spec", "exception", ["environment: [('HOME'", "PYTHONPATH"]),
    ("write_spec", "exception", ["write attempts", "'/tmp/ok.txt': 'WRITTEN'"]),
    # Refused by the pids limit (EAGAIN), not killed at the wall clock (that would be "sandbox").
    ("fork_spec", "exception", ["fork bomb stopped after", "children: EAGAIN"]),
    ("memory_spec", "sandbox", ["memory limit (OOM)"]),
    ("spin_spec", "sandbox", ["wall-clock limit"]),
    ("flood_spec", "sandbox", ["longer than"]),
    ("malformed_spec", "sandbox", ["malformed channel message", "not JSON"]),
]  # fmt: skip


# Two re-runs, each waiting at most the pool's connect timeout (30 s) plus its own (8 s, 60 s).
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("agent", "reason", "fragments"), HOSTILE, ids=[h[0] for h in HOSTILE])
async def test_hostile_agent_code_is_contained_and_reported(
    client: LedgerClient, docker: object, sandbox_image: str, parent: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, agent: str, reason: str, fragments: list[str], nats_port: int,
) -> None:  # fmt: skip
    monkeypatch.setenv("RUNLEDGER_SECRET_TOKEN", "sk-live-should-never-leak")
    monkeypatch.setenv(CANARY_NAME, CANARY_VALUE)
    assert Redactor(os.urandom(32)).redact(f"{CANARY_NAME}={CANARY_VALUE}") == f"{CANARY_NAME}={CANARY_VALUE}"
    policy = SandboxPolicy(image=sandbox_image, timeout_s=LIMIT_S, memory="128m", pids=32)
    pool = InspectedPool(docker, policy, size=0)
    rerunner = Rerunner(client, pool)
    try:
        request = RerunRequest(parent_run_id=parent, agent=f"{MOD}:{agent}", mode="live", fork_step=0,
                               timeout_s=LIMIT_S)  # fmt: skip
        started = time.monotonic()
        result = await rerunner.rerun(request)
        elapsed = time.monotonic() - started
        assert result.status == "failed", result
        assert result.reason == reason, result.error
        await pool.settle()  # a guest that reported its outcome is removed off the re-run's path
        [ended] = pool.ended
        if agent == "memory_spec":  # killed by the kernel for the limit, in the engine's own words
            assert ended.state["OOMKilled"] is True and ended.state["ExitCode"] == 137, ended
        elif agent == "spin_spec":  # still running when the host killed it, at the limit as this test measures it
            assert ended.state["OOMKilled"] is False and ended.state["Running"] is True, ended
            assert LIMIT_S <= ended.at - started < LIMIT_S + SLACK_S, ended.at - started
            assert elapsed < LIMIT_S + SLACK_S, elapsed
        else:
            assert ended.state["OOMKilled"] is False, ended
        assert ended.memory == MEMORY, ended  # the limit the engine enforced was the policy's
        cp = fold((await load_run(client, result.run_id)).records)
        recorded = cp.error or {}
        text = f"{recorded.get('message')}\n{recorded.get('traceback')}"
        for fragment in fragments:
            assert fragment.format(nats_port=nats_port) in text, text[:2000]
        assert "CONNECTED" not in text
        for path in ("/etc/passwd", "/app/evil.py", "/opt/runledger/runledger/__init__.py"):
            assert f"'{path}': 'WRITTEN'" not in text
        assert "sk-live-should-never-leak" not in text
        assert CANARY_NAME not in text and CANARY_VALUE not in text
        assert cp.committed_keys == [] and cp.simulated_keys == []
        assert len(paid(tmp_path)) == 1
        # The same pool keeps serving after the attack.
        honest = await rerunner.rerun(RerunRequest(parent_run_id=parent, agent=f"{MOD}:honest_spec", mode="live",
                                                   fork_step=0))  # fmt: skip
        assert honest.status == "completed" and honest.output == "honest"
    finally:
        await pool.close()
    assert len(pool) == 0
