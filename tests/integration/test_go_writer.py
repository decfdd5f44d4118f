"""The Go writer (clients/go, written from docs/wire.md alone) against the Python side.

The test builds it offline (``clients/go/build.sh``: any Go from 1.19 on, its dependencies vendored). It replays the
vectors; it writes a run whose content is sealed under keys it made and wrapped itself, which Python
verifies, opens and projects, and whose committed effect a Python agent then takes from the key
without acting; and it leaves a run with its effect in doubt (killed after the claim), which Python
resumes: the Go run's sealed steps replay, the dead holder is not waited for, the claim is settled by
reconcile and the effect is never executed. Without ``go`` the test skips,
except under ``CI=true``, where it fails (.ci/run installs them)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from runledger.log.client import LedgerClient
from runledger.ops.verify import verify_runs
from runledger.protect.capture import is_sealed
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from runledger.sdk.agent import AgentSpec
from runledger.sdk.effects import lease_remaining, read_key
from runledger.sdk.holder import is_gone, this_holder
from runledger.sdk.lifecycle import resume_run, start_run
from runledger.sdk.models import ScriptedModel
from runledger.sdk.tools import tool
from tests.conftest import unavailable

# The first test builds the Go writer: from a cold Go cache that compiles nats.go and half the standard
# library (about 3 minutes measured on a loaded 2-core machine; deploy/dev.sh test builds it before pytest, so
# the test's build is then a cache hit of a few seconds).
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

GO_DIR = Path(__file__).parents[2] / "clients" / "go"
VECTORS = Path(__file__).parents[2] / "tests" / "vectors"
AGENT = "go-agent"
LOOKUP_SCHEMA = {"type": "object", "properties": {"order": {"type": "string"}}}
REFUND_SCHEMA = {"type": "object", "properties": {"order": {"type": "string"}, "amount": {"type": "number"}}}


@pytest.fixture(scope="module")
def go_writer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Go writer, built here from the files a clone of the repository has (``git ls-files``: its
    vendored dependencies included, nothing else of this machine's) with a Go cache and path of its
    own; a build error fails the test, never skips it."""
    if shutil.which("go") is None:
        unavailable("go is not installed: CI must build the Go writer (.ci/run installs golang-go)")
    work = tmp_path_factory.mktemp("go")
    tracked = subprocess.run(["git", "ls-files", "-z", "clients/go"], cwd=GO_DIR.parents[1], capture_output=True,
                             check=True).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, tracked):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(GO_DIR.parents[1] / name, work / name)
    binary = work / "runledger-go"
    env = {"PATH": os.environ["PATH"], "HOME": str(work), "GOPATH": str(work / "gopath"),
           "GOCACHE": os.environ.get("GOCACHE") or str(Path.home() / ".cache" / "go-build")}  # fmt: skip
    done = subprocess.run(["bash", str(work / "clients" / "go" / "build.sh"), str(binary)], capture_output=True,
                          text=True, timeout=300, env=env)  # fmt: skip
    if done.returncode == 2:  # no Go toolchain (from 1.19 on), told by build.sh
        unavailable(f"the Go writer cannot be built here: {done.stderr.strip()}")
    assert done.returncode == 0, f"clients/go/build.sh failed:\n{done.stderr[-3000:]}"
    return binary


def _run_go(binary: Path, *args: str, expect: int = 0) -> dict[str, Any]:
    done = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=60)
    if done.returncode != expect:
        sys.stderr.write(done.stderr)
        raise AssertionError(f"runledger-go {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_go_replays_the_vectors(go_writer: Path) -> None:
    report = _run_go(go_writer, "--check-vectors", str(VECTORS))
    assert report["failures"] == [] and report["skipped"] == 0
    assert report["checked"] >= 60  # canonical cases and keys, every published message, the sealing file


async def test_a_go_run_is_sealed_verifies_opens_and_its_effect_is_never_repeated(
    go_writer: Path, client: LedgerClient, nats_url: str, tmp_path: Path
) -> None:
    key = "refund:order-go-1"
    out = _run_go(go_writer, "--server", nats_url, "--agent", AGENT, "--run-id", "gorun1", "--key", key)
    assert out["claimed"] is True and out["kid"] == f"{AGENT}.gorun1"

    (result,) = await verify_runs(client, "gorun1")
    assert result.ok, result.problems
    # The CLI a user runs accepts it: verify (deep: every sealed value authenticates) and show.
    verified, shown = (
        subprocess.run([sys.executable, "-m", "runledger", *command, "--nats", nats_url], capture_output=True,
                       text=True, timeout=120)
        for command in (["verify", "gorun1", "--deep", "--json"], ["show", "gorun1"])
    )  # fmt: skip
    assert verified.returncode == 0 and shown.returncode == 0, verified.stdout + verified.stderr + shown.stderr
    assert "status completed" in shown.stdout and "effect.committed" in shown.stdout, shown.stdout
    assert result.chain_format == 2 and result.events == out["events"] == 6
    sealed = (await load_run(client, "gorun1", open_content=False)).records
    payloads = {r.event.type: r.event.payload for r in sealed}
    for type_, field in [("run.started", "input"), ("model.called", "request"), ("model.called", "response"),
                         ("tool.called", "args"), ("tool.called", "output"), ("effect.intended", "args"),
                         ("effect.committed", "result"), ("run.completed", "output")]:  # fmt: skip
        assert is_sealed(payloads[type_][field]) and payloads[type_][field]["kid"] == out["kid"], (type_, field)
    opened = (await load_run(client, "gorun1", open_content=True)).records
    plain = {r.event.type: r.event.payload for r in opened}
    assert plain["model.called"]["request"] == {
        "messages": [{"role": "user", "content": "refund order-go-1"}],
        "params": {"temperature": 0},
    }
    assert plain["model.called"]["response"]["content"] == "refunding order-go-1"
    assert plain["tool.called"]["output"] == {"order": "order-go-1", "amount": 12.5, "currency": "EUR"}
    assert plain["effect.committed"]["result"] == out["result"]
    cp = fold(opened)
    assert cp.status == "completed" and cp.chain_format == 2 and key in cp.committed_keys
    assert cp.steps[2].status == "committed" and cp.last_hash == out["last_hash"]

    import duckdb

    from runledger.projections.projector import project

    db = tmp_path / "ledger.duckdb"
    await project(client, db)
    with duckdb.connect(str(db), read_only=True) as con:
        (status,) = con.execute("SELECT status FROM runs WHERE run_id = 'gorun1'").fetchone() or (None,)
        kinds = [r[0] for r in con.execute("SELECT kind FROM steps WHERE run_id = 'gorun1' ORDER BY step").fetchall()]
    assert status == "completed" and kinds == ["model", "tool", "effect"]

    calls: list[dict[str, Any]] = []

    @tool("refund", effect="irreversible", key=lambda a: f"refund:{a['order']}", schema=REFUND_SCHEMA)
    def refund(args: dict[str, Any]) -> dict[str, Any]:
        calls.append(args)
        return {"refund_id": "python", "amount": args["amount"]}

    async def agent(run: Any) -> Any:
        return await run.tool("refund", {"order": "order-go-1", "amount": 12.5})

    py = await start_run(client, AgentSpec(AGENT, agent, ScriptedModel([]), tools=[refund]), None, run_id="pyrun-go")
    assert calls == []  # the Go run's committed claim answered it, its result opened from Go's sealing
    assert py.status == "completed" and py.output == out["result"] == {"refund_id": f"rf-go-{out['fencing_token']}",
                                                                       "amount": 12.5}  # fmt: skip
    (py_result,) = await verify_runs(client, "pyrun-go")
    assert py_result.ok and py_result.chain_format == 2


async def test_a_go_run_takes_an_effect_python_committed_from_the_key_and_does_not_act(
    go_writer: Path, client: LedgerClient, nats_url: str
) -> None:
    """The other way round: a Python agent's refund (sealed under its run's keys) is committed on the
    key; the Go writer's claim is fenced out, it reads the key, opens the result Python sealed and
    copies the outcome to its own run instead of acting."""
    calls: list[dict[str, Any]] = []

    @tool("refund", effect="irreversible", key=lambda a: f"refund:{a['order']}", schema=REFUND_SCHEMA)
    def refund(args: dict[str, Any]) -> dict[str, Any]:
        calls.append(args)
        return {"refund_id": "rf-python-1", "amount": args["amount"]}

    async def agent(run: Any) -> Any:
        return await run.tool("refund", {"order": "order-py-1", "amount": 12.5})

    py = await start_run(client, AgentSpec(AGENT, agent, ScriptedModel([]), tools=[refund]), None, run_id="pyfirst")
    assert py.status == "completed" and calls == [{"order": "order-py-1", "amount": 12.5}]

    out = _run_go(go_writer, "--server", nats_url, "--agent", AGENT, "--run-id", "gorun3", "--key", "refund:order-py-1")
    assert out["claimed"] is False and out["settled"] == "committed" and out["acted"] is False
    assert out["committed_by"] == "pyfirst" and out["result"] == {"refund_id": "rf-python-1", "amount": 12.5}
    (verified,) = await verify_runs(client, "gorun3")
    assert verified.ok, verified.problems
    cp = fold((await load_run(client, "gorun3", open_content=True)).records)
    assert cp.status == "completed" and cp.steps[2].status == "committed" and cp.last_hash == out["last_hash"]
    state = await read_key(client, "refund:order-py-1", AGENT)
    assert state.status == "committed" and state.run_id == "pyfirst" and len(calls) == 1


def test_a_go_holder_is_alive_while_its_process_runs_and_dead_after(go_writer: Path) -> None:
    """The holder the Go writer puts in its claims, judged by Python's rule: alive while the process
    lives (a wrong start time or namespace would make a live holder look dead, or a dead one alive)."""
    process = subprocess.Popen([str(go_writer), "--hold"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        holder = json.loads(process.stdout.readline())["holder"]
        host, namespace, pid, start = holder.split("/")
        assert [host, namespace] == this_holder().split("/")[:2] and pid == str(process.pid) and start.isdigit()
        assert not is_gone(holder)
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(timeout=10)
    assert is_gone(holder)


async def test_python_resumes_a_go_run_killed_after_its_claim_and_never_repeats_the_effect(
    go_writer: Path, client: LedgerClient, nats_url: str
) -> None:
    key = "refund:order-go-2"
    out = _run_go(go_writer, "--server", nats_url, "--agent", AGENT, "--run-id", "gorun2", "--key", key,
                  "--stop-after", "claim", "--lease", "300")  # fmt: skip
    # The Go process is gone: its holder (the page's format, as this host names its own) is dead,
    # so its claim's 300 s lease protects nobody.
    assert out["holder"].split("/")[:2] == this_holder().split("/")[:2] and is_gone(out["holder"])
    state = await read_key(client, key, AGENT)
    assert state.status == "claimed" and state.run_id == "gorun2" and state.holder == out["holder"]
    assert state.lease_s == 300 and lease_remaining(state) == 0.0

    lookups: list[Any] = []
    refunds: list[Any] = []
    reconciled: list[str] = []

    @tool("lookup_order", schema=LOOKUP_SCHEMA)
    def lookup_order(args: dict[str, Any]) -> dict[str, Any]:
        lookups.append(args)
        return {"order": args["order"], "amount": 99.0, "currency": "EUR"}

    def ask_payments(k: str) -> dict[str, Any]:
        reconciled.append(k)
        return {"refund_id": "found-by-reconcile", "amount": 12.5}

    @tool("refund", effect="irreversible", key=lambda a: f"refund:{a['order']}", schema=REFUND_SCHEMA,
          reconcile=ask_payments)  # fmt: skip
    def refund(args: dict[str, Any]) -> dict[str, Any]:
        refunds.append(args)
        return {"refund_id": "python-acted", "amount": args["amount"]}

    async def agent(run: Any) -> Any:
        reply = await run.model([{"role": "user", "content": "refund order-go-2"}], temperature=0)
        found = await run.tool("lookup_order", {"order": "order-go-2"})
        done = await run.tool("refund", {"order": "order-go-2", "amount": found["amount"]})
        return {"reply": reply.content, "refund": done}

    # The version tuple the Go writer recorded: its declared version, model, prompt and tool schemas.
    spec = AgentSpec(AGENT, agent, ScriptedModel([], name="scripted-go"), tools=[lookup_order, refund],
                     prompt="You issue refunds.", agent_version="go-writer-1")  # fmt: skip
    started = time.monotonic()
    resumed = await resume_run(client, spec, "gorun2")
    assert time.monotonic() - started < 60  # the dead holder's lease was not waited out
    assert resumed.status == "completed", resumed
    assert resumed.output == {"reply": "refunding order-go-2", "refund": {"refund_id": "found-by-reconcile",
                                                                         "amount": 12.5}}  # fmt: skip
    assert refunds == [] and lookups == [] and reconciled == [key]  # replayed from Go's sealed record; never acted
    (verified,) = await verify_runs(client, "gorun2")
    assert verified.ok, verified.problems
    settled = await read_key(client, key, AGENT)
    assert settled.status == "committed" and settled.via == "reconcile"
