"""Where a stdio MCP server's stderr (its log lines) goes when ``runledger run`` and ``resume`` drive
an agent that spawns it: not into the CLI's output, but into a log file of the run under the
runledger home (``logs/mcp/<run id>.log``, named once on the CLI's stderr), or where
``$RUNLEDGER_MCP_STDERR`` says.

The agent is tests/mcp_agents/agent.py over stdio; its server (tests/mcp_agents/server.py) writes
``runledger-test-shop: executing TOOL`` on stderr for every call it executes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.mcp_agents.agent import SERVER_SCRIPT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
ROOT = SERVER_SCRIPT.parents[2]
RUNLEDGER = str(Path(sys.executable).with_name("runledger"))
AGENT = "tests.mcp_agents.agent:spec"
SERVER_LINE = "runledger-test-shop: executing"


def environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    dropped = ("RUNLEDGER_HOME", "RUNLEDGER_MCP_STDERR")
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("MCP_")}
    return {**env, "RUNLEDGER_HOME": str(tmp_path / "home"), "MCP_WITNESS": str(tmp_path / "witness.jsonl"), **extra}


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RUNLEDGER, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=90)


def test_a_stdio_servers_log_lines_go_to_the_runs_log_file_named_once_not_into_the_cli_output(
    nats_url: str, tmp_path: Path
) -> None:
    mark = tmp_path / "mark"
    env = environment(tmp_path)
    # `runledger run`, held after the lookup (the server spawned and listed, one tool executed), killed there.
    run = subprocess.Popen(
        [RUNLEDGER, "run", "--nats", nats_url, "--agent", AGENT, "--input", '{"order": "A1"}', "--run-id", "mcp-log-1"],
        cwd=ROOT, env={**env, "MCP_AGENT_MARK": str(mark)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not mark.exists():
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()
        time.sleep(0.05)
    run.kill()
    run_out, run_err = run.communicate()
    resumed = cli(env, "resume", "mcp-log-1", "--nats", nats_url, "--agent", AGENT)
    assert resumed.returncode == 0, resumed.stderr

    log = tmp_path / "home" / "logs" / "mcp" / "mcp-log-1.log"
    outputs = run_out + run_err + resumed.stdout + resumed.stderr
    assert SERVER_LINE not in outputs, outputs
    # Both spawns (the run's, the resume's: it lists the server before its first live call) wrote there.
    assert [line.split()[-1] for line in log.read_text().splitlines() if SERVER_LINE in line] == [
        "lookup_order", "refund", "add_note",
    ]  # fmt: skip
    # Named once by each command, on its stderr.
    assert run_err.count(str(log)) == 1 and resumed.stderr.count(str(log)) == 1, run_err + resumed.stderr


def test_runledger_mcp_stderr_sends_the_servers_log_lines_where_it_names(nats_url: str, tmp_path: Path) -> None:
    chosen = tmp_path / "chosen" / "shop.log"
    env = environment(tmp_path, RUNLEDGER_MCP_STDERR=str(chosen))
    done = cli(env, "run", "--nats", nats_url, "--agent", AGENT, "--input", '{"order": "B2"}', "--run-id", "mcp-log-2")
    assert done.returncode == 0, done.stderr
    assert SERVER_LINE not in done.stdout + done.stderr
    assert done.stderr.count(str(chosen)) == 1, done.stderr
    assert chosen.read_text().count(SERVER_LINE) == 3
    assert not (tmp_path / "home" / "logs").exists()
