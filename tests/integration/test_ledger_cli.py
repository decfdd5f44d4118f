"""The operator's view: trace replay, verify, and clear errors for bad input."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from runledger import Run
from runledger.cli import main
from runledger.errors import ChainError
from runledger.log.client import connect
from runledger.log.reader import read_run
from runledger.log.subjects import run_subject
from runledger.ops.decisions import approve
from runledger.record.events import ClockRead
from runledger.sdk.agent import AgentSpec
from runledger.sdk.lifecycle import resume_run, start_run
from runledger.sdk.models import ScriptedModel
from tests.unit.helpers import Chain

pytestmark = pytest.mark.integration

STRANGE = {
    "text": 'naïve ✓ \u0000 "quoted" \n newline',
    "n": [1, 2.5, -0.0, 10**18],
    "none": None,
    "nested": {"b": {}, "a": []},
}


def cli(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> tuple[int, str, str]:
    code = main([*argv[:1], "--nats", url, *argv[1:]])
    out = capsys.readouterr()
    return code, out.out, out.err


def record_run(url: str, agent_fn: Any, run_id: str, model: ScriptedModel | None = None) -> Any:
    async def go() -> Any:
        client = await connect(url)
        try:
            spec = AgentSpec("cli-agent", agent_fn, model or ScriptedModel(["fine"] * 5))
            return await start_run(client, spec, {"q": "in"}, run_id=run_id)
        finally:
            await client.close()

    return asyncio.run(go())


def test_show_json_carries_every_input_and_output_as_the_agent_saw_them(
    nats_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[Any] = []

    async def agent(run: Run) -> Any:
        seen.append((await run.model([{"role": "user", "content": STRANGE["text"]}], temperature=0.2)).content)
        seen.append(await run.tool("echo", STRANGE, fn=lambda a: {"echo": a, "tuple": (1, 2)}))
        seen.append(await run.random())
        return seen[1]

    result = record_run(nats_url, agent, "show1")
    assert result.status == "completed"
    code, out, _ = cli(capsys, nats_url, "show", "show1", "--json")
    assert code == 0
    shown = json.loads(out)
    events = {e["type"]: e["payload"] for e in shown["events"]}
    assert events["model.called"]["request"]["messages"][0]["content"] == STRANGE["text"]
    assert events["model.called"]["request"]["params"] == {"temperature": 0.2}
    assert events["model.called"]["response"]["content"] == seen[0]
    assert events["tool.called"]["args"] == STRANGE
    assert events["tool.called"]["output"] == seen[1] == {"echo": STRANGE, "tuple": [1, 2]}
    assert events["random.drawn"]["value"] == seen[2]
    assert events["run.completed"]["output"] == seen[1]
    assert shown["version"]["model"] == "scripted-1"

    code, out, _ = cli(capsys, nats_url, "show", "show1")
    assert code == 0 and "tool.called" in out and "echo" in out
    code, out, _ = cli(capsys, nats_url, "show", "show1", "--step", "1")
    assert "naïve" in out and '"tuple"' in out
    code, out, _ = cli(capsys, nats_url, "runs")
    assert "show1" in out and "completed" in out
    code, out, _ = cli(capsys, nats_url, "verify")
    assert code == 0 and "1 of 1 runs verified" in out


def test_an_event_that_breaks_the_schema_is_reported_by_every_reader(
    nats_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def agent(run: Run) -> str:
        await run.tool("t", 1, fn=lambda a: a)
        return "ok"

    record_run(nats_url, agent, "poison1")

    async def publish_garbage() -> None:
        client = await connect(nats_url)
        subject = run_subject("cli-agent", "poison1")
        await client.js.publish(subject, b'{"type": "tool.called", "payload": "oops"}')
        await client.js.publish(subject, b"\x00\x01 binary")
        # Valid JSON, wrong payload schema, correct chain position:
        bad = json.loads(Chain("poison1", "cli-agent").add(ClockRead(step=9, value="x")).to_bytes())
        bad["payload"]["value"] = 12
        await client.js.publish(subject, json.dumps(bad).encode())
        await client.close()

    asyncio.run(publish_garbage())
    code, out, err = cli(capsys, nats_url, "show", "poison1")
    assert code == 0, err
    assert out.count("QUARANTINED") == 3 and "invalid clock.read payload" in out
    code, out, _ = cli(capsys, nats_url, "show", "poison1", "--json")
    assert len(json.loads(out)["quarantined"]) == 3
    code, out, _ = cli(capsys, nats_url, "verify", "poison1")
    assert code == 1 and "BAD" in out and "not a valid event" in out
    code, out, _ = cli(capsys, nats_url, "runs")
    assert code == 0 and "poison1" in out
    code, out, _ = cli(capsys, nats_url, "checkpoint", "poison1")
    assert code == 0 and "completed" in out


def test_garbage_on_a_runs_own_subject_marks_it_broken_for_every_reader(
    nats_url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    async def agent(run: Run) -> str:
        await run.tool("t", 1, fn=lambda a: a)
        return "ok"

    record_run(nats_url, agent, "poison2")
    record_run(nats_url, agent, "stray2")

    async def publish(subject: str, data: bytes) -> int:
        client = await connect(nats_url)
        ack = await client.js.publish(subject, data)
        await client.close()
        return int(ack.seq)

    # At the end of the run, where it leaves no gap: the run's writer wrote something nobody can read.
    seq = asyncio.run(publish(run_subject("cli-agent", "poison2"), b"\x00\x01 binary"))
    # On another writer's subject of a run (a worker's `w`): a stray, which never breaks the run.
    asyncio.run(publish(run_subject("cli-agent", "stray2", "w"), b"\x00\x01 binary"))
    error = f"run poison2: stream sequence {seq} on its own subject is not a valid event (quarantined)"
    code, out, _ = cli(capsys, nats_url, "runs", "--json")
    runs = {r["run_id"]: r for r in json.loads(out)}
    assert (runs["poison2"]["status"], runs["poison2"]["fold_error"]) == ("broken", error)
    assert (runs["stray2"]["status"], runs["stray2"]["fold_error"]) == ("completed", None)
    code, out, _ = cli(capsys, nats_url, "show", "poison2", "--json")
    shown = json.loads(out)
    assert (shown["status"], shown["fold_error"]) == ("broken", error)
    code, out, _ = cli(capsys, nats_url, "show", "stray2")
    assert "status completed" in out and "QUARANTINED" in out
    db = str(tmp_path / "p.duckdb")
    code, out, err = cli(capsys, nats_url, "sql", "SELECT run_id, status, fold_error FROM runs ORDER BY run_id",
                         "--db", db, "--format", "json")  # fmt: skip
    assert code == 0, err
    assert json.loads(out) == [
        {"run_id": "poison2", "status": "broken", "fold_error": error},
        {"run_id": "stray2", "status": "completed", "fold_error": None},
    ]

    # Nor is it resumed: a run waiting for an approval, then garbage on its own subject.
    async def waiter(run: Run) -> str:
        await run.approval("ship", {"n": 1})
        return "shipped"

    assert record_run(nats_url, waiter, "poison3").status == "suspended"
    seq = asyncio.run(publish(run_subject("cli-agent", "poison3"), b"\x00 binary"))

    async def resume() -> None:
        client = await connect(nats_url)
        try:
            (request,) = [e.payload["request_id"] for e in (await read_run(client, "poison3")).events
                          if e.type == "approval.requested"]  # fmt: skip
            await approve(client, "poison3", request, by="op")
            await resume_run(client, AgentSpec("cli-agent", waiter, ScriptedModel(["fine"] * 5)), "poison3")
        finally:
            await client.close()

    with pytest.raises(ChainError, match=rf"run poison3: event 4 \(stream sequence {seq}\): bytes on the run's own "
                       "subject that are not a valid event"):  # fmt: skip
        asyncio.run(resume())


def test_unknown_run_id_says_so(nats_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, nats_url, "show", "NOSUCHRUN")
    assert code == 4 and "no run 'NOSUCHRUN'" in err and "runledger runs" in err
    code, _, err = cli(capsys, nats_url, "show", "bad.id*")
    assert code == 4 and "not valid" in err


def test_unreachable_server_names_the_url(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"nats://127.0.0.1:{port}"
    code, _, err = cli(capsys, url, "runs")
    assert code == 4 and f"no NATS server reachable at {url}" in err and "runledger up" in err


def test_up_rejects_a_data_dir_that_is_not_writable_and_a_port_in_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNLEDGER_HOME", str(tmp_path / "home"))
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert main(["up", "--data-dir", str(blocker / "data")]) == 4
    assert "is not usable" in capsys.readouterr().err
    if os.geteuid() != 0:
        readonly = tmp_path / "ro"
        readonly.mkdir()
        readonly.chmod(0o500)
        assert main(["up", "--data-dir", str(readonly)]) == 4
        assert "cannot write there" in capsys.readouterr().err
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["up", "--port", str(port), "--data-dir", str(tmp_path / "d")]) == 4
        assert f"port {port} is already in use" in capsys.readouterr().err


UNPRIVILEGED = "runledger-test"


def unprivileged_user() -> tuple[int, int]:
    """uid and gid of a dedicated user without privileges, created the first time (as root)."""
    try:
        entry = pwd.getpwnam(UNPRIVILEGED)
    except KeyError:
        made = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", UNPRIVILEGED],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        # Another test process may have created it in the meantime (exit 9: the name exists).
        assert made.returncode in (0, 9), made.stderr
        entry = pwd.getpwnam(UNPRIVILEGED)
    return entry.pw_uid, entry.pw_gid


@pytest.mark.parametrize("owner", ["root", "user"], ids=["not-its-own", "its-own-read-only"])
def test_up_refuses_a_read_only_data_dir_for_an_unprivileged_user(owner: str) -> None:
    """Root writes anywhere, so the check runs as a dedicated unprivileged user (through setpriv;
    as the current user when that is not root): `runledger up` on a directory the user cannot
    write (someone else's, or its own made read-only on purpose) says so, exits 1, starts no
    server, and leaves the directory as it was."""
    as_user: list[str] = []
    if os.geteuid() == 0:
        uid, gid = unprivileged_user()
        as_user = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
    else:
        if owner == "root":
            pytest.fail("run as root to create a directory this user does not own")  # never a silent skip
        uid, gid = os.geteuid(), os.getegid()
    # Not under tmp_path: pytest's base temp dir is private to its owner.
    base = Path(tempfile.mkdtemp(prefix="runledger-ro-"))
    try:
        base.chmod(0o755)
        home, readonly = base / "home", base / "ro"
        home.mkdir()
        readonly.mkdir()
        os.chown(home, uid, gid)
        if owner == "user":
            os.chown(readonly, uid, gid)
            readonly.chmod(0o500)
        else:
            readonly.chmod(0o755)  # root's: the user may look inside, not write
        mode = readonly.stat().st_mode
        env = {**os.environ, "RUNLEDGER_HOME": str(home), "HOME": str(home)}
        env.pop("RUNLEDGER_NATS_URL", None)

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*as_user, sys.executable, "-m", "runledger", *args],
                cwd=base, env=env, capture_output=True, text=True, timeout=60,
            )  # fmt: skip

        up = cli("up", "--data-dir", str(readonly))
        try:
            assert up.returncode == 4, (up.stdout, up.stderr)
            assert f"data dir '{readonly}' is not usable" in up.stderr, up.stderr
            assert not (home / "server.json").exists(), "a server was started on a read-only data dir"
            assert list(readonly.iterdir()) == [] and readonly.stat().st_mode == mode
        finally:
            cli("down")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_up_status_down(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNLEDGER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RUNLEDGER_NATS_URL", raising=False)
    try:
        assert main(["up"]) == 0
        out = capsys.readouterr().out
        assert "started: nats://127.0.0.1:" in out
        assert main(["up"]) == 0 and "already running" in capsys.readouterr().out
        assert main(["status"]) == 0
        out = capsys.readouterr().out
        assert "stream LEDGER:" in out and "deny delete True" in out and "max age 90 days" in out
    finally:
        assert main(["down"]) == 0
    assert "stopped" in capsys.readouterr().out
    assert main(["status"]) == 1


def test_schema_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", "--out", str(tmp_path)]) == 0
    files = sorted(p.name for p in tmp_path.iterdir())
    assert "tool.called.schema.json" in files and "run.started.schema.json" in files
    schema = json.loads((tmp_path / "effect.intended.schema.json").read_text())
    assert schema["properties"]["type"] == {"const": "effect.intended"}


def test_stream_settings_are_explicit(nats_url: str) -> None:
    async def go() -> None:
        client = await connect(nats_url)
        info = await client.js.stream_info("LEDGER")
        await client.close()
        c = info.config
        assert c.deny_delete and c.deny_purge
        assert c.duplicate_window == 120
        assert c.max_age == 90 * 86400
        assert str(c.storage).lower().endswith("file")

    asyncio.run(go())
