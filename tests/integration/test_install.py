"""The core install, as a user gets it: ``pip install runledger`` (this repository's wheel) into a
fresh venv, without extras. It installs one package, ``runledger``; it records, crashes and resumes
a run against the embedded server with nothing else; and the commands of a missing extra say in
one line what to install.

Everything runs the venv's own programs from a directory outside the checkout (tests/installs.py).
"""

from __future__ import annotations

import ast
import csv
import json
import random
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import runledger
from tests.installs import REPO, Venv, build_wheel, kill_servers_of, make_venv, servers_of

pytestmark = pytest.mark.integration
# The checkout's folders that install under runledger: none of them may appear at top level.
CHECKOUT_FOLDERS = ("ledger", "projections", "sandbox", "integrations", "ui", "examples")
EXTRA_MODULES = ("duckdb", "pyarrow", "pytz", "docker")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def core(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """A fresh venv with ``pip install <wheel>``: the core, no extra."""
    root = tmp_path_factory.mktemp("core")
    return make_venv(root / "venv", str(wheel), workdir=root / "work")


# -- one package ------------------------------------------------------------------------------------------

OWNERS = """
import importlib.metadata as md, json, os, sysconfig
site = sysconfig.get_paths()["purelib"]
owners = {}
for dist in md.distributions():
    for f in dist.files or ():
        if f.parts and f.parts[0] != "..":
            owners.setdefault(f.parts[0], set()).add(dist.metadata["Name"])
print(json.dumps({"entries": sorted(os.listdir(site)), "owners": {k: sorted(v) for k, v in owners.items()}}))
"""


# What a walker sees: every module and sub-package of runledger (pkgutil; a plugin scanner, a docs builder).
WALK = """
import json, pkgutil, runledger
print(json.dumps(sorted([m.name, m.ispkg] for m in pkgutil.iter_modules(runledger.__path__, "runledger."))))
"""


def test_walkers_see_the_same_sub_packages_in_an_editable_install_as_in_the_wheel(core: Venv, tmp_path: Path) -> None:
    assert Path(runledger.__file__).parent == REPO / "ledger", "the tests run in an editable install (deploy/dev.sh)"
    editable = subprocess.run([sys.executable, "-c", WALK], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    from_wheel = core.python(WALK)
    assert editable.returncode == 0 and from_wheel.returncode == 0, editable.stderr + from_wheel.stderr
    wheel_sees = json.loads(from_wheel.stdout)
    assert [[f"runledger.{f}", True] for f in CHECKOUT_FOLDERS[1:] if [f"runledger.{f}", True] not in wheel_sees] == []
    assert json.loads(editable.stdout) == wheel_sees


@pytest.mark.timeout(900)
def test_the_core_installs_exactly_one_top_level_package_runledger(wheel: Path, core: Venv) -> None:
    version = wheel.name.split("-")[1]
    dist_info = f"runledger-{version}.dist-info"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        record = [row[0] for row in csv.reader(zf.read(f"{dist_info}/RECORD").decode().splitlines()) if row]
        top_level = zf.read(f"{dist_info}/top_level.txt").decode().split()
    assert top_level == ["runledger"]
    assert {n.split("/")[0] for n in names} == {n.split("/")[0] for n in record} == {"runledger", dist_info}
    assert "runledger/py.typed" in names

    site = core.site_packages()
    listing = json.loads(core.python(OWNERS).stdout)
    ours = {top for top, dists in listing["owners"].items() if "runledger" in dists}
    assert ours == {"runledger", dist_info}, f"runledger installs {sorted(ours)} into site-packages"
    assert all(listing["owners"][top] == ["runledger"] for top in ours), "runledger shares a top level name"
    unowned = set(listing["entries"]) - set(listing["owners"]) - {"__pycache__"}
    assert unowned == set(), f"site-packages holds entries no distribution installed: {sorted(unowned)}"
    for folder in CHECKOUT_FOLDERS:
        assert not (site / folder).exists(), f"the checkout's folder {folder}/ installed at top level"
    assert (site / "runledger" / "py.typed").is_file()
    for sub in ("projections", "sandbox", "integrations", "ui", "examples", "record", "sdk", "cli"):
        assert (site / "runledger" / sub / "__init__.py").is_file(), f"runledger.{sub} is not installed"
    assert (site / "runledger" / "sandbox" / "image_files" / "Dockerfile").is_file()
    assert core.bin("runledger").is_file() and core.bin("nats-server").is_file()


@pytest.mark.timeout(900)
def test_the_core_imports_its_public_api_without_any_extra(core: Venv) -> None:
    shown = core.python("import runledger; print(runledger.__all__)")
    assert shown.returncode == 0, shown.stderr
    assert ast.literal_eval(shown.stdout.strip()) == runledger.__all__

    probe = core.python(
        "import importlib.util, json, sys, runledger\n"
        "names = {n: type(getattr(runledger, n)).__name__ for n in runledger.__all__}\n"
        f"extras = {EXTRA_MODULES!r}\n"
        "print(json.dumps({'file': runledger.__file__, 'names': names,\n"
        "    'findable': [m for m in extras if importlib.util.find_spec(m) is not None],\n"
        "    'imported': [m for m in extras if m in sys.modules]}))"
    )
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    assert Path(found["file"]).is_relative_to(core.root), f"imported from {found['file']}, not from the venv"
    assert sorted(found["names"]) == sorted(runledger.__all__)  # every public name resolves in the core
    assert found["findable"] == [], f"the core install brought in {found['findable']}"
    assert found["imported"] == []


# -- a missing extra --------------------------------------------------------------------------------------


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["project"], "projections"),
        (["sql", "SELECT 1"], "projections"),
        (["export"], "projections"),
        (["quarantine"], "projections"),
        (["sandbox", "build"], "sandbox"),
        (["worker"], "sandbox"),
        (["rerun", "R1", "--agent", "shop:spec", "--mode", "redrive", "--local"], "sandbox"),
        (["project", "--follow"], "projections"),
    ],
)  # fmt: skip
def test_a_command_of_a_missing_extra_says_in_one_line_what_to_install(
    core: Venv, tmp_path: Path, argv: list[str], extra: str
) -> None:
    home = tmp_path / "home"
    try:
        done = core.run("runledger", *argv, RUNLEDGER_HOME=str(home))
    finally:
        started = kill_servers_of(home)
    assert done.returncode == 4, (done.returncode, done.stdout, done.stderr)  # Exit.ERROR
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{done.stderr}"
    assert f"pip install 'runledger[{extra}]'" in lines[0]
    assert f"`runledger {argv[0]}" in lines[0]
    assert "Traceback" not in done.stderr + done.stdout
    assert done.stdout == ""
    assert started == [], "a command that cannot run started a nats-server"


@pytest.mark.timeout(900)
def test_importing_the_projections_package_without_its_extra_names_the_extra(core: Venv) -> None:
    done = core.python("import runledger.projections")
    assert done.returncode == 1
    assert "MissingExtraError" in done.stderr
    assert "pip install 'runledger[projections]'" in done.stderr.strip().splitlines()[-1]
    caught = core.python(
        "try:\n    import runledger.projections\n"
        "except ImportError as exc:\n    print(type(exc).__name__, exc.extra, exc.missing)"
    )
    assert caught.stdout.split() == ["MissingExtraError", "projections", "duckdb"], caught.stderr


# -- record, crash, resume ----------------------------------------------------------------------------------

SHOP_AGENT = '''
"""A small shop agent, written as a user writes one: it knows nothing of the test that kills it."""

import json
import os
import time
from pathlib import Path

from runledger import NOT_FOUND, AgentSpec, Run, ScriptedModel

BACKEND = Path(os.environ["SHOP_BACKEND"])  # where the payments "service" writes its refunds
LATENCY = float(os.environ.get("SHOP_LATENCY", "0.3"))  # a slow backend


def reply(messages):
    if messages[-1]["content"].startswith("classify"):
        return json.dumps({"intent": "refund"})
    return "We have refunded your order."


def lookup_line(args):
    time.sleep(LATENCY)
    return {"order": args["order"], "line": args["line"], "amount": 10.5 * (args["line"] + 1)}


def issue_refund(args):
    """Not idempotent: every call refunds again (one line in the backend's log)."""
    time.sleep(LATENCY)
    with open(BACKEND / "refunds.jsonl", "a") as log:
        log.write(json.dumps(args) + "\\n")
    time.sleep(LATENCY)
    return {"refund_id": "rf-" + args["order"], "amount": args["amount"]}


def find_refund(key):
    """Reconcile: ask the backend whether the refund happened."""
    order = key.split(":", 1)[1]
    log = BACKEND / "refunds.jsonl"
    for line in log.read_text().splitlines() if log.exists() else []:
        refund = json.loads(line)
        if refund["order"] == order:
            return {"refund_id": "rf-" + order, "amount": refund["amount"]}
    return NOT_FOUND


def notify(args):
    time.sleep(LATENCY)
    return {"queued": args["to"], "part": args["part"]}


async def handle(run: Run):
    order = run.input["order"]
    intent = await run.model([{"role": "user", "content": "classify " + run.input["text"]}])
    lines = [await run.tool("lookup_line", {"order": order, "line": i}, fn=lookup_line) for i in range(4)]
    amount = sum(line["amount"] for line in lines)
    refund = await run.effect(
        "refund", {"order": order, "amount": amount}, key="refund:" + order, fn=issue_refund, reconcile=find_refund
    )
    for part in range(3):
        await run.tool("notify", {"to": run.input["email"], "part": part}, fn=notify)
    answer = await run.model([{"role": "user", "content": "write the reply"}])
    return {"intent": json.loads(intent.content)["intent"], "refund": refund, "reply": answer.content}


spec = AgentSpec("shop", handle, ScriptedModel(reply, name="scripted-shop"), agent_version="shop-1")
'''
LATENCY = 0.3
# The backend calls of each step: the model, four lookups, the refund (before and after it acts),
# three notifications, the model.
SLOW_CALLS = [0, 1, 1, 1, 1, 2, 1, 1, 1, 0]
STEPS = len(SLOW_CALLS)
AMOUNT = sum(10.5 * (i + 1) for i in range(4))


@pytest.fixture(scope="module")
def ledger_home(core: Venv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """RUNLEDGER_HOME of the crash tests. The embedded server starts on first use; at the end
    `runledger down` stops it, and whatever is left of it is killed (and fails the test)."""
    home = tmp_path_factory.mktemp("ledger-home")
    try:
        first = core.run("runledger", "runs", "--json", RUNLEDGER_HOME=str(home))
        assert first.returncode == 0, first.stderr
        assert json.loads(first.stdout) == []
        assert "started the embedded nats-server at nats://127.0.0.1:" in first.stderr
        state = json.loads((home / "server.json").read_text())
        assert servers_of(home) == [state["pid"]]
        yield home
        down = core.run("runledger", "down", RUNLEDGER_HOME=str(home))
        assert down.returncode == 0 and "stopped the embedded nats-server" in down.stdout, down.stderr
    finally:
        left = kill_servers_of(home)
    assert left == [], f"nats-server {left} outlived `runledger down`"


def checkpoint(core: Venv, home: Path, run_id: str, strict: bool = True) -> dict[str, Any] | None:
    """``runledger checkpoint RUN --json``; None when the run is not there (yet)."""
    shown = core.run("runledger", "checkpoint", run_id, "--json", RUNLEDGER_HOME=str(home))
    if shown.returncode != 0:
        assert not strict or f"no run {run_id!r}" in shown.stderr, shown.stderr
        return None
    result: dict[str, Any] = json.loads(shown.stdout)
    return result


def refunds(backend: Path) -> list[dict[str, Any]]:
    log = backend / "refunds.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.timeout(900)
@pytest.mark.parametrize("attempt", range(3))
def test_the_core_records_a_run_survives_a_sigkill_anywhere_and_resumes_it(
    core: Venv, ledger_home: Path, tmp_path: Path, attempt: int
) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    agent_dir, backend = tmp_path / "agent", tmp_path / "backend"
    agent_dir.mkdir()
    backend.mkdir()
    (agent_dir / "shop.py").write_text(SHOP_AGENT)
    env = {"RUNLEDGER_HOME": str(ledger_home), "PYTHONPATH": str(agent_dir), "SHOP_BACKEND": str(backend),
           "SHOP_LATENCY": str(LATENCY)}  # fmt: skip
    run_id, order = f"shop-{attempt}-{seed}", f"o-{attempt}-{seed}"
    task = {"order": order, "text": "my blender broke, refund please", "email": "ana@example.com"}

    proc = core.popen("runledger", "run", "--agent", "shop:spec", "--run-id", run_id, "--input", json.dumps(task),
                      **env)  # fmt: skip
    try:
        # A bounded wait for a recorded step; then the kill comes at a random moment of the rest of the run.
        deadline = time.monotonic() + 60
        while (cp := checkpoint(core, ledger_home, run_id, strict=False)) is None or cp["last_step"] < 0:
            assert proc.poll() is None, f"the run ended before its first step: {proc.communicate()}"
            assert time.monotonic() < deadline, f"the run recorded no step within 60 s: {cp}"
        delay = rng.uniform(0, LATENCY * sum(SLOW_CALLS[cp["last_step"] :]))  # about what is left of the run
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate()
    where = f"(seed {seed}: kill {delay:.2f}s after step {cp['last_step']} was seen; exit {code}; {out}{err})"

    assert code in (0, -signal.SIGKILL), where
    before = checkpoint(core, ledger_home, run_id)
    assert before is not None
    refunded_before = len(refunds(backend))
    print(f"{where}: {before['status']} at step {before['last_step']} of {STEPS - 1}, {refunded_before} refund(s), "
          f"committed {before['committed_keys']}")  # fmt: skip
    if before["status"] == "completed":  # the kill came after the last event: nothing to resume, nothing ran twice
        resumed = core.run("runledger", "resume", run_id, "--agent", "shop:spec", **env)
        assert resumed.returncode == 0 and "nothing to do" in resumed.stdout, resumed.stdout + resumed.stderr
    else:
        assert code == -signal.SIGKILL and before["status"] == "running", where
        resumed = core.run("runledger", "resume", run_id, "--agent", "shop:spec", **env)
        assert resumed.returncode == 0, f"{where}\n{resumed.stdout}{resumed.stderr}"
        assert f"run {run_id}: completed" in resumed.stdout, f"{where}\n{resumed.stdout}{resumed.stderr}"

    after = checkpoint(core, ledger_home, run_id)
    assert after is not None
    assert after["status"] == "completed", where
    assert after["attempts"] == (1 if before["status"] == "completed" else 2), where
    assert after["last_step"] == STEPS - 1, where
    assert after["committed_keys"] == [f"refund:{order}"] and after["in_doubt_keys"] == [], where
    expected_refund = {"refund_id": f"rf-{order}", "amount": AMOUNT}
    assert after["output"] == {"intent": "refund", "refund": expected_refund, "reply": "We have refunded your order."}
    # The refund happened exactly once across the crash and the resume.
    assert refunds(backend) == [{"order": order, "amount": AMOUNT}], where

    verified = core.run("runledger", "verify", run_id, RUNLEDGER_HOME=str(ledger_home))
    assert verified.returncode == 0 and f"ok   {run_id}" in verified.stdout, verified.stdout + verified.stderr
    listed = core.run("runledger", "runs", "--json", RUNLEDGER_HOME=str(ledger_home))
    (summary,) = [r for r in json.loads(listed.stdout) if r["run_id"] == run_id]
    assert summary["status"] == "completed" and summary["steps"] == STEPS
    shown = core.run("runledger", "show", run_id, RUNLEDGER_HOME=str(ledger_home))
    assert shown.returncode == 0 and "effect.committed" in shown.stdout and "run.completed" in shown.stdout
    # A second resume changes nothing.
    again = core.run("runledger", "resume", run_id, "--agent", "shop:spec", **env)
    assert again.returncode == 0 and "nothing to do" in again.stdout
    assert len(refunds(backend)) == 1
