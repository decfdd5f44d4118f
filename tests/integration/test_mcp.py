"""MCP tools recorded as steps (runledger.integrations.mcp), against a real MCP server process.

The server (tests/mcp_agents/server.py, the mcp SDK's MCPServer) appends every tool call it executes
to a witness file: the counts below are the server's own, not the agent's. Each test runs over stdio
(the agent spawns the server) and over streamable HTTP (the test starts the server, which outlives
the agents it kills). The agents run as `runledger run` / `runledger resume` processes."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runledger.cli.exits import Exit
from tests.integration.processes import ROOT, runledger, start_agent, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
AGENT = "tests.mcp_agents.agent:spec"
SERVER = ROOT / "tests" / "mcp_agents" / "server.py"


def executed(witness: Path, tool: str | None = None) -> list[dict[str, Any]]:
    """The calls the server executed (its own log), of ``tool`` or all."""
    if not witness.exists():
        return []
    lines = [json.loads(x) for x in witness.read_text().splitlines() if x.strip()]
    return [x for x in lines if tool is None or x["tool"] == tool]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Shop:
    """The MCP server as a test drives it: over stdio the agent spawns it with this environment;
    over HTTP it is a process of the test's, restartable with another schema."""

    def __init__(self, transport: str, tmp_path: Path) -> None:
        self.transport = transport
        self.witness = tmp_path / "witness.jsonl"
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.down = False

    def start(self, schema: str = "v1", delay_s: float = 0.0) -> None:
        """(Re)start the server (HTTP), or set what the agents' next spawn gets (stdio)."""
        self.stop()
        self.schema, self.delay_s, self.down = schema, delay_s, False
        if self.transport != "http":
            return
        port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER), "http", str(port)], cwd=ROOT, env={**os.environ, **self._server_env()},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{port}/mcp"
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the MCP server did not listen on {port}") from None
                time.sleep(0.05)

    def take_down(self) -> None:
        """Stop the server (HTTP: the agents' URL then refuses connections; stdio: a spawned server
        exits before it serves anything)."""
        self.stop()
        self.down = True

    def _server_env(self) -> dict[str, str]:
        env = {"MCP_WITNESS": str(self.witness), "MCP_SCHEMA": self.schema, "MCP_REFUND_DELAY_S": str(self.delay_s)}
        return {**env, "MCP_SERVER_DOWN": "1"} if self.down else env

    def agent_env(self, **extra: str) -> dict[str, str]:
        """The environment of an agent process reaching this server."""
        env = {"MCP_TEST_URL": self.url} if self.transport == "http" else self._server_env()
        return {**env, **extra}

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture(params=["stdio", "http"])
def shop(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Shop]:
    server = Shop(request.param, tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def checkpoint(url: str, run_id: str) -> dict[str, Any]:
    shown = runledger(url, "checkpoint", run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    found: dict[str, Any] = json.loads(shown.stdout)
    return found


def resume(url: str, run_id: str, shop: Shop) -> subprocess.CompletedProcess[str]:
    return runledger(url, "resume", run_id, "--agent", AGENT, env=shop.agent_env())


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def test_a_destructive_tool_killed_after_its_call_runs_once_across_the_resume(
    nats_url: str, shop: Shop, tmp_path: Path
) -> None:
    # The server executes the refund, logs it, then waits 3 s before answering: the agent is killed
    # in that window, so its claim has no outcome; the resume settles it with the server's word
    # (the refund's reconcile asks the server's find_refund) instead of refunding again.
    shop.start(delay_s=3.0)
    agent = start_agent(nats_url, AGENT, "mcp-kill", json.dumps({"order": "A1"}), shop.agent_env())
    try:
        deadline = time.monotonic() + 60
        while not executed(shop.witness, "refund"):
            assert agent.poll() is None, agent.communicate()
            assert time.monotonic() < deadline, "the refund never reached the server"
            time.sleep(0.01)
    finally:
        kill(agent)
    assert checkpoint(nats_url, "mcp-kill")["status"] == "running"
    shop.start()  # HTTP: the same server, answering at once now (stdio: the resume spawns its own)

    resumed = resume(nats_url, "mcp-kill", shop)
    assert resumed.returncode == 0, resumed.stderr
    assert "run mcp-kill: completed" in resumed.stdout
    assert len(executed(shop.witness, "refund")) == 1, executed(shop.witness)
    assert len(executed(shop.witness, "lookup_order")) == 1  # answered from the record on resume
    assert len(executed(shop.witness, "add_note")) == 1
    cp = checkpoint(nats_url, "mcp-kill")
    assert cp["status"] == "completed"
    assert sorted(cp["committed_keys"]) == ["note:A1", "refund:A1"]
    assert cp["output"]["paid"]["refunded"] == 5 and cp["output"]["paid"]["key"] == "refund:A1"
    assert cp["output"]["listed"] == ["add_note", "echo", "find_refund", "keep", "lookup_order", "refund"]


@pytest.mark.parametrize("shop", ["http"], indirect=True)
def test_without_a_reconcile_the_refund_killed_in_flight_is_in_doubt_and_not_called_again(
    nats_url: str, shop: Shop, tmp_path: Path
) -> None:
    shop.start(delay_s=3.0)
    env = shop.agent_env(MCP_NO_RECONCILE="1")
    agent = start_agent(nats_url, AGENT, "mcp-doubt", json.dumps({"order": "A1"}), env)
    try:
        deadline = time.monotonic() + 60
        while not executed(shop.witness, "refund"):
            assert agent.poll() is None and time.monotonic() < deadline, "the refund never reached the server"
            time.sleep(0.01)
    finally:
        kill(agent)
    shop.start()
    resumed = runledger(nats_url, "resume", "mcp-doubt", "--agent", AGENT, env=shop.agent_env(MCP_NO_RECONCILE="1"))
    assert "run mcp-doubt: suspended (effect_in_doubt)" in resumed.stdout, (resumed.stdout, resumed.stderr)
    assert "runledger effects resolve refund:A1" in resumed.stdout  # what to do next
    assert len(executed(shop.witness, "refund")) == 1
    assert not executed(shop.witness, "add_note")  # the run stopped at the refund
    assert checkpoint(nats_url, "mcp-doubt")["status"] == "suspended"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("shop", ["stdio"], indirect=True)  # the named kill above covers HTTP; these are slow
def test_killed_at_random_moments_each_refund_runs_exactly_once(nats_url: str, shop: Shop, tmp_path: Path) -> None:
    # Kill moments drawn from the measured duration of a whole run of this agent, then resume.
    started = time.monotonic()
    whole = start_agent(nats_url, AGENT, "mcp-whole", json.dumps({"order": "W0"}), shop.agent_env())
    assert whole.wait(timeout=120) == 0, whole.communicate()
    duration = time.monotonic() - started
    rng = random.Random(int(os.environ.get("MCP_KILL_SEED", "30")))
    for n in range(2):
        order, run_id = f"R{n}", f"mcp-random-{n}"
        agent = start_agent(nats_url, AGENT, run_id, json.dumps({"order": order}), shop.agent_env())
        time.sleep(rng.uniform(0.3 * duration, duration))
        kill(agent)
        resumed = resume(nats_url, run_id, shop)
        if resumed.returncode != 0 and f"no run {run_id!r}" in resumed.stderr:  # killed before run.started
            resumed = runledger(nats_url, "run", "--agent", AGENT, "--run-id", run_id, "--input",
                                json.dumps({"order": order}), env=shop.agent_env())  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr
        refunds = [x for x in executed(shop.witness, "refund") if x["args"]["order"] == order]
        assert len(refunds) == 1, (n, refunds)
        assert checkpoint(nats_url, run_id)["status"] == "completed"


def test_a_server_whose_tools_changed_is_refused_at_resume_as_a_version_change(
    nats_url: str, shop: Shop, tmp_path: Path
) -> None:
    mark = tmp_path / "looked-up"
    # Killed after the lookup was recorded and before the refund: a run to resume.
    agent = start_agent(nats_url, AGENT, "mcp-v", json.dumps({"order": "A1"}),
                        shop.agent_env(MCP_AGENT_MARK=str(mark)))  # fmt: skip
    try:
        wait_for(mark, 60)
    finally:
        kill(agent)
    assert not executed(shop.witness, "refund")

    shop.start(schema="v2")  # refund now takes a required reason: another input schema
    steps = checkpoint(nats_url, "mcp-v")["steps"]
    refused = resume(nats_url, "mcp-v", shop)  # the lookup replays; the server is listed before the refund
    assert refused.returncode == Exit.REFUSED, (refused.stdout, refused.stderr)
    assert "different version tuple" in refused.stderr and "tool_schema_hashes" in refused.stderr, refused.stderr
    assert not executed(shop.witness, "refund")  # nothing was called
    cp = checkpoint(nats_url, "mcp-v")
    assert cp["status"] == "running" and cp["steps"] == steps  # nothing of the refund was written

    shop.start()  # the server as recorded: the resume goes on
    resumed = resume(nats_url, "mcp-v", shop)
    assert resumed.returncode == 0, resumed.stderr
    assert len(executed(shop.witness, "refund")) == 1
    assert len(executed(shop.witness, "lookup_order")) == 1


def test_a_resume_needs_the_server_only_when_a_tool_call_is_left_to_make(
    nats_url: str, shop: Shop, tmp_path: Path
) -> None:
    # Held after the lookup was recorded, before the refund, and killed: a run with live calls left.
    mark = tmp_path / "looked-up"
    agent = start_agent(nats_url, AGENT, "mcp-down", json.dumps({"order": "A1"}),
                        shop.agent_env(MCP_AGENT_MARK=str(mark)))  # fmt: skip
    try:
        wait_for(mark, 60)
    finally:
        kill(agent)

    shop.take_down()
    steps = checkpoint(nats_url, "mcp-down")["steps"]
    refused = resume(nats_url, "mcp-down", shop)  # the refund must go to the server: it is needed
    assert refused.returncode == Exit.ERROR, (refused.stdout, refused.stderr)
    assert "cannot list the tools of the MCP server" in refused.stderr, refused.stderr
    cp = checkpoint(nats_url, "mcp-down")
    assert cp["status"] == "running" and cp["steps"] == steps  # stopped before anything of the refund was written
    assert not executed(shop.witness, "refund")

    shop.start()
    resumed = resume(nats_url, "mcp-down", shop)
    assert resumed.returncode == 0, resumed.stderr
    calls = executed(shop.witness)
    assert [c["tool"] for c in calls] == ["lookup_order", "refund", "add_note"]

    # Completed: nothing is left to call, so nothing is listed either, with the server stopped.
    shop.take_down()
    again = resume(nats_url, "mcp-down", shop)
    assert again.returncode == 0, again.stderr
    assert "run mcp-down is completed: nothing to do" in again.stdout, again.stdout
    assert executed(shop.witness) == calls
    cp = checkpoint(nats_url, "mcp-down")
    assert cp["status"] == "completed" and cp["output"]["paid"]["refunded"] == 5


async def test_a_resume_whose_calls_left_are_all_recorded_needs_no_server(
    nats_url: str, client: Any, shop: Shop, tmp_path: Path
) -> None:
    from runledger.ops.decisions import approve
    from runledger.protect.loading import load_run
    from runledger.record.fold import fold

    # Held after its last tool call was recorded, before its approval, and killed: every call the
    # agent has left to make is in the record, the listing its tools were declared from too.
    mark = tmp_path / "noted"
    env = shop.agent_env(MCP_AGENT_MARK=str(mark), MCP_AGENT_HOLD_AFTER="note", MCP_AGENT_APPROVAL="1")
    agent = start_agent(nats_url, AGENT, "mcp-recorded", json.dumps({"order": "A1"}), env)
    try:
        wait_for(mark, 60)
    finally:
        kill(agent)
    calls = executed(shop.witness)
    assert [c["tool"] for c in calls] == ["lookup_order", "refund", "add_note"]

    shop.take_down()
    env = shop.agent_env(MCP_AGENT_APPROVAL="1")
    # Replayed, the listing included, to the approval, which suspends the run: nothing went to the server.
    waiting = runledger(nats_url, "resume", "mcp-recorded", "--agent", AGENT, env=env)
    assert waiting.returncode == Exit.SUSPENDED, (waiting.stdout, waiting.stderr)
    assert "run mcp-recorded: suspended (approval)" in waiting.stdout, waiting.stdout
    still = runledger(nats_url, "resume", "mcp-recorded", "--agent", AGENT, env=env)  # nothing to drive
    assert still.returncode == Exit.SUSPENDED, (still.stdout, still.stderr)

    [request] = fold((await load_run(client, "mcp-recorded")).records).pending_approvals
    await approve(client, "mcp-recorded", request, by="op")
    done = runledger(nats_url, "resume", "mcp-recorded", "--agent", AGENT, env=env)
    assert done.returncode == Exit.OK, (done.stdout, done.stderr)
    assert "run mcp-recorded: completed" in done.stdout, done.stdout
    assert executed(shop.witness) == calls  # nothing was called again
    cp = fold((await load_run(client, "mcp-recorded")).records)
    assert cp.status == "completed" and cp.output["paid"]["refunded"] == 5
    listed = ["add_note", "echo", "find_refund", "keep", "lookup_order", "refund"]
    assert cp.output["listed"] == listed  # the listing the record kept
    assert [entry["source"] for entry in cp.tool_listings] == ["mcp"]


async def test_the_example_closes_its_ticket_once_and_a_resume_reads_it_from_the_record(
    client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runledger.examples.mcp_tools.agent import spec
    from runledger.sdk.lifecycle import resume_run, start_run

    monkeypatch.chdir(tmp_path)  # the example's server keeps its tickets in the working directory
    result = await start_run(client, spec(), "T-1", run_id="mcp-example")
    assert result.status == "completed", result.error
    assert result.output == "closed T-1"
    assert json.loads((tmp_path / "tickets.json").read_text())["T-1"]["status"] == "closed"
    (tmp_path / "tickets.json").unlink()
    again = await resume_run(client, spec(), "mcp-example")
    assert again.status == "completed" and again.output == "closed T-1"
    assert not (tmp_path / "tickets.json").exists()  # nothing was called again
