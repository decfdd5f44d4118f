"""docs/tutorial.md runs as written: its ```bash blocks, in order, in one shell (set -euo pipefail) with
the venv on PATH, in a fresh RUNLEDGER_HOME (its own embedded server) and a working directory of its own.
A command that fails fails the test, naming the output; so the tutorial cannot rot."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.timeout(900)]
REPO = Path(__file__).resolve().parents[3]
TUTORIAL = REPO / "docs" / "tutorial.md"


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M)


def test_every_command_of_the_tutorial_runs(sandbox_image: str, tmp_path: Path) -> None:
    blocks = bash_blocks(TUTORIAL.read_text())
    assert len(blocks) >= 6, "the tutorial lost its commands"
    script = "set -euo pipefail\n" + "\n".join(blocks)
    env = {**os.environ, "RUNLEDGER_HOME": str(tmp_path / "home"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # fmt: skip
    env.pop("RUNLEDGER_NATS_URL", None)
    work = tmp_path / "work"
    work.mkdir()
    # Where the reader stands when they start: a project with tests of its own, which the tutorial's
    # pytest must not collect (it works in a directory of its own).
    (work / "test_the_project.py").write_text("def test_not_the_tutorials():\n    raise AssertionError('collected')\n")
    try:
        done = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=840)
    finally:
        subprocess.run([sys.executable, "-m", "runledger", "down"], env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, f"the tutorial failed:\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
    out = done.stdout
    assert "refund-agent" in out or "completed" in out
    # What the text promises: the matrix names the fix, the gate opens with a JUnit report.
    assert re.search(r"model=runledger\.examples\.refund_agent\.agent:strict_model: fixed 2", out), out[-4000:]
    assert "gate: open" in out and "0 regressed" in out, out[-4000:]
    assert "1 passed" in out and "collected" not in out, out[-4000:]
    assert "replay of the fixed agent: diverges at step 0" in out, out[-4000:]
    # The plan invents no branch id and runs nothing; classes and samples as the text says.
    plan = out[out.index("re-run plan of") :]
    assert "branch br-" not in plan.splitlines()[0] and "queue it" not in plan, plan[:2000]
    assert "nothing ran, nothing was queued (--plan)" in plan, plan[:2000]
    assert "still_failing" in out and "still failing, allowed (--allow-still-failing)" in out, out[-4000:]
    assert "[fixed 3/3, baseline steady]" in out and "fix rate: 3/3 samples over 1 runs" in out, out[-4000:]
    suite = ET.parse(work / "runledger-tutorial" / "gate.xml").getroot()[0]
    assert suite.get("failures") == "0" and int(suite.get("tests") or 0) == 4
