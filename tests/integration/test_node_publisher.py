"""The Node reference publisher (clients/node, written from docs/wire.md) against the Python side.

It writes a complete run with an effect claim to a real server; Python then verifies its chain,
folds and projects it, and a Python agent using the same idempotency key does not act again.
Without node or the npm dependencies (``npm ci`` in clients/node) the test skips, except under
``CI=true``, where it fails."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runledger.log.client import LedgerClient
from runledger.ops.verify import verify_runs
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from runledger.sdk.agent import AgentSpec
from runledger.sdk.lifecycle import start_run
from runledger.sdk.models import ScriptedModel
from runledger.sdk.tools import tool
from tests.conftest import unavailable

pytestmark = pytest.mark.integration

NODE_DIR = Path(__file__).parents[2] / "clients" / "node"
AGENT = "node-agent"


def _node() -> str:
    node = shutil.which("node")
    missing = None if node else "node is not installed"
    if node and not (NODE_DIR / "node_modules" / "nats" / "package.json").exists():
        missing = "the npm dependencies are not installed (npm ci in clients/node)"
    if missing:
        unavailable(f"{missing}: CI must run the Node publisher (.ci/run installs it)")
    assert node is not None
    return node


def _run_node(*args: str) -> dict[str, Any]:
    done = subprocess.run([_node(), "publish.mjs", *args], cwd=NODE_DIR, capture_output=True, text=True, timeout=60)
    if done.returncode not in (0, 3):
        sys.stderr.write(done.stderr)
        raise AssertionError(f"node publish.mjs failed ({done.returncode}): {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_node_replays_the_vectors() -> None:
    report = _run_node("--check-vectors", str(NODE_DIR.parents[1] / "tests" / "vectors"))
    assert report["failures"] == [] and report["checked"] > 40


async def test_a_node_run_verifies_projects_and_its_effect_is_never_repeated(
    client: LedgerClient, nats_url: str, tmp_path: Path
) -> None:
    key = "refund:order-node-1"
    out = _run_node("--server", nats_url, "--agent", AGENT, "--run-id", "noderun1", "--key", key)
    assert out["claimed"] is True

    (result,) = await verify_runs(client, "noderun1")
    assert result.ok, result.problems
    assert result.chain_format == 2 and result.events == 6
    cp = fold((await load_run(client, "noderun1", open_content=False)).records)
    assert cp.status == "completed" and cp.chain_format == 2 and key in cp.committed_keys
    assert cp.steps[2].status == "committed" and cp.last_hash == out["last_hash"]

    import duckdb

    from runledger.projections.projector import project

    db = tmp_path / "ledger.duckdb"
    await project(client, db)
    with duckdb.connect(str(db), read_only=True) as con:
        (status,) = con.execute("SELECT status FROM runs WHERE run_id = 'noderun1'").fetchone() or (None,)
        kinds = [r[0] for r in con.execute("SELECT kind FROM steps WHERE run_id = 'noderun1' ORDER BY step").fetchall()]
    assert status == "completed" and kinds == ["model", "tool", "effect"]

    calls: list[dict[str, Any]] = []

    @tool("refund", effect="irreversible", key=lambda a: f"refund:{a['order']}")
    def refund(args: dict[str, Any]) -> dict[str, Any]:
        calls.append(args)
        return {"refund_id": "python", "amount": args["amount"]}

    async def agent(run: Any) -> Any:
        return await run.tool("refund", {"order": "order-node-1", "amount": 12.5})

    spec = AgentSpec(AGENT, agent, ScriptedModel([]), tools=[refund])
    py = await start_run(client, spec, None, run_id="pyrun1")
    assert calls == []  # the Node run's committed claim answered it
    assert py.status == "completed" and py.output == {"refund_id": f"rf-{out['fencing_token']}", "amount": 12.5}
    (py_result,) = await verify_runs(client, "pyrun1")
    assert py_result.ok and py_result.chain_format == 2
