"""Crash points read RUNLEDGER_CRASH_AT / RUNLEDGER_CRASH_SKIP once, from the environment of the
process a test starts: the process is killed at the named point after SKIP passes, never elsewhere."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

SCRIPT = """
from runledger.sdk.crashpoints import crash_point
for i in range(5):
    crash_point("step:0:recorded")
    crash_point("step:1:recorded")
    print(i, flush=True)
"""


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RUNLEDGER_CRASH")}
    return subprocess.run([sys.executable, "-c", SCRIPT], env={**clean, **env}, capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def test_killed_at_the_named_point_after_the_skipped_passes() -> None:
    done = _run({"RUNLEDGER_CRASH_AT": "step:1:recorded", "RUNLEDGER_CRASH_SKIP": "2"})
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.split() == ["0", "1"]


def test_killed_at_the_first_pass_without_a_skip() -> None:
    done = _run({"RUNLEDGER_CRASH_AT": "step:0:recorded"})
    assert done.returncode == -signal.SIGKILL
    assert done.stdout == ""


def test_never_killed_without_the_variable_or_at_another_name() -> None:
    for env in ({}, {"RUNLEDGER_CRASH_AT": "step:9:recorded"}):
        done = _run(env)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["0", "1", "2", "3", "4"]
