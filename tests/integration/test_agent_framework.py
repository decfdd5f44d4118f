"""RunledgerCheckpointStorage on a real nats-server: Microsoft Agent Framework workflows checkpointed on the ledger.

The framework's own checkpoint cases (tests/agent_framework_cases.py, copied from its repository) run
against the storage; a workflow's checkpoints list and load from a fresh process; its runs read as
any run (``runs``, ``show``, ``verify``, SQL).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from agent_framework import WorkflowCheckpoint

from runledger import FencedError, LedgerClient, connect, fold, load_run
from runledger.integrations.agent_framework import DEFAULT_AGENT, RunledgerCheckpointStorage
from tests import agent_framework_cases as cases
from tests.integration.processes import ROOT, runledger, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CASES = sorted(name for name in vars(cases) if name.startswith("case_"))


@pytest.mark.parametrize("case", CASES)
async def test_the_frameworks_own_checkpoint_case_passes_on_the_ledger(client: LedgerClient, case: str) -> None:
    cases.STORAGES.client = client
    try:
        result = getattr(cases, case)()
        if inspect.isawaitable(result):
            await result
    finally:
        cases.STORAGES.client = None


# -- a workflow killed, resumed through the framework's API ---------------------------------------------------------


def fulfil(url: str, witness: Path, order: str, **env: str) -> subprocess.Popen[str]:
    """tests/af_fulfilment.py fulfilling ``order`` in a process of its own (resuming from the latest
    checkpoint of the order's workflow when the ledger holds one)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.af_fulfilment", url, str(witness), order],
        cwd=ROOT, env={**os.environ, "RUNLEDGER_NATS_URL": url, **env},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def calls(witness: Path, order: str) -> Counter[str]:
    """The real calls of each executor's side effect for ``order``."""
    lines = witness.read_text().splitlines() if witness.exists() else []
    return Counter(x["executor"] for x in map(json.loads, lines) if x["order"] == order)


def finished(proc: subprocess.Popen[str]) -> list[Any]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    outputs: list[Any] = json.loads(out.splitlines()[-1])
    return outputs


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.mark.parametrize("plain", [True, False], ids=["plain-call", "effect"])
def test_an_executor_killed_after_its_side_effect_runs_again_and_only_an_effect_makes_it_once(
    nats_url: str, tmp_path: Path, plain: bool
) -> None:
    # Held after charge's side effect, before the checkpoint of its superstep: the framework resumes
    # from the checkpoint before it and runs charge again. A plain call is made twice; an effect once.
    witness, mode = tmp_path / "witness", {"AF_PLAIN": "1"} if plain else {}
    proc = fulfil(nats_url, witness, "H1", AF_HOLD_AFTER="charge", **mode)
    try:
        wait_for(Path(f"{witness}.held"), 60)
    finally:
        kill(proc)
    assert calls(witness, "H1") == {"reserve": 1, "charge": 1}
    assert finished(fulfil(nats_url, witness, "H1", **mode)) == ["H1 shipped"]
    assert calls(witness, "H1") == {"reserve": 1, "charge": 2 if plain else 1, "ship": 1}


@pytest.mark.timeout(300)
def test_killed_at_random_moments_it_resumes_from_the_latest_checkpoint_each_side_effect_once(
    nats_url: str, tmp_path: Path
) -> None:
    witness = tmp_path / "witness"
    started = time.monotonic()
    assert finished(fulfil(nats_url, witness, "W0")) == ["W0 shipped"]
    duration = time.monotonic() - started
    rng = random.Random(int(os.environ.get("AF_KILL_SEED", "41")))
    landed = []
    for n in range(10):
        order = f"R{n}"
        proc = fulfil(nats_url, witness, order)
        time.sleep(rng.uniform(0.3 * duration, duration))
        kill(proc)
        landed.append(dict(calls(witness, order)))
        outputs = finished(fulfil(nats_url, witness, order))
        assert outputs in ([f"{order} shipped"], []), outputs  # []: killed after its last checkpoint
        assert calls(witness, order) == {"reserve": 1, "charge": 1, "ship": 1}, (n, landed[-1], calls(witness, order))
    print("side effects done when each kill landed:", landed)
    asyncio.run(_read_from_a_fresh_process(nats_url, [f"R{n}" for n in range(10)]))
    _read_as_any_run(nats_url, tmp_path)


async def _read_from_a_fresh_process(url: str, orders: list[str]) -> None:
    """Every order's checkpoints list and load through a new connection and storage, chained from the
    entry checkpoint to the terminal one across the kill, and the latest one's run completed."""
    client = await connect(url)
    try:
        storage = RunledgerCheckpointStorage(client)
        for order in orders:
            listed = await storage.list_checkpoints(workflow_name=f"fulfil-{order}")
            by_id = {cp.checkpoint_id: cp for cp in listed}
            assert set(await storage.list_checkpoint_ids(workflow_name=f"fulfil-{order}")) == set(by_id)
            latest = await storage.get_latest(workflow_name=f"fulfil-{order}")
            # 3 supersteps; one more, with nothing to do, when the kill came after the terminal checkpoint
            assert latest is not None and not latest.messages and latest.iteration_count in (3, 4), order
            chain, cursor = [], latest.checkpoint_id
            while cursor is not None:
                loaded = await storage.load(cursor)
                assert loaded.checkpoint_id == cursor and loaded.workflow_name == f"fulfil-{order}"
                chain.append(loaded.iteration_count)
                cursor = loaded.previous_checkpoint_id
            assert chain[-1] == 0 and chain[0] == latest.iteration_count, (order, chain)
            log = await load_run(client, storage.current_run_id or "", agent=DEFAULT_AGENT)
            assert fold([r.event for r in log.records]).status == "completed", order
    finally:
        await client.close()


def _read_as_any_run(url: str, tmp_path: Path) -> None:
    listed = runledger(url, "runs", "--json")
    assert listed.returncode == 0, listed.stderr
    runs = [r for r in json.loads(listed.stdout) if r["agent"] == DEFAULT_AGENT]
    assert runs and all(r["status"] in ("completed", "running") for r in runs)
    shown = runledger(url, "show", runs[-1]["run_id"])
    assert shown.returncode == 0 and "workflow.checkpointed" in shown.stdout and "effect.committed" in shown.stdout
    verified = runledger(url, "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    query = "SELECT count(*) AS n FROM events WHERE type = 'workflow.checkpointed'"
    counted = runledger(url, "sql", "--db", str(tmp_path / "p.duckdb"), "--format", "json", query)
    assert counted.returncode == 0, counted.stderr
    assert json.loads(counted.stdout)[0]["n"] >= 11 * 4  # an entry and 3 supersteps an order, more across kills


async def test_a_process_whose_execution_was_resumed_elsewhere_is_fenced(nats_url: str) -> None:
    # Process A checkpoints an execution; process B resumes it from A's checkpoint and saves the next
    # one; A, still alive (a zombie), saves its own next checkpoint: the server refuses it.
    first, second = await connect(nats_url), await connect(nats_url)
    try:
        zombie, resumer = RunledgerCheckpointStorage(first), RunledgerCheckpointStorage(second)
        pending: dict[str, Any] = {"messages": {"charge": ["A1"]}}  # mid-execution: messages to deliver
        entry = WorkflowCheckpoint(workflow_name="w", graph_signature_hash="h", **pending)
        await zombie.save(entry)
        assert (await resumer.load(entry.checkpoint_id)).checkpoint_id == entry.checkpoint_id
        await resumer.save(WorkflowCheckpoint("w", "h", previous_checkpoint_id=entry.checkpoint_id, iteration_count=1))
        with pytest.raises(FencedError):
            await zombie.save(
                WorkflowCheckpoint("w", "h", previous_checkpoint_id=entry.checkpoint_id, iteration_count=1)
            )
        assert len(await resumer.list_checkpoints(workflow_name="w")) == 2  # the zombie's is not in the log
    finally:
        await first.close()
        await second.close()
