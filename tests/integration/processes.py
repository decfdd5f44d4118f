"""The CLI and agents in processes of their own, as the crash tests drive them (SIGKILL, SIGSTOP)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _env(url: str, env: dict[str, str] | None) -> dict[str, str]:
    return {**os.environ, "RUNLEDGER_NATS_URL": url, **(env or {})}


def runledger(
    url: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``runledger ARGS`` against the server at ``url``, run to its end (at most ``timeout`` seconds)."""
    return subprocess.run(
        [sys.executable, "-m", "runledger", *args], cwd=ROOT, env=_env(url, env),
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def start_agent(url: str, agent: str, run_id: str, input_json: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """``runledger run`` of ``agent`` as run ``run_id``, started and left running (to be killed or waited for)."""
    return subprocess.Popen(
        [sys.executable, "-m", "runledger", "run", "--agent", agent, "--run-id", run_id, "--input", input_json],
        cwd=ROOT, env=_env(url, env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_for(path: Path, timeout: float) -> None:
    """Wait until ``path`` exists (a marker an agent writes at a known moment)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout}s")
        time.sleep(0.005)
