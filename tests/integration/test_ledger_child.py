"""Child runs: ``await run.child(spec, input)`` starts a run recorded with its parent's run id and
step; its output is the parent's step result. Resuming the parent never runs a completed child
again and resumes an unfinished one (the done-when test: a child run crashed, and resumed with its
parent). A suspended child suspends its parent; a failed one fails its step. ``show`` prints the
tree, ``runs`` names the parent, and the projection carries the parent and child columns.

In-process crashes are ``Crash`` (a BaseException nothing in runledger catches: nothing more is
recorded, as after a SIGKILL); the last test SIGKILLs a subprocess at random moments.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest

from runledger import AgentSpec, Run, ScriptedModel
from runledger.errors import ChildFailedError, ConfigurationError, RunNotFoundError
from runledger.log.client import LedgerClient, connect
from runledger.log.publish import RetryPolicy
from runledger.ops.decisions import approve
from runledger.ops.verify import verify_runs
from runledger.projections.projector import project
from runledger.protect.loading import load_run
from runledger.record.fold import Checkpoint, fold
from runledger.sdk.lifecycle import resume_run, start_run
from runledger.sdk.run import RecordedRun
from tests.agents import calls, family_spec, kid_spec

# The CLI helpers wait up to 60-120 s a call and a test makes several.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]
AGENT = "tests.agents:family_spec"


class Crash(BaseException):
    """The process dies here: nothing catches it and nothing more is recorded."""


async def _fold(client: LedgerClient, run_id: str) -> Checkpoint:
    return fold((await load_run(client, run_id)).records)


def _counts(log: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for call in calls(log):
        out[call["call"]] = out.get(call["call"], 0) + 1
    return out


# -- agents of the in-process tests: their calls are counted in CALLS, crashes planted in CRASH_AT ----------

CALLS: list[str] = []
CRASH_AT: set[str] = set()


def _work(args: dict[str, Any]) -> dict[str, Any]:
    name = f"work:{args['n']}:{args['part']}"
    CALLS.append(name)
    if name in CRASH_AT:
        CRASH_AT.discard(name)
        raise Crash(name)
    return {"did": name}


async def _worker(run: Run) -> dict[str, Any]:
    n = run.input["n"]
    return {"n": n, "parts": [await run.tool("work", {"n": n, "part": p}, fn=_work) for p in (1, 2)]}


WORKER = AgentSpec("worker", _worker, ScriptedModel([]), agent_version="v1")


async def _boss(run: Run) -> dict[str, Any]:
    first = await run.child(WORKER, {"n": 1})
    second, side = await asyncio.gather(
        run.child(WORKER, {"n": 2}), run.tool("side", {"x": 1}, fn=lambda a: CALLS.append("side") or a)
    )
    return {"first": first, "second": second, "side": side}


BOSS = AgentSpec("boss", _boss, ScriptedModel([]), agent_version="v1")


@pytest.fixture(autouse=True)
def _fresh_counts() -> None:
    CALLS.clear()
    CRASH_AT.clear()


# -- results ------------------------------------------------------------------------------------------------


async def test_the_children_outputs_are_the_parents_step_results(
    client: LedgerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "calls.log"
    monkeypatch.setenv("TEST_CALLS_LOG", str(log))
    result = await start_run(client, family_spec(), {"x": 7}, run_id="fam-1")
    assert result.status == "completed", result
    cp = await _fold(client, "fam-1")
    assert [(s.kind, s.name, s.status) for _, s in sorted(cp.steps.items())] == [
        ("child", "kid", "completed"), ("child", "kid", "completed"), ("tool", "side", "ok"),
    ]  # fmt: skip
    assert [cp.steps[0].child_run_id, cp.steps[1].child_run_id] == ["fam-1-c0", "fam-1-c1"]
    assert result.output == {"first": cp.steps[0].output, "second": cp.steps[1].output, "side": cp.steps[2].output}
    assert result.output["second"]["charged"] == {"done": {"n": 2}}
    for step, child_id in ((0, "fam-1-c0"), (1, "fam-1-c1")):
        child = await _fold(client, child_id)
        assert (child.status, child.agent, child.child_of_run_id, child.child_of_step) == (
            "completed", "kid", "fam-1", step,
        )  # fmt: skip
        assert child.output == cp.steps[step].output and child.attempts == 1
    assert _counts(log) == {"work:1": 2, "charge:1": 1, "work:2": 2, "charge:2": 1, "side": 1}
    results = await verify_runs(client)
    assert sorted(r.run_id for r in results) == ["fam-1", "fam-1-c0", "fam-1-c1"] and all(r.ok for r in results)
    again = await resume_run(client, family_spec(), "fam-1")
    assert again.nothing_to_do and again.output == result.output
    assert _counts(log)["work:1"] == 2


# -- crashes, resumed through the parent --------------------------------------------------------------------


async def test_a_child_crashed_inside_is_resumed_with_its_parent(client: LedgerClient) -> None:
    CRASH_AT.add("work:1:2")
    with pytest.raises(Crash):
        await start_run(client, BOSS, None, run_id="boss-1")
    assert (await _fold(client, "boss-1")).steps[0].status == "started"
    assert (await _fold(client, "boss-1-c0")).status == "running"
    result = await resume_run(client, BOSS, "boss-1")
    assert result.status == "completed", result
    # The crashed call ran again (it was never recorded); the recorded one did not.
    assert sorted(CALLS) == ["side", "work:1:1", "work:1:2", "work:1:2", "work:2:1", "work:2:2"]
    child = await _fold(client, "boss-1-c0")
    assert (child.status, child.attempts) == ("completed", 2)
    assert result.output["first"] == {"n": 1, "parts": [{"did": "work:1:1"}, {"did": "work:1:2"}]}
    assert all(r.ok for r in await verify_runs(client))


async def test_a_completed_child_is_not_run_again_and_the_unfinished_one_is_resumed(client: LedgerClient) -> None:
    CRASH_AT.add("work:2:2")  # inside the second child, after the first completed
    with pytest.raises(Crash):
        await start_run(client, BOSS, None, run_id="boss-2")
    before = list(CALLS)
    assert before.count("work:1:1") == before.count("work:1:2") == 1
    result = await resume_run(client, BOSS, "boss-2")
    assert result.status == "completed", result
    new = CALLS[len(before) :]
    assert new == ["work:2:2"]  # child 1 replayed from the parent's record; child 2 resumed at its crashed step
    assert (await _fold(client, "boss-2-c0")).attempts == 1  # never even resumed
    assert (await _fold(client, "boss-2-c1")).attempts == 2
    parent = await _fold(client, "boss-2")
    assert (parent.status, parent.attempts) == ("completed", 2)
    assert all(r.ok for r in await verify_runs(client))


async def test_a_child_that_ended_before_its_parent_recorded_it_is_not_run_again(
    client: LedgerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = RecordedRun._child_outcome
    lost: list[str] = []

    async def crash_before_recording(self: RecordedRun, step: int, child_id: str, result: Any) -> Any:
        if not lost:
            lost.append(child_id)
            raise Crash(child_id)
        return await original(self, step, child_id, result)

    monkeypatch.setattr(RecordedRun, "_child_outcome", crash_before_recording)
    with pytest.raises(Crash):
        await start_run(client, BOSS, None, run_id="boss-3")
    assert (await _fold(client, "boss-3-c0")).status == "completed"
    result = await resume_run(client, BOSS, "boss-3")
    assert result.status == "completed", result
    assert sorted(CALLS) == ["side", "work:1:1", "work:1:2", "work:2:1", "work:2:2"]
    assert (await _fold(client, "boss-3")).steps[0].status == "completed"


async def test_a_child_that_never_started_is_started_with_its_id(
    client: LedgerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    import runledger.sdk.run as run_module

    def crash(name: str) -> None:
        if name == "child:0:started":
            raise Crash(name)

    monkeypatch.setattr(run_module, "crash_point", crash)
    with pytest.raises(Crash):
        await start_run(client, BOSS, None, run_id="boss-4")
    monkeypatch.undo()
    assert CALLS == []
    result = await resume_run(client, BOSS, "boss-4")
    assert result.status == "completed", result
    child = await _fold(client, "boss-4-c0")
    assert (child.child_of_run_id, child.child_of_step, child.attempts) == ("boss-4", 0, 1)


# -- suspension and failure ---------------------------------------------------------------------------------


async def _asks(run: Run) -> Any:
    decision = await run.approval("refund", {"n": run.input["n"]})
    return {"approved_by": decision["by"]}


ASKS = AgentSpec("asks", _asks, ScriptedModel([]), agent_version="v1")


async def _waits_for_child(run: Run) -> Any:
    return {"child": await run.child(ASKS, {"n": 5})}


async def test_a_suspended_child_suspends_its_parent_until_it_is_approved(client: LedgerClient) -> None:
    spec = AgentSpec("waits", _waits_for_child, ScriptedModel([]), agent_version="v1")
    first = await start_run(client, spec, None, run_id="wait-1")
    assert (first.status, first.reason) == ("suspended", "child")
    assert "wait-1-c0" in (first.error or "") and len(first.pending) == 1
    assert (await _fold(client, "wait-1")).status == "suspended"
    child = await _fold(client, "wait-1-c0")
    assert child.status == "suspended" and sorted(child.pending_approvals) == first.pending
    again = await resume_run(client, spec, "wait-1")  # nothing approved yet: still waiting
    assert (again.status, again.reason, again.pending) == ("suspended", "child", first.pending)
    await approve(client, "wait-1-c0", first.pending[0], by="op")
    done = await resume_run(client, spec, "wait-1")
    assert (done.status, done.output) == ("completed", {"child": {"approved_by": "op"}})
    assert (await _fold(client, "wait-1-c0")).status == "completed"


FAILS: list[int] = []


async def _fails(run: Run) -> Any:
    FAILS.append(1)
    raise ValueError(f"no such order {run.input}")


async def _catches(run: Run) -> Any:
    try:
        await run.child(AgentSpec("fails", _fails, ScriptedModel([])), "o-9")
    except ChildFailedError as exc:
        caught = [exc.child_run_id, exc.reason, exc.message]
    await run.approval("go")
    return caught


async def test_a_failed_child_fails_its_step_live_and_on_replay(client: LedgerClient) -> None:
    FAILS.clear()
    spec = AgentSpec("catches", _catches, ScriptedModel([]), agent_version="v1")
    first = await start_run(client, spec, None, run_id="fail-1")
    assert first.status == "suspended"
    cp = await _fold(client, "fail-1")
    assert (cp.steps[0].kind, cp.steps[0].status) == ("child", "failed")
    assert (await _fold(client, "fail-1-c0")).status == "failed"
    await approve(client, "fail-1", first.pending[0], by="op")
    done = await resume_run(client, spec, "fail-1")
    assert done.status == "completed"
    assert done.output == ["fail-1-c0", "exception", "ValueError: no such order o-9"]
    assert FAILS == [1]  # the failed child was not run again: its failure replayed from the parent's record


# -- trace, listing, projection ----------------------------------------------------------------------------


def _cli(url: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "runledger", *args],
        cwd=ROOT,
        env={**os.environ, "RUNLEDGER_NATS_URL": url, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _output(url: str, *args: str) -> str:
    out, err = _cli(url, *args).communicate(timeout=60)
    assert not err.strip() or "error" not in err, err
    return out


async def test_show_prints_the_tree_runs_names_the_parent_and_the_projection_has_both_columns(
    client: LedgerClient, nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_CALLS_LOG", str(tmp_path / "calls.log"))
    assert (await start_run(client, family_spec(), {"x": 1}, run_id="tree-1")).status == "completed"
    shown = await asyncio.to_thread(_output, nats_url, "show", "tree-1")
    assert "children" in shown
    assert "step 0    tree-1-c0  agent kid  completed" in shown and "step 1    tree-1-c1  agent kid  completed" in shown
    assert "child.started" in shown and "child.completed" in shown
    child = await asyncio.to_thread(_output, nats_url, "show", "tree-1-c1")
    assert "child   of tree-1 at step 1" in child
    listed = await asyncio.to_thread(_output, nats_url, "runs")
    line = next(line for line in listed.splitlines() if line.startswith("tree-1-c0"))
    assert "child of tree-1 step 0" in line
    as_json = json.loads(await asyncio.to_thread(_output, nats_url, "show", "tree-1", "--json"))
    assert [(c["step"], c["run_id"], c["status"]) for c in as_json["children"]] == [
        (0, "tree-1-c0", "completed"), (1, "tree-1-c1", "completed"),
    ]  # fmt: skip

    db = tmp_path / "p.duckdb"
    await project(client, db)
    con = duckdb.connect(str(db), read_only=True)
    try:
        runs = con.execute(
            "SELECT run_id, child_of_run_id, child_of_step, parent_run_id FROM runs ORDER BY run_id"
        ).fetchall()
        assert runs == [("tree-1", None, None, None), ("tree-1-c0", "tree-1", 0, None),
                        ("tree-1-c1", "tree-1", 1, None)]  # fmt: skip
        steps = con.execute(
            "SELECT step, kind, status, child_run_id FROM steps WHERE run_id = 'tree-1' ORDER BY step"
        ).fetchall()
        assert steps == [(0, "child", "completed", "tree-1-c0"), (1, "child", "completed", "tree-1-c1"),
                         (2, "tool", "ok", None)]  # fmt: skip
        tree = con.execute(
            "SELECT run_id, parent_run_id, parent_step, status, parent_status, step_status FROM child_runs "
            "ORDER BY run_id"
        ).fetchall()
        assert tree == [("tree-1-c0", "tree-1", 0, "completed", "completed", "completed"),
                        ("tree-1-c1", "tree-1", 1, "completed", "completed", "completed")]  # fmt: skip
        assert con.execute("SELECT count(*) FROM forks").fetchall() == [(0,)]  # a child is not a fork
    finally:
        con.close()


# -- re-runs: children are answered from the record -------------------------------------------------------


async def test_a_rerun_serves_children_from_the_record_and_refuses_live_ones(
    client: LedgerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runledger.sandbox.branch import BranchRun
    from runledger.sandbox.broker import Broker
    from runledger.sandbox.rerun import Rerunner, RerunRequest

    log = tmp_path / "calls.log"
    monkeypatch.setenv("TEST_CALLS_LOG", str(log))
    assert (await start_run(client, family_spec(), {"x": 2}, run_id="rr-1")).status == "completed"
    parent = fold((await load_run(client, "rr-1", open_content=False)).records)
    counted = _counts(log)
    rerunner = Rerunner(client, None)  # type: ignore[arg-type]  # no container: the host side alone

    async def branch(mode: str, fork_step: int) -> BranchRun:
        request = RerunRequest(parent_run_id="rr-1", agent=AGENT, mode=mode, fork_step=fork_step)  # type: ignore[arg-type]
        cp, writer, protector, _ = await rerunner._open_branch(
            family_spec(), parent, request, fork_step, None, None, None
        )
        return BranchRun(client, family_spec(), writer, cp, policy=RetryPolicy(), parent=parent,
                         fork_step=fork_step, mode=mode, protector=protector)  # type: ignore[arg-type]  # fmt: skip

    redrive = await branch("redrive", 1)
    first = await redrive.child(kid_spec(), {"n": 1})  # before the fork
    broker = Broker(None, None, {}, deadline=time.monotonic() + 60)  # type: ignore[arg-type]
    second = await broker._dispatch(redrive, "child", {"agent": "kid", "input": {"n": 2}})  # after it, by position
    assert [first, second] == [(await _fold(client, "rr-1")).steps[k].output for k in (0, 1)]
    cp = await _fold(client, redrive.run_id)
    assert [(s.kind, s.status, s.child_run_id) for _, s in sorted(cp.steps.items())] == [
        ("child", "completed", "rr-1-c0"), ("child", "completed", "rr-1-c1"),
    ]  # fmt: skip
    with pytest.raises(Exception, match="diverged"):
        await redrive.child(kid_spec(), {"n": 3})  # the record has a tool here
    live = await branch("live", 1)
    await live.child(kid_spec(), {"n": 1})
    with pytest.raises(ConfigurationError, match="does not start child runs"):
        await live.child(kid_spec(), {"n": 2})
    assert _counts(log) == counted  # no child ran
    assert all(r.ok for r in await verify_runs(client))


# -- the done-when test: SIGKILLs at random moments, resumed through the parent ---------------------------


async def _state(url: str, run_id: str) -> dict[str, Any]:
    """{run id: (status, attempts)} of the parent and its children that exist."""
    out: dict[str, Any] = {}
    async with await connect(url) as client:
        for rid in (run_id, f"{run_id}-c0", f"{run_id}-c1"):
            try:
                cp = await _fold(client, rid)
            except RunNotFoundError:  # not (yet) in the log
                continue
            out[rid] = (cp.status, cp.attempts, cp.output, cp.child_of_run_id, cp.child_of_step)
    return out


def _finish(url: str, run_id: str, env: dict[str, str]) -> None:
    """Resume the parent until it ends (start it again if the kill came before its first event)."""
    err = ""
    for _ in range(5):
        state = asyncio.run(_state(url, run_id))
        if run_id in state and state[run_id][0] in ("completed", "failed"):
            return
        args = ("resume", run_id, "--agent", AGENT) if run_id in state else (
            "run", "--agent", AGENT, "--run-id", run_id, "--input", '{"x": 3}')  # fmt: skip
        _, err = _cli(url, *args, env=env).communicate(timeout=120)
    raise AssertionError(f"{run_id} did not finish: {err}")


@pytest.mark.timeout(900)
def test_random_sigkills_inside_children_resume_with_the_parent(nats_url: str, tmp_path: Path) -> None:
    rounds = int(os.environ.get("RUNLEDGER_CHILD_CRASH_ROUNDS", "12"))
    rng = random.Random(int(os.environ.get("RUNLEDGER_TEST_SEED", "0")) or None)
    env = {"TEST_CALLS_LOG": str(tmp_path / "ref.log"), "TEST_TOOL_DELAY": "0.15"}
    started = time.monotonic()
    proc = _cli(nats_url, "run", "--agent", AGENT, "--run-id", "ref", "--input", '{"x": 3}', env=env)
    _, err = proc.communicate(timeout=120)
    duration = time.monotonic() - started
    assert proc.returncode == 0, err
    reference = asyncio.run(_state(nats_url, "ref"))["ref"]
    assert reference[0] == "completed"
    resumed_inside_a_child = killed = 0
    for i in range(rounds):
        run_id = f"kill-{i}"
        log = tmp_path / f"{run_id}.log"
        env = {"TEST_CALLS_LOG": str(log), "TEST_TOOL_DELAY": "0.15"}
        proc = _cli(nats_url, "run", "--agent", AGENT, "--run-id", run_id, "--input", '{"x": 3}', env=env)
        time.sleep(rng.uniform(0.2 * duration, duration))
        if proc.poll() is None:
            proc.kill()
            killed += 1
        proc.communicate(timeout=60)
        before = asyncio.run(_state(nats_url, run_id))
        counted = _counts(log)
        _finish(nats_url, run_id, env)
        after = asyncio.run(_state(nats_url, run_id))
        assert after[run_id][0] == "completed", (run_id, after)
        assert after[run_id][2] == reference[2], run_id  # the same result as the uncrashed run
        final = _counts(log)
        for n, child_id in ((1, f"{run_id}-c0"), (2, f"{run_id}-c1")):
            assert after[child_id][0] == "completed" and after[child_id][3:] == (run_id, n - 1), (child_id, after)
            assert final[f"charge:{n}"] == 1, (child_id, final)  # the child's effect: exactly once
            if before.get(child_id, ("",))[0] == "completed":  # completed before the kill: never run again
                assert final.get(f"work:{n}") == counted.get(f"work:{n}"), (child_id, counted, final)
                assert after[child_id][1] == before[child_id][1], (child_id, before, after)
            elif child_id in before:  # unfinished: resumed with its parent
                assert after[child_id][1] > before[child_id][1], (child_id, before, after)
                resumed_inside_a_child += 1
    assert killed > 0, "no round was killed mid-run: the kill moments are drawn from the run's duration"
    assert resumed_inside_a_child > 0, "no kill landed inside a child: raise RUNLEDGER_CHILD_CRASH_ROUNDS"

    async def verify() -> None:
        async with await connect(nats_url) as client:
            results = await verify_runs(client)
            assert results and all(r.ok for r in results), [r for r in results if not r.ok]
            assert {f"kill-{i}-c1" for i in range(rounds)} <= {r.run_id for r in results}

    asyncio.run(verify())
