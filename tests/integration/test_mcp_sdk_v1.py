"""``runledger[mcp]`` beside a user's MCP server written for the ``mcp`` SDK 1.x (FastMCP), as a
user installs it: ``pip install 'mcp<2' 'runledger[mcp]'`` (this repository's wheel) into a fresh
venv resolves to mcp 1.x, and the venv's own ``runledger run`` / ``resume`` record an agent whose
tools are that server's (tests/mcp_agents/v1/: a read tool, a destructive one keyed), over stdio and
streamable HTTP. The dev venv tests 2.x (tests/integration/test_mcp.py); this is the other major.

Cost: the wheel and the venv (~40 s here, the index reached through pip as configured), then a few
seconds a run."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.installs import Venv, build_wheel, make_venv

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
DESK = Path(__file__).resolve().parents[1] / "mcp_agents" / "v1"
AGENT = "desk_agent:spec"


@pytest.fixture(scope="module")
def v1(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    root = tmp_path_factory.mktemp("mcp-v1")
    wheel = build_wheel(root / "wheel")
    venv = make_venv(root / "venv", "mcp>=1.24,<2", root / "work", f"runledger[mcp] @ {wheel.as_uri()}")
    for name in ("desk_server.py", "desk_agent.py"):
        shutil.copy(DESK / name, venv.workdir / name)
    return venv


def witnessed(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def env(v1: Venv, nats_url: str, tmp_path: Path) -> dict[str, str]:
    return {"RUNLEDGER_NATS_URL": nats_url, "RUNLEDGER_MASTER_KEY": os.environ["RUNLEDGER_MASTER_KEY"],
            "RUNLEDGER_HOME": str(tmp_path / "home"), "DESK_WITNESS": str(tmp_path / "witness.jsonl")}  # fmt: skip


@pytest.fixture
def http_desk(v1: Venv, env: dict[str, str]) -> Iterator[str]:
    port = free_port()
    server = v1.popen("python", "desk_server.py", "http", str(port), **env)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "the FastMCP 1.x server did not listen"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.kill()
        server.communicate()


def test_the_mcp_extra_installs_beside_mcp_1x(v1: Venv) -> None:
    done = v1.python("import importlib.metadata as md, mcp.server.fastmcp; print(md.version('mcp'))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("1."), done.stdout


def test_a_fastmcp_1x_servers_tools_are_recorded_over_stdio_and_a_killed_run_resumes(
    v1: Venv, env: dict[str, str], tmp_path: Path
) -> None:
    mark = tmp_path / "found"
    run = v1.popen("runledger", "run", "--agent", AGENT, "--input", '{"ticket": "T-1"}', "--run-id", "desk-1",
                   DESK_MARK=str(mark), **env)  # fmt: skip
    deadline = time.monotonic() + 60
    while not mark.exists():
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()
        time.sleep(0.05)
    run.kill()
    run.communicate()
    resumed = v1.run("runledger", "resume", "desk-1", "--agent", AGENT, **env)
    assert resumed.returncode == 0, resumed.stderr
    output = json.loads(resumed.stdout.splitlines()[-1])
    assert output["listed"] == ["close_ticket", "find_ticket"]
    assert output["found"] == {"ticket": "T-1", "status": "open"}
    # The read ran once (the resume served it from the record); the destructive tool is an effect,
    # its key (from the key function) sent in the call's _meta.
    assert witnessed(Path(env["DESK_WITNESS"])) == [
        {"tool": "find_ticket", "args": {"ticket": "T-1"}, "key": None},
        {"tool": "close_ticket", "args": {"ticket": "T-1"}, "key": "close:T-1"},
    ]
    assert output["closed"] == {"closed": "T-1", "key": "close:T-1"}
    # FastMCP 1.x logs every request on stderr: into the run's log file, not the CLI's output.
    assert "Processing request of type" not in resumed.stdout + resumed.stderr
    log = Path(env["RUNLEDGER_HOME"]) / "logs" / "mcp" / "desk-1.log"
    assert "Processing request of type CallToolRequest" in log.read_text()


def test_a_fastmcp_1x_servers_tools_are_recorded_over_http(v1: Venv, env: dict[str, str], http_desk: str) -> None:
    done = v1.run("runledger", "run", "--agent", AGENT, "--input", '{"ticket": "T-2"}', "--run-id", "desk-2",
                  DESK_URL=http_desk, **env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["closed"] == {"closed": "T-2", "key": "close:T-2"}
    assert [c["tool"] for c in witnessed(Path(env["DESK_WITNESS"]))] == ["find_ticket", "close_ticket"]
