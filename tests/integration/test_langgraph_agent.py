"""A LangGraph agent on the ledger: SIGKILLed at random moments and resumed with RunledgerSaver, it
refunds each order exactly once (by the payments service's own log), every thread completes, the
record verifies, ``runledger show`` renders its steps and the projection's ``steps`` table holds
them; time travel forks the thread, and the fork shows in ``show`` and in SQL.

``RUNLEDGER_LANGGRAPH_CRASH_ROUNDS`` sets the number of killed runs (default 20)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from langchain_core.messages import ToolMessage
from langgraph.types import Command

from runledger.cli import main
from runledger.examples.langgraph_support.agent import build_graph, handle
from runledger.integrations.langgraph import RunledgerSaver, thread_run_id
from runledger.log.client import LedgerClient
from runledger.log.server import ServerState
from runledger.ops.verify import verify_runs
from runledger.projections.projector import project
from runledger.protect.loading import load_run
from runledger.record.fold import fold

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]
ROOT = Path(__file__).resolve().parents[2]
ROUNDS = int(os.environ.get("RUNLEDGER_LANGGRAPH_CRASH_ROUNDS", "20"))
AGENT = "runledger.examples.langgraph_support.agent"


@pytest.fixture
def payments(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The example's payments service in its own process: it outlives the agents we kill."""
    log = tmp_path / "payments.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runledger.examples.refund_agent.payments", "--log", str(log)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    try:
        yield url, log
    finally:
        proc.kill()
        proc.wait()


def refunds(log: Path) -> Counter[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return Counter(json.loads(line)["order"] for line in lines if json.loads(line).get("call") == "refund")


def start_agent(nats_url: str, payments_url: str, thread: str, order: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", AGENT, "--nats", nats_url, "--thread", thread, "--order", order, "--approve"],
        cwd=ROOT,
        env={**os.environ, "REFUND_PAYMENTS_URL": payments_url},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


async def test_killed_at_random_moments_each_refund_happens_once_and_every_thread_completes(
    client: LedgerClient,
    nats_server: ServerState,
    payments: tuple[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, log = payments
    rng = random.Random(int(os.environ.get("RUNLEDGER_CRASH_SEED", "15")))
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", f"import {AGENT}"], cwd=ROOT, check=True, timeout=60)
    startup = time.monotonic() - started  # a kill before the imports end finds nothing to break
    started = time.monotonic()
    first = finish(start_agent(nats_server.url, url, "lg-warmup", "order-8891"))  # measures a whole run
    duration = time.monotonic() - started
    assert first["status"] == "completed"

    threads = {f"lg-crash-{i}": f"order-{4000 + i}" for i in range(ROUNDS)}
    durations = [duration]  # whole runs, measured as they come: the kill moments follow the machine's pace
    kills = 0
    for thread, order in threads.items():
        proc = start_agent(nats_server.url, url, thread, order)
        await asyncio.sleep(rng.uniform(min(0.8 * startup, min(durations)), min(durations)))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.communicate(timeout=60)
        started = time.monotonic()
        result = finish(start_agent(nats_server.url, url, thread, order))  # the resume, from the last checkpoint
        durations.append(time.monotonic() - started)
        assert result["status"] == "completed", result
        assert "Refunded" in result["answer"], result
    assert kills >= ROUNDS // 4, f"only {kills} of {ROUNDS} runs were killed before they ended"

    counted = refunds(log)
    assert {o: counted[o] for o in threads.values()} == dict.fromkeys(threads.values(), 1)  # exactly once each
    assert counted["order-8891"] == 1

    for thread in ["lg-warmup", *threads]:
        cp = fold((await load_run(client, thread_run_id(thread), agent="langgraph")).records)
        assert cp.status == "completed", (thread, cp.status)
        effects = [s for s in cp.steps.values() if s.kind == "effect"]
        assert effects and all(s.status == "committed" for s in effects), (thread, effects)
    assert all(r.ok for r in await verify_runs(client))

    assert await asyncio.to_thread(main, ["show", "lg-crash-0", "--nats", nats_server.url]) == 0
    shown = capsys.readouterr().out
    for line in ("model.called", "tool.called", "lookup_order", "effect.committed", "graph.checkpointed"):
        assert line in shown

    db = tmp_path / "ledger.duckdb"
    await project(client, db)
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(
            "SELECT run_id, list(kind ORDER BY step), list(name ORDER BY step) FROM steps "
            "WHERE run_id LIKE 'lg-%' GROUP BY run_id"
        ).fetchall()
    by_run = {run_id: (kinds, names) for run_id, kinds, names in rows}
    assert set(by_run) == {"lg-warmup", *threads}
    for kinds, names in by_run.values():
        assert {"model", "tool", "effect"} <= set(kinds)
        assert "lookup_order" in names and "refund" in names


async def test_time_travel_forks_the_thread_and_the_fork_shows_in_show_and_sql(
    client: LedgerClient,
    nats_server: ServerState,
    payments: tuple[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, log = payments
    monkeypatch.setenv("REFUND_PAYMENTS_URL", url)
    assert (await handle(client, "lg-travel", "order-1002", approve=True))["status"] == "completed"
    saver = RunledgerSaver(client)
    graph = build_graph(saver)
    config: Any = {"configurable": {"thread_id": "lg-travel"}}
    history = [s async for s in graph.aget_state_history(config)]
    # The checkpoint where the reviewer was asked (its pending write is the interrupt): go back there.
    asked = next(s for s in history if s.next == ("review",))
    # Replay from it: the refund's key is committed, so the effect ledger answers it and the
    # payments service sees nothing new.
    await graph.ainvoke(None, asked.config)
    state = await graph.aget_state(config)
    if state.interrupts:
        await graph.ainvoke(Command(resume={"approved": True}), config)
    # And an edit of the past: a state update on the checkpoint after the lookup.
    looked_up = next(s for s in history if isinstance(s.values["messages"][-1], ToolMessage))
    forked = await graph.aupdate_state(looked_up.config, {"messages": []})
    assert refunds(log) == Counter({"order-1002": 1})

    cp = fold((await load_run(client, "lg-travel", agent="langgraph")).records)
    assert [s.status for s in cp.steps.values() if s.kind == "effect"] == ["committed", "committed"]
    assert await asyncio.to_thread(main, ["show", "lg-travel", "--nats", nats_server.url]) == 0
    assert "fork of …" + str(asked.config["configurable"]["checkpoint_id"])[-12:] in capsys.readouterr().out

    db = tmp_path / "ledger.duckdb"
    await project(client, db)
    with duckdb.connect(str(db), read_only=True) as con:
        forks = con.execute(
            "SELECT payload->>'checkpoint_id', payload->>'parent_checkpoint_id', payload->>'source' FROM events "
            "WHERE run_id = 'lg-travel' AND type = 'graph.checkpointed' AND (payload->>'forked')::BOOLEAN "
            "ORDER BY seq"
        ).fetchall()
    parents = [parent for _, parent, _ in forks]
    assert str(asked.config["configurable"]["checkpoint_id"]) in parents
    assert str(looked_up.config["configurable"]["checkpoint_id"]) in parents
    assert (forked["configurable"]["checkpoint_id"], "update") in [(cid, source) for cid, _, source in forks]
