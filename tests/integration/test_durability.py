"""Write-ahead, as README.md states it: "a step returns only after the server acknowledged its
event; the embedded server fsyncs before acking (`sync_interval: always`)".

Two independent witnesses for the fsync setting: the configuration file the running server
was started with (read back through /proc, parsed from its ``jetstream`` block), and what
nats-server itself reports in /varz (``sync_always``) after loading that very file; the cluster
nodes are asked through their own monitoring ports. Then the consequence: a step acknowledged to
the agent survives a SIGKILL of nats-server and is not run again by the resume.

A SIGKILL of the server process keeps what the OS already holds, so it cannot tell an fsync from
a write to the page cache; the power-loss half of the guarantee rests on the setting checked above.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from runledger import AgentSpec, PublishError, Run, ScriptedModel
from runledger.log.client import connect
from runledger.log.cluster import ClusterState, LocalCluster
from runledger.log.publish import RetryPolicy
from runledger.log.server import EmbeddedServer, free_port, nats_server_binary
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from runledger.sdk.lifecycle import resume_run, start_run
from tests.conftest import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def jetstream_block(config: str) -> str:
    match = re.search(r"^jetstream\s*\{(.*?)^\}", config, flags=re.MULTILINE | re.DOTALL)
    assert match, f"no jetstream block in:\n{config}"
    return match.group(1)


def config_of(pid: int) -> Path:
    """The -c file of a running nats-server, from its command line."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return Path(argv[argv.index("-c") + 1])


def varz(monitor_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor_port}/varz", timeout=5) as resp:
        result: dict[str, Any] = json.loads(resp.read())
    return result


def varz_of_config(config: Path) -> dict[str, Any]:
    """/varz of a nats-server that loaded ``config`` unchanged (a client and a monitoring port
    given on the command line; the server that used the file must be stopped: same store dir)."""
    monitor = free_port()
    proc = subprocess.Popen(
        [nats_server_binary(), "-c", str(config), "-p", str(free_port()), "-m", str(monitor)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 15
        while True:
            assert proc.poll() is None, f"nats-server refused {config}"
            try:
                return varz(monitor)
            except OSError:
                assert time.monotonic() < deadline, "the probe server never answered /varz"
                time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_embedded_server_fsyncs_before_every_ack(tmp_path: Path) -> None:
    """What `runledger up` starts (EmbeddedServer): its config, then nats-server's reading of it."""
    server = EmbeddedServer(home=tmp_path / "home")
    state = server.start(data_dir=tmp_path / "data")
    try:
        config = config_of(state.pid)
    finally:
        server.stop()
    block = jetstream_block(config.read_text())
    assert re.search(r"^\s*sync_interval:\s*always\s*$", block, flags=re.MULTILINE), block
    reported = varz_of_config(config)["jetstream"]["config"]
    assert reported["sync_always"] is True, reported


def test_every_cluster_node_fsyncs_before_every_ack(cluster: tuple[LocalCluster, ClusterState]) -> None:
    _, state = cluster
    for node in state.nodes:
        block = jetstream_block(config_of(node.pid).read_text())
        assert re.search(r"^\s*sync_interval:\s*always\s*$", block, flags=re.MULTILINE), (node.name, block)
        reported = varz(node.monitor_port)["jetstream"]["config"]
        assert reported["sync_always"] is True, (node.name, reported)


async def test_an_acknowledged_step_survives_a_sigkill_of_the_server(tmp_path: Path) -> None:
    """The agent's second step has returned (its event acknowledged): nats-server is SIGKILLed
    right then, with no chance to flush anything, and the third step cannot be recorded. Started
    again on the same data dir, the log holds both acknowledged steps; the resume serves them
    without running their tools again and runs only the unacknowledged third step."""
    server = EmbeddedServer(home=tmp_path / "home")
    state = server.start(data_dir=tmp_path / "data")
    ran: list[str] = []

    def call(name: str) -> Any:
        return lambda args: ran.append(name) or {name: args}

    async def agent(run: Run) -> Any:
        first = await run.tool("charge", {"n": 1}, fn=call("charge"))
        second = await run.tool("mail", {"to": "x"}, fn=call("mail"))
        if server.state() is not None and server.state().pid == state.pid:
            os.kill(state.pid, signal.SIGKILL)  # both steps acknowledged: now the server dies
            await eventually(lambda: server.state() is None)
        third = await run.tool("note", {}, fn=call("note"))
        return [first, second, third]

    spec = AgentSpec("durable", agent, ScriptedModel([]), agent_version="v1")
    try:
        async with await connect(state.url) as client:
            with pytest.raises(PublishError):
                await start_run(client, spec, None, run_id="durable-1", policy=RetryPolicy(2.0, ack_timeout_s=0.5))
        assert ran == ["charge", "mail", "note"]
        restarted = server.start(data_dir=tmp_path / "data", port=state.port)
        assert restarted.pid != state.pid
        async with await connect(restarted.url) as client:
            steps = fold((await load_run(client, "durable-1")).records).steps
            recorded = [(s.name, s.output) for s in steps.values()]
            assert recorded == [("charge", {"charge": {"n": 1}}), ("mail", {"mail": {"to": "x"}})]
            resumed = await resume_run(client, spec, "durable-1")
        assert ran == ["charge", "mail", "note", "note"], "only the unacknowledged step runs again"
        assert resumed.status == "completed" and resumed.output[:2] == [{"charge": {"n": 1}}, {"mail": {"to": "x"}}]
    finally:
        server.stop()
