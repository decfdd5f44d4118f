"""Run keys wrapped under a master key, and private files: nothing running."""

from __future__ import annotations

import base64
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from runledger.errors import KeyStoreError, MasterKeyError, MasterKeyMissingError, WrongMasterKeyError
from runledger.log.private import private_dir, private_umask, write_private
from runledger.protect.keystore import (
    ENV_KMS,
    ENV_MASTER_KEY,
    ENV_MASTER_KEY_FILE,
    KeyWrapper,
    LocalMasterKey,
    RunKeys,
    ensure_master_key,
    master_key,
    unwrap_keys,
    wrap_keys,
)


@pytest.fixture
def loose_umask() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


async def test_wrapped_keys_round_trip_and_name_their_master_key() -> None:
    master, keys = LocalMasterKey.generate(), RunKeys.generate("a.r1")
    record = await wrap_keys(master, keys)
    stored = json.loads(record)
    assert stored["v"] == 2 and stored["mk"] == master.key_id and stored["kid"] == "a.r1"
    assert base64.b64encode(keys.data_key) not in record and keys.data_key not in record
    back = await unwrap_keys("a.r1", record, lambda: master)
    assert (back.data_key, back.token_key) == (keys.data_key, keys.token_key)


async def test_another_master_key_is_named_not_decrypted() -> None:
    master, other = LocalMasterKey.generate(), LocalMasterKey.generate("$RUNLEDGER_MASTER_KEY")
    record = await wrap_keys(master, RunKeys.generate("a.r1"))
    with pytest.raises(WrongMasterKeyError) as exc:
        await unwrap_keys("a.r1", record, lambda: other)
    assert exc.value.wrapped_under == master.key_id and other.key_id in exc.value.have
    assert "$RUNLEDGER_MASTER_KEY" in str(exc.value)


async def test_an_altered_or_moved_record_fails_authentication() -> None:
    master = LocalMasterKey.generate()
    stored = json.loads(await wrap_keys(master, RunKeys.generate("a.r1")))
    wrapped = bytearray(base64.b64decode(stored["wrapped"]))
    wrapped[-1] ^= 1
    altered = json.dumps({**stored, "wrapped": base64.b64encode(bytes(wrapped)).decode()}).encode()
    with pytest.raises(KeyStoreError, match="fail authentication"):
        await unwrap_keys("a.r1", altered, lambda: master)
    moved = json.dumps({**stored, "kid": "b.r2"}).encode()  # another run's record, relabelled
    with pytest.raises(KeyStoreError, match="fail authentication"):
        await unwrap_keys("b.r2", moved, lambda: master)
    with pytest.raises(KeyStoreError, match=r"record of a\.r1"):
        await unwrap_keys("b.r2", json.dumps(stored).encode(), lambda: master)


async def test_unwrapped_records_are_read_without_a_master_key_and_newer_ones_refused() -> None:
    legacy = RunKeys.generate("a.old")

    def no_master() -> KeyWrapper:
        raise AssertionError("a v1 record needs no master key")

    assert (await unwrap_keys("a.old", legacy.to_bytes(), no_master)).data_key == legacy.data_key
    with pytest.raises(KeyStoreError, match=r"format 3.*upgrade"):
        await unwrap_keys("a.new", json.dumps({"v": 3, "kid": "a.new"}).encode(), no_master)
    with pytest.raises(KeyStoreError, match="corrupt"):
        await unwrap_keys("a.bad", b"{not json", no_master)


def test_the_master_key_is_found_in_order_and_its_absence_explained(tmp_path: Path) -> None:
    key, other = LocalMasterKey.generate(), LocalMasterKey.generate()
    path = tmp_path / "mk"
    path.write_text(other.to_text() + "\n")
    env = {ENV_MASTER_KEY: key.to_text(), ENV_MASTER_KEY_FILE: str(path), "RUNLEDGER_HOME": str(tmp_path)}
    assert master_key(env).key_id == key.key_id
    del env[ENV_MASTER_KEY]
    assert master_key(env).key_id == other.key_id
    env[ENV_MASTER_KEY_FILE] = str(tmp_path / "absent")
    with pytest.raises(MasterKeyMissingError, match="runledger up") as missing:
        master_key(env)
    assert str(tmp_path / "absent") in missing.value.looked
    env[ENV_KMS] = "no-such-kms"
    with pytest.raises(MasterKeyError, match="names no KMS"):
        master_key(env)
    env[ENV_KMS] = "no_such_module_anywhere:Kms"
    with pytest.raises(MasterKeyError, match="cannot be loaded"):
        master_key(env)


@pytest.mark.parametrize("text", ["not base64!", base64.b64encode(b"short").decode(), ""])
def test_a_malformed_master_key_says_how_to_make_one(text: str) -> None:
    with pytest.raises(MasterKeyError, match=r"makes one .*urandom\(32\)"):
        LocalMasterKey.from_text(text or "=", "$RUNLEDGER_MASTER_KEY")


def test_a_master_key_survives_its_text_form_in_either_alphabet() -> None:
    key = LocalMasterKey.generate()
    urlsafe = key.to_text().replace("+", "-").replace("/", "_")
    assert LocalMasterKey.from_text(f"  {urlsafe}\n", "x").key_id == key.key_id
    assert key.to_text() not in repr(key)


def test_ensure_master_key_creates_once_private(
    tmp_path: Path, loose_umask: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (ENV_KMS, ENV_MASTER_KEY, ENV_MASTER_KEY_FILE):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "a" / "home"
    made = ensure_master_key(home)
    assert made.created and made.where == str(home / "master.key")
    assert _mode(home / "master.key") == 0o600 and _mode(home) == 0o700 and _mode(home.parent) == 0o700
    again = ensure_master_key(home)
    assert not again.created and again.key_id == made.key_id
    assert [p.name for p in home.iterdir()] == ["master.key"]  # no temp file left
    monkeypatch.setenv(ENV_MASTER_KEY, LocalMasterKey.generate().to_text())
    from_env = ensure_master_key(tmp_path / "other")
    assert from_env.where == "$RUNLEDGER_MASTER_KEY" and not (tmp_path / "other").exists()


def test_private_files_ignore_the_umask_and_tighten_old_files(
    tmp_path: Path, loose_umask: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runledger.log import private

    monkeypatch.setattr(private, "_holders", 0)  # stores other tests left open hold the umask too
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    target = private_dir(shared / "x" / "y")
    assert _mode(target) == 0o700 and _mode(target.parent) == 0o700 and _mode(shared) == 0o755
    old = target / "creds.json"
    old.write_text("old")
    os.chmod(old, 0o644)
    write_private(old, "new")
    assert old.read_text() == "new" and _mode(old) == 0o600
    with private_umask(), private_umask():
        (target / "inner").write_text("x")
    (target / "outer").write_text("x")
    assert _mode(target / "inner") == 0o600 and _mode(target / "outer") == 0o666  # restored once, at the end


async def test_the_stores_of_one_connection_look_the_key_bucket_up_once() -> None:
    # Every run's start makes a store (run_protector): the bucket's handle is the connection's.
    from runledger.log.memory import MemoryLedger
    from runledger.protect.keystore import KVKeyStore

    client, other = await MemoryLedger().connect(), await MemoryLedger().connect()
    lookups: list[object] = []
    for js in (client.js, other.js):
        real = js.key_value

        async def counted(bucket: str, real: object = real, js: object = js) -> object:
            lookups.append(js)
            return await real(bucket)  # type: ignore[operator]

        js.key_value = counted  # type: ignore[method-assign]
    master = LocalMasterKey.generate()
    created = [await KVKeyStore(client.js, master).create(f"a.r{i}") for i in range(3)]
    assert lookups == [client.js]
    for keys in created:
        back = await KVKeyStore(client.js, master).get(keys.kid)
        assert back is not None and back.data_key == keys.data_key
    assert await KVKeyStore(other.js, master).get("a.r0") is None  # another connection: its own lookup
    assert lookups == [client.js, other.js]
