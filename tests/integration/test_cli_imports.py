"""The commands an operator runs all day import the core's dependencies and nothing heavier, against a
real server: ``runs``, ``show``, ``verify``, ``approve`` and ``resume`` load neither DuckDB,
pyarrow, numpy, Docker nor the page. Before, registering the projections' and the sandbox's
sub-commands imported DuckDB, pyarrow and numpy for every command (about a second of CPU each).
``--help`` is checked without a server in tests/unit/test_cli_imports.py.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from runledger.log.client import connect
from runledger.sdk.lifecycle import start_run
from tests.agents import approver_spec
from tests.cli_imports import CORE, HEAVY, Imported, imported_by

pytestmark = pytest.mark.integration

AGENT = "tests.agents:approver_spec"


def _one(argv: list[str], url: str, tmp_path: Path) -> Imported:
    """``runledger ARGV --nats URL`` alone in a fresh interpreter: what it imports is its own."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "RUNLEDGER_HOME": str(tmp_path / "home")}
    [ran] = imported_by([[*argv, "--nats", url]], tmp_path / "report.json", env=env)
    name = f"`runledger {' '.join(argv)}`"
    assert not ran.third_party & HEAVY, f"{name} imported {sorted(ran.third_party & HEAVY)}"
    assert ran.third_party <= CORE, f"{name} imported {sorted(ran.third_party - CORE)}, beyond the core's dependencies"
    assert "nats" in ran.third_party, f"{name} never reached the server: {ran.err}"
    return ran


async def _waiting_run(url: str) -> None:
    """Run ``imports1`` until it waits for an approval (here: the commands under test are the later ones)."""
    client = await connect(url)
    try:
        result = await start_run(client, approver_spec(), {}, run_id="imports1")
    finally:
        await client.close()
    assert result.status == "suspended", result


def test_the_operators_commands_import_only_the_core_s_dependencies(nats_url: str, tmp_path: Path) -> None:
    asyncio.run(_waiting_run(nats_url))
    ran = _one(["runs", "--json"], nats_url, tmp_path)
    [listed] = json.loads(ran.out)
    assert (ran.code, listed["run_id"], listed["status"]) == (0, "imports1", "suspended")
    [request] = listed["pending_approvals"]
    ran = _one(["show", "imports1"], nats_url, tmp_path)
    assert ran.code == 0 and "approval.requested" in ran.out, ran
    ran = _one(["verify"], nats_url, tmp_path)
    assert ran.code == 0 and "1 of 1 runs verified" in ran.out, ran
    ran = _one(["approve", "imports1", request, "--by", "tester"], nats_url, tmp_path)
    assert ran.code == 0 and f"approved {request}" in ran.out, ran
    ran = _one(["resume", "imports1", "--agent", AGENT], nats_url, tmp_path)
    assert ran.code == 0 and "run imports1: completed" in ran.out, ran
