"""Keys at rest: run keys are wrapped under a master key kept outside NATS, and what runledger
writes to disk is its user's alone.

Against a real nats-server: the raw LEDGER_KEYS entries, read with plain nats-py, open nothing;
content opens with the right master key and is refused, with a message saying what to do, with a
wrong or missing one; every file ``up``, ``project`` and ``export`` create is 0600 (directories
0700) under a permissive umask; ``up`` without ``--secure`` says that anyone local may use the ledger.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from runledger import AgentSpec, Run, ScriptedModel
from runledger.cli import main
from runledger.errors import KeyStoreError, MasterKeyMissingError, WrongMasterKeyError
from runledger.log.client import LedgerClient, connect
from runledger.log.server import NO_LOGINS_WARNING, EmbeddedServer, ServerState
from runledger.log.subjects import KEY_BUCKET
from runledger.ops.decisions import approve
from runledger.protect.capture import client_opener
from runledger.protect.keystore import (
    ENV_KMS,
    ENV_MASTER_KEY,
    ENV_MASTER_KEY_FILE,
    KVKeyStore,
    LocalMasterKey,
    RunKeys,
)
from runledger.protect.loading import load_run
from runledger.sdk.lifecycle import resume_run, start_run

pytestmark = pytest.mark.integration

SECRET = "Ann Example, IBAN DE89 3704 0044 0532 0130 00"


def _spec(agent: str = "vault") -> AgentSpec:
    async def fn(run: Run) -> Any:
        await run.tool("lookup", {"who": SECRET}, fn=lambda a: {"found": a["who"]})
        await run.approval("send", {"to": SECRET})  # suspends: a resume must open the recorded content
        return {"done": SECRET}

    return AgentSpec(agent, fn, ScriptedModel(["ok"]))


def _master_env(monkeypatch: pytest.MonkeyPatch, key: LocalMasterKey | None, home: Path) -> None:
    """This process's master key is ``key`` (None: none at all), nothing else."""
    for name in (ENV_KMS, ENV_MASTER_KEY, ENV_MASTER_KEY_FILE):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RUNLEDGER_HOME", str(home))
    if key is not None:
        monkeypatch.setenv(ENV_MASTER_KEY, key.to_text())


async def _raw_key_entries(url: str) -> dict[str, bytes]:
    """Every entry of the key bucket, read as any role that may read it would: plain nats-py."""
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(KEY_BUCKET)
        return {k: (await kv.get(k)).value or b"" for k in await kv.keys()}
    finally:
        await nc.close()


def _sealed_values(records: Any) -> list[dict[str, Any]]:
    return [v for r in records for v in r.event.payload.values() if isinstance(v, dict) and "$enc" in v]


async def test_the_raw_key_bucket_holds_no_key_that_opens_content(
    client: LedgerClient, nats_server: ServerState, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    master = LocalMasterKey.generate()
    _master_env(monkeypatch, master, tmp_path / "home")
    await start_run(client, _spec(), {"q": SECRET}, run_id="at-rest")
    keys = await KVKeyStore(client.js).get("vault.at-rest")
    assert keys is not None

    entries = await _raw_key_entries(nats_server.url)
    assert list(entries) == ["vault.at-rest"]
    raw = entries["vault.at-rest"]
    record = json.loads(raw)
    assert record["v"] == 2 and record["mk"] == master.key_id and "data_key" not in record and "token_key" not in record
    for secret in (keys.data_key, keys.token_key):
        for form in (secret, base64.b64encode(secret), base64.urlsafe_b64encode(secret), secret.hex().encode()):
            assert form not in raw
    # Whatever 32 bytes of the entry are taken for the data key, sealed content does not open.
    sealed = _sealed_values((await load_run(client, "at-rest", open_content=False)).records)
    assert sealed
    ct = base64.b64decode(sealed[0]["ct"])
    material = raw + base64.b64decode(record["wrapped"])
    for i in range(len(material) - 31):
        candidate = RunKeys("vault.at-rest", material[i : i + 32], b"\0" * 32)
        with pytest.raises(KeyStoreError, match="fails authentication"):
            candidate.unseal(ct)
    assert RunKeys("vault.at-rest", keys.data_key, keys.token_key).unseal(ct)  # the unwrapped key does
    # Nor is the key anywhere in the server's store files.
    for path in Path(nats_server.data_dir).rglob("*"):
        if path.is_file():
            assert keys.data_key not in path.read_bytes(), path


async def test_content_opens_only_with_the_master_key_it_was_wrapped_under(
    client: LedgerClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    right, wrong = LocalMasterKey.generate(), LocalMasterKey.generate()
    _master_env(monkeypatch, right, tmp_path / "home")
    first = await start_run(client, _spec(), {"q": SECRET}, run_id="opens")
    assert first.status == "suspended"
    await approve(client, "opens", first.pending[0], by="op")  # a resume would now replay sealed content
    opened = await load_run(client, "opens")
    assert SECRET in json.dumps([r.event.payload for r in opened.records])

    _master_env(monkeypatch, wrong, tmp_path / "home")
    with pytest.raises(WrongMasterKeyError) as wrong_key:
        await load_run(client, "opens")
    assert right.key_id in str(wrong_key.value) and wrong.key_id in str(wrong_key.value)
    assert "RUNLEDGER_MASTER_KEY" in str(wrong_key.value)
    with pytest.raises(WrongMasterKeyError):
        await resume_run(client, _spec(), "opens")

    _master_env(monkeypatch, None, tmp_path / "empty-home")
    # Without one (an analyst's process, by design) a read shows the run with its content sealed and
    # says why; whatever must open content (a strict read, a resume) is refused with what to do.
    sealed = await load_run(client, "opens")
    assert sealed.records and SECRET not in json.dumps([r.event.payload for r in sealed.records])
    with pytest.raises(MasterKeyMissingError, match="runledger up") as missing:
        await client_opener(client).key("vault.opens")
    assert str(tmp_path / "empty-home" / "master.key") in str(missing.value)
    with pytest.raises(MasterKeyMissingError):
        await resume_run(client, _spec(), "opens")
    # A run cannot start without one either, and leaves no key behind.
    with pytest.raises(MasterKeyMissingError):
        await start_run(client, _spec(), {"q": SECRET}, run_id="never")
    assert await KVKeyStore(client.js, right).get("vault.never") is None

    # The key file of another machine, given by path, is as good as the variable.
    key_file = tmp_path / "copied.key"
    key_file.write_text(right.to_text() + "\n")
    monkeypatch.setenv(ENV_MASTER_KEY_FILE, str(key_file))
    assert SECRET in json.dumps([r.event.payload for r in (await load_run(client, "opens")).records])


def test_the_cli_says_what_to_do_without_the_master_key(
    nats_url: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    _master_env(monkeypatch, LocalMasterKey.generate(), tmp_path / "home")

    async def record() -> None:
        client = await connect(nats_url)
        try:
            await start_run(client, _spec(), {"q": SECRET}, run_id="cli-run")
        finally:
            await client.close()

    asyncio.run(record())
    _master_env(monkeypatch, None, tmp_path / "other-home")
    assert main(["show", "cli-run", "--nats", nats_url]) == 0  # the run, its content sealed, and why
    out, err = capsys.readouterr()
    said = err + caplog.text  # the CLI logs to stderr; under pytest the log is captured here
    assert "content stays sealed: no master key" in said and "runledger up" in said
    assert "RUNLEDGER_MASTER_KEY" in said and SECRET not in out + said and "cli-run" in out


async def test_keys_stored_before_wrapping_are_read_and_can_be_wrapped(
    client: LedgerClient, nats_server: ServerState, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    master = LocalMasterKey.generate()
    _master_env(monkeypatch, master, tmp_path / "home")
    legacy = RunKeys.generate("vault.legacy")
    nc = await nats.connect(nats_server.url)
    try:
        kv = await nc.jetstream().key_value(KEY_BUCKET)
        await kv.put("vault.legacy", legacy.to_bytes())  # format v1, as runledger wrote it before
    finally:
        await nc.close()
    _master_env(monkeypatch, None, tmp_path / "empty-home")
    got = await KVKeyStore(client.js).get("vault.legacy")  # a v1 record needs no master key
    assert got is not None and got.data_key == legacy.data_key

    assert await KVKeyStore(client.js, master).wrap_unwrapped() == 1
    raw = (await _raw_key_entries(nats_server.url))["vault.legacy"]
    assert json.loads(raw)["v"] == 2 and base64.b64encode(legacy.data_key) not in raw
    rewrapped = await KVKeyStore(client.js, master).get("vault.legacy")
    assert rewrapped is not None and rewrapped.data_key == legacy.data_key
    with pytest.raises(MasterKeyMissingError):
        await KVKeyStore(client.js).get("vault.legacy")


class FakeKms:
    """A KMS stand-in, loaded by ``$RUNLEDGER_KMS=module:attribute``: the hook a real KMS plugs into."""

    calls: list[str] = []  # across instances: the test reads what the KMS was asked
    _inner = LocalMasterKey.generate("the fake KMS")

    @property
    def key_id(self) -> str:
        return "fake-kms:key-1"

    async def wrap(self, kid: str, secret: bytes) -> bytes:
        FakeKms.calls.append(f"wrap {kid}")
        return await self._inner.wrap(kid, secret)

    async def unwrap(self, kid: str, key_id: str, wrapped: bytes) -> bytes:
        FakeKms.calls.append(f"unwrap {kid}")
        return await self._inner.unwrap(kid, self._inner.key_id, wrapped)


async def test_a_kms_named_in_the_environment_wraps_and_unwraps(
    client: LedgerClient, nats_server: ServerState, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _master_env(monkeypatch, None, tmp_path / "home")
    monkeypatch.setenv(ENV_KMS, f"{__name__}:FakeKms")
    await start_run(client, _spec(), {"q": SECRET}, run_id="kms")
    assert SECRET in json.dumps([r.event.payload for r in (await load_run(client, "kms")).records])
    assert "wrap vault.kms" in FakeKms.calls and "unwrap vault.kms" in FakeKms.calls
    assert json.loads((await _raw_key_entries(nats_server.url))["vault.kms"])["mk"] == "fake-kms:key-1"


# -- files on disk -------------------------------------------------------------------------------------


@pytest.fixture(params=[0o000, 0o022], ids=["umask-000", "umask-022"])
def permissive_umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _assert_private_tree(root: Path) -> int:
    """Every directory under ``root`` is 0700 and every file 0600 (or stricter); returns the files seen."""
    assert _mode(root) == 0o700, root
    files = 0
    for path in root.rglob("*"):
        if path.is_dir():
            assert _mode(path) == 0o700, f"{path}: {oct(_mode(path))}"
        elif path.is_file():
            assert _mode(path) & 0o077 == 0 and _mode(path) & 0o600 == 0o600, f"{path}: {oct(_mode(path))}"
            files += 1
    return files


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A RUNLEDGER_HOME of its own (with no master key in the environment); its server stopped at the end."""
    home = tmp_path / "state" / "home"
    _master_env(monkeypatch, None, home)
    monkeypatch.delenv("RUNLEDGER_NATS_URL", raising=False)
    monkeypatch.delenv("RUNLEDGER_CREDS", raising=False)
    try:
        yield home
    finally:
        EmbeddedServer(home=home).stop()


def test_up_warns_without_secure_and_writes_only_private_files(
    home: Path, permissive_umask: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["up"]) == 0
    out = capsys.readouterr().out
    assert NO_LOGINS_WARNING in out and "any local process can read and write the ledger" in out
    assert "master key local:" in out and "created now" in out
    state = json.loads((home / "server.json").read_text())

    # The master key: created by `up`, 0600, in the 0700 home; what every process here finds.
    key_file = home / "master.key"
    assert _mode(key_file) == 0o600 and _mode(home) == 0o700
    assert LocalMasterKey.from_text(key_file.read_text(), "test").key_id in out

    # A run recorded and projected, then exported, all from the CLI under the same umask.
    async def record() -> None:
        client = await connect(state["url"])
        try:
            await start_run(client, _spec(), {"q": SECRET}, run_id="files")
        finally:
            await client.close()

    asyncio.run(record())
    db = tmp_path / "projections" / "nested" / "ledger.duckdb"
    assert main(["project", "--db", str(db)]) == 0
    parquet = tmp_path / "exports" / "now"
    assert main(["export", "--db", str(db), "--parquet", str(parquet)]) == 0
    capsys.readouterr()
    assert main(["up"]) == 0  # already running: says it again
    assert NO_LOGINS_WARNING in capsys.readouterr().out

    for name in ("master.key", "server.json", "nats-server.conf", "nats-server.log"):
        assert _mode(home / name) == 0o600, name
    assert _assert_private_tree(home) >= 4  # the store (home/data) included: nats-server's own files
    assert any((home / "data").rglob("*.blk"))
    assert _mode(db.parent) == 0o700 and _mode(db.parent.parent) == 0o700  # created here
    assert _mode(db) == 0o600
    for leftover in db.parent.iterdir():  # the lock, and a WAL if one is left
        assert _mode(leftover) == 0o600, leftover
    assert _assert_private_tree(parquet) >= 5  # a data.parquet per unpartitioned table, at least
    assert any(parquet.rglob("*.parquet"))
    assert main(["down"]) == 0


def test_up_secure_writes_private_credentials_and_says_no_warning(
    home: Path, permissive_umask: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["up", "--secure", "--agent", "vault"]) == 0
    out = capsys.readouterr().out
    assert NO_LOGINS_WARNING not in out and "logins required" in out
    secure = home / "secure"
    files = sorted(p.name for p in secure.iterdir())
    assert "auth.conf" in files and "agent-vault.json" in files and "admin.json" in files
    assert _assert_private_tree(secure) == len(files)
    assert _mode(home / "master.key") == 0o600
    assert main(["down"]) == 0


def test_a_master_key_file_readable_by_others_is_used_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from runledger.protect.keystore import ensure_master_key, master_key

    home = tmp_path / "loose"
    _master_env(monkeypatch, None, home)
    made = ensure_master_key(home)
    assert made.created and ensure_master_key(home) == type(made)(made.where, made.key_id, False)
    os.chmod(home / "master.key", 0o644)
    assert master_key().key_id == made.key_id
    assert "readable by others" in caplog.text
