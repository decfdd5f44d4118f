"""Erasure reaches every copy: erasing a run erases its sandbox branches and child runs (at any
depth), the projection rewrites their rows, a later Parquet export holds none of their content,
and the sandbox refuses to re-run any of them.

Real nats-server, a real DuckDB file and real Docker. Planted phrases go through the agent's
input, a tool's output, a model reply and a child run; after the root is erased none of them is
readable through any command, in any run of the lineage, or in the bytes of any file. Since that
content is sealed, the phrases prove little alone: every run key (the bucket's wrapped record, and
the data and token keys it opens to) is captured before the erasure and looked for after it in
every message NATS holds and in every byte of the server's store. The same lineage recorded with
``encrypt=False`` checks what erasure promises without sealing: blobs deleted, keys destroyed,
unsealed events counted, the projection and exports cleared."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest
from nats.js.errors import KeyNotFoundError, NotFoundError

from runledger.cli import main
from runledger.errors import KeyStoreError, LedgerError
from runledger.log.client import LedgerClient
from runledger.log.reader import read_raw
from runledger.log.server import ServerState
from runledger.log.subjects import KEY_BUCKET
from runledger.protect.blobs import BlobStore, is_blob_ref
from runledger.protect.capture import content_values
from runledger.protect.erasure import erase_run, erased_now
from runledger.protect.keystore import KVKeyStore, run_kid
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from runledger.sandbox import rerun as rerun_module
from runledger.sandbox.errors import RunErasedError
from runledger.sandbox.rerun import Rerunner, RerunRequest
from runledger.sdk.lifecycle import start_run
from tests.integration.sandbox.lineage_agent import DOCUMENT, PLANTED, REPLY, plain_root_spec, root_spec

pytestmark = [pytest.mark.integration, pytest.mark.docker]
ROOT_AGENT = "tests.integration.sandbox.lineage_agent:root_spec"
CHILD_AGENT = "tests.integration.sandbox.lineage_agent:reader_spec"
PLAIN_ROOT_AGENT = "tests.integration.sandbox.lineage_agent:plain_root_spec"
PLAIN_CHILD_AGENT = "tests.integration.sandbox.lineage_agent:plain_reader_spec"
TABLES = ("events", "runs", "steps", "checkpoints", "effect_keys", "quarantine")


def _unreadable(text: str, where: str) -> None:
    for phrase in PLANTED:
        assert phrase not in text, f"{phrase!r} is still readable in {where}"


def _scan_files(root: Path, where: str, skip: Path | None = None) -> int:
    """Every file under ``root`` but ``skip``, byte for byte (UTF-8 and UTF-16 forms of each phrase).
    Returns how many."""
    files = [p for p in root.rglob("*") if p.is_file() and (skip is None or not p.is_relative_to(skip))]
    for path in files:
        data = path.read_bytes()
        for phrase in PLANTED:
            for encoded in (phrase.encode(), phrase.encode("utf-16-le")):
                assert encoded not in data, f"{phrase!r} is in the bytes of {path} ({where})"
    return len(files)


async def _key_material(client: LedgerClient, lineage: list[str]) -> dict[str, dict[str, bytes]]:
    """Every run key in LEDGER_KEYS before the erasure, as it is stored (the bucket's record, the
    wrapped bytes in it) and as it opens (data key and token key, raw and base64): kid -> form -> bytes.
    Each run of ``lineage`` has one (branches under the workers' prefix)."""
    kv = await client.js.key_value(KEY_BUCKET)
    store = KVKeyStore(client.js)
    found: dict[str, dict[str, bytes]] = {}
    for kid in await kv.keys():
        entry = await kv.get(kid)
        keys = await store.get(kid)
        assert entry.value is not None and keys is not None, kid
        forms = {"record": entry.value, "wrapped": base64.b64decode(json.loads(entry.value)["wrapped"])}
        for name, secret in (("data key", keys.data_key), ("token key", keys.token_key)):
            forms[name], forms[f"{name} (base64)"] = secret, base64.b64encode(secret)
        found[kid] = forms
    assert sorted(kid.rsplit(".", 1)[1] for kid in found) == sorted(lineage), found.keys()
    return found


async def _every_message(client: LedgerClient) -> list[tuple[str, int, bytes]]:
    """(stream, sequence, headers and body) of every message NATS still holds, in every stream:
    the log, the key bucket (every revision it keeps) and the object store."""
    out: list[tuple[str, int, bytes]] = []
    for info in await client.js.streams_info():
        name = info.config.name
        assert name is not None
        for seq in range(max(1, info.state.first_seq), info.state.last_seq + 1):
            try:
                msg = await client.js.get_msg(name, seq)
            except NotFoundError:
                continue  # deleted
            headers = json.dumps(msg.headers or {}).encode()
            out.append((name, seq, headers + (msg.data or b"")))
    return out


async def _keys_gone(client: LedgerClient, material: dict[str, dict[str, bytes]], data_dir: Path) -> None:
    """No key of ``material`` opens, can be re-created, or is left in any form: in any message
    NATS holds or in any byte of the server's store (a KV message is deleted securely, and a
    bucket keeps history: an older revision, or a purge that only hides it, would be found)."""
    kv = await client.js.key_value(KEY_BUCKET)
    store = KVKeyStore(client.js)
    for kid in material:
        assert await store.get(kid) is None, kid
        with pytest.raises(KeyNotFoundError):
            await kv.get(kid)
        with pytest.raises(KeyStoreError, match="destroyed"):
            await store.create(kid)
    messages = await _every_message(client)
    assert messages
    files = [(p, p.read_bytes()) for p in data_dir.rglob("*") if p.is_file()]
    assert files
    for kid, forms in material.items():
        for form, needle in forms.items():
            for stream, seq, data in messages:
                assert needle not in data, f"the {form} of {kid} is in {stream} message {seq}"
            for path, data in files:
                assert needle not in data, f"the {form} of {kid} is in the bytes of {path}"


async def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = await asyncio.to_thread(main, list(argv))
    captured = capsys.readouterr()
    assert code == 0, f"runledger {' '.join(argv)} exited {code}: {captured.out}{captured.err}"
    return captured.out + captured.err


async def test_erasing_a_run_reaches_its_branches_children_projection_and_exports(
    client: LedgerClient,
    nats_server: ServerState,
    rerunner: Rerunner,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = client.url
    db = str(tmp_path / "ledger.duckdb")
    nats = ("--nats", url)

    # The lineage: a root run with a child run, a re-drive branch of the root (its model call is
    # live from the fork: a new reply, sealed under the branch's own key) and one of the child.
    root = await start_run(client, root_spec(), {"doc": DOCUMENT}, run_id="lin-root")
    assert root.status == "completed", root
    child_id = fold((await load_run(client, "lin-root")).records).steps[2].child_run_id
    assert child_id
    branch = await rerunner.rerun(RerunRequest(parent_run_id="lin-root", agent=ROOT_AGENT, mode="redrive", fork_step=1))
    assert branch.status == "completed", branch.error
    child_branch = await rerunner.rerun(
        RerunRequest(parent_run_id=child_id, agent=CHILD_AGENT, mode="redrive", fork_step=0)
    )
    assert child_branch.status == "completed", child_branch.error
    lineage = ["lin-root", child_id, branch.run_id, child_branch.run_id]
    await _cli(capsys, "project", "--db", db, "--quiet", *nats)

    # Before: the branch's own copy (re-sealed under the branch's key) is readable, as is every run's.
    shown = await _cli(capsys, "show", branch.run_id, "--step", "1", "--fetch", *nats)
    assert REPLY in shown and "Quillfeather" in shown
    for run_id in lineage:
        opened = json.dumps([r.event.payload for r in (await load_run(client, run_id, fetch=True)).records])
        assert any(p in opened for p in PLANTED), f"nothing planted was ever readable in {run_id}"

    material = await _key_material(client, lineage)
    out = await _cli(capsys, "erase", "lin-root", "--reason", "data subject request #7", "--by", "dpo", *nats)
    for run_id in lineage[1:]:
        assert run_id in out, out
    await _keys_gone(client, material, Path(nats_server.data_dir))

    # The log: each run of the lineage recorded run.erased, naming the root as the cause.
    for run_id in lineage:
        erased = await erased_now(client, run_id)
        assert erased is not None and erased["by"] == "dpo", run_id
        assert erased.get("because_of") == (None if run_id == "lin-root" else "lin-root"), (run_id, erased)
        agent = (await load_run(client, run_id, open_content=False)).agent
        assert await KVKeyStore(client.js).get(run_kid(agent, run_id)) is None
    derived = {r.event.run_id: r.event.payload for run_id in lineage[1:]
               for r in (await load_run(client, run_id)).records if r.event.type == "run.erased"}  # fmt: skip
    assert derived[branch.run_id]["relation"] == "branch" and derived[branch.run_id]["derived_from"] == "lin-root"
    assert derived[child_id]["relation"] == "child" and derived[child_id]["derived_from"] == "lin-root"
    assert derived[child_branch.run_id]["derived_from"] == child_id

    # Every command, every run of the lineage.
    await _cli(capsys, "project", "--db", db, "--quiet", *nats)  # incremental: the erased rows are rewritten
    for run_id in lineage:
        cp = fold((await load_run(client, run_id, open_content=False)).records)
        _unreadable(await _cli(capsys, "show", run_id, *nats), f"show {run_id}")
        _unreadable(await _cli(capsys, "show", run_id, "--json", *nats), f"show {run_id} --json")
        for step in cp.steps:
            text = await _cli(capsys, "show", run_id, "--step", str(step), "--fetch", *nats)
            _unreadable(text, f"show {run_id} --step {step} --fetch")
        _unreadable(await _cli(capsys, "checkpoint", run_id, "--json", *nats), f"checkpoint {run_id}")
        _unreadable(await _cli(capsys, "checkpoint", run_id, "--at-step", "1", *nats), f"checkpoint {run_id} --at-step")
        opened = await load_run(client, run_id, fetch=True)
        _unreadable(json.dumps([r.event.payload for r in opened.records]), f"the opened log of {run_id}")
    for parent, child in (("lin-root", branch.run_id), (child_id, child_branch.run_id)):
        _unreadable(await _cli(capsys, "diff", parent, child, *nats), f"diff {parent} {child}")
        _unreadable(await _cli(capsys, "diff", parent, child, "--json", *nats), f"diff {parent} {child} --json")

    # The projection: rewritten, structure kept.
    for table in TABLES:
        text = await _cli(capsys, "sql", f"SELECT * FROM {table}", "--db", db, "--format", "json", *nats)
        _unreadable(text, f"sql {table}")
    rows = await _cli(capsys, "sql", "SELECT run_id, status, input, output, tokens FROM runs ORDER BY run_id",
                      "--db", db, "--format", "json", "--no-sync", *nats)  # fmt: skip
    runs = {r["run_id"]: r for r in json.loads(rows)}
    assert set(lineage) <= set(runs)
    assert all(runs[r]["status"] == "completed" and "$erased" in str(runs[r]["input"]) for r in lineage), runs
    assert runs["lin-root"]["tokens"] == 18  # token usage is structure: kept

    # A Parquet export made afterwards, the DuckDB file and its WAL, the server's store.
    export = tmp_path / "lake"
    await _cli(capsys, "export", "--parquet", str(export), "--db", db, *nats)
    assert _scan_files(export, "the Parquet export") > 0
    assert _scan_files(tmp_path, "the DuckDB file and everything else under the test's directory") > 0
    raw = b"".join(r.data for r in await read_raw(client, "ledger.>"))
    _unreadable(raw.decode("utf-8", "replace"), "the raw stream")
    assert _scan_files(Path(nats_server.data_dir), "the nats-server store") > 0

    # Rebuilt from the stream, the projection holds no content of the lineage either.
    await _cli(capsys, "project", "--db", db, "--rebuild", "--quiet", *nats)
    for table in TABLES:
        _unreadable(await _cli(capsys, "sql", f"SELECT * FROM {table}", "--db", db, "--format", "csv", "--no-sync",
                               *nats), f"sql {table} after --rebuild")  # fmt: skip
    assert _scan_files(tmp_path, "the rebuilt DuckDB file") > 0

    # The sandbox refuses to re-run any run of the lineage, with an error that says why.
    for run_id, agent in (("lin-root", ROOT_AGENT), (branch.run_id, ROOT_AGENT), (child_id, CHILD_AGENT)):
        with pytest.raises(RunErasedError, match=f"run {run_id} was erased") as refused:
            await rerunner.rerun(RerunRequest(parent_run_id=run_id, agent=agent, mode="redrive", fork_step=0))
        assert "cannot be re-run" in str(refused.value)
        if run_id != "lin-root":
            assert "because run lin-root was" in str(refused.value)


async def test_a_branch_started_while_its_parent_is_erased_is_erased_too(
    client: LedgerClient, rerunner: Rerunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The erasure lands after the re-run checked its parent and before it recorded run.forked:
    the erasure's lineage lookup cannot see the branch, so the branch, finding the parent erased
    once it is recorded, erases itself and the request is refused."""
    root = await start_run(client, root_spec(), {"doc": DOCUMENT}, run_id="lin-race")
    assert root.status == "completed", root
    protector = rerun_module.run_protector

    async def erase_meanwhile(*args: Any, **kwargs: Any) -> Any:
        result = await erase_run(client, "lin-race", reason="request #9", by="dpo")
        assert result.lineage == [] or all(d.run_id != "br-race" for d in result.lineage)
        return await protector(*args, **kwargs)

    monkeypatch.setattr(rerun_module, "run_protector", erase_meanwhile)
    request = RerunRequest(parent_run_id="lin-race", agent=ROOT_AGENT, mode="redrive", fork_step=1, request_id="race")
    with pytest.raises(RunErasedError, match="run lin-race was erased"):
        await rerunner.rerun(request)
    erased = await erased_now(client, "br-race")
    assert erased is not None and erased["because_of"] == "lin-race" and erased["by"] == "dpo"
    assert await KVKeyStore(client.js).get(run_kid("lineage_root", "br-race")) is None
    opened = json.dumps([r.event.payload for r in (await load_run(client, "br-race", fetch=True)).records])
    _unreadable(opened, "the branch started during the erasure")


async def test_erasing_an_unsealed_lineage_deletes_its_blobs_and_keys_and_counts_its_events(
    client: LedgerClient,
    nats_server: ServerState,
    rerunner: Rerunner,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``DataPolicy(encrypt=False)``, every content value by reference: no key seals anything, so
    what erasure promises is the rest. Each run's blobs are deleted (no reader, no message NATS
    holds, has the planted plaintext any more), the keys it has (redaction's token keys) are
    destroyed as sealed runs' are, ``run.erased`` counts exactly the events recorded unsealed and
    ``erase`` warns about them, and the projection (rebuilt: a fresh file) and a new export hold none
    of the content. The log itself only ever held references."""
    url = client.url
    db = tmp_path / "ledger.duckdb"
    nats = ("--nats", url)
    root = await start_run(client, plain_root_spec(), {"doc": DOCUMENT}, run_id="plain-root")
    assert root.status == "completed", root
    child_id = fold((await load_run(client, "plain-root")).records).steps[2].child_run_id
    assert child_id
    branch = await rerunner.rerun(
        RerunRequest(parent_run_id="plain-root", agent=PLAIN_ROOT_AGENT, mode="redrive", fork_step=1)
    )
    assert branch.status == "completed", branch.error
    child_branch = await rerunner.rerun(
        RerunRequest(parent_run_id=child_id, agent=PLAIN_CHILD_AGENT, mode="redrive", fork_step=0)
    )
    assert child_branch.status == "completed", child_branch.error
    lineage = ["plain-root", child_id, branch.run_id, child_branch.run_id]

    # Before: every content value is a blob in the clear, and the planted phrases are readable.
    unsealed: dict[str, int] = {}
    refs: list[dict[str, Any]] = []
    for run_id in lineage:
        records = (await load_run(client, run_id, open_content=False)).records
        values = [(r, content_values(r.event)) for r in records]
        for r, found in values:
            assert all(is_blob_ref(v) and not v.get("enc") for v in found), r.event
            refs += found
        unsealed[run_id] = sum(1 for _, found in values if found)
        opened = json.dumps([r.event.payload for r in (await load_run(client, run_id, fetch=True)).records])
        assert any(p in opened for p in PLANTED), f"nothing planted was ever readable in {run_id}"
    assert all(unsealed.values()), unsealed
    held = b"".join(data for _, _, data in await _every_message(client)).decode("utf-8", "replace")
    assert any(p in held for p in PLANTED), "the blobs never held the planted phrases in the clear"
    material = await _key_material(client, lineage)
    await _cli(capsys, "project", "--db", str(db), "--quiet", *nats)

    out = await _cli(capsys, "erase", "plain-root", "--reason", "data subject request #8", "--by", "dpo", *nats)
    warning = f"WARNING: {sum(unsealed.values())} event(s) of these runs were recorded unsealed (encrypt=False)"
    assert warning in out, out

    for run_id in lineage:
        erased = await erased_now(client, run_id)
        assert erased is not None and erased["by"] == "dpo", run_id
        last = (await load_run(client, run_id, open_content=False)).records[-1].event
        assert last.type == "run.erased" and last.payload["plaintext_events"] == unsealed[run_id], last.payload
    await _keys_gone(client, material, Path(nats_server.data_dir))
    blobs = BlobStore(client)
    for ref in refs:
        with pytest.raises(LedgerError):
            await blobs.fetch(ref)
    held = b"".join(data for _, _, data in await _every_message(client)).decode("utf-8", "replace")
    _unreadable(held, "the messages NATS holds (log, keys, object store)")
    ledger_files = Path(nats_server.data_dir) / "jetstream" / "$G" / "streams" / "LEDGER"
    assert _scan_files(ledger_files, "the log's files (references only)") > 0
    for run_id in lineage:
        _unreadable(await _cli(capsys, "show", run_id, "--json", *nats), f"show {run_id} --json")
        opened = await load_run(client, run_id, fetch=True)
        _unreadable(json.dumps([r.event.payload for r in opened.records]), f"the opened log of {run_id}")

    # The projection drops unsealed content of erased runs; a rebuilt file and a new export hold none.
    await _cli(capsys, "project", "--db", str(db), "--quiet", *nats)
    for table in TABLES:
        text = await _cli(capsys, "sql", f"SELECT * FROM {table}", "--db", str(db), "--format", "json", *nats)
        _unreadable(text, f"sql {table}")
    await _cli(capsys, "project", "--db", str(db), "--rebuild", "--quiet", *nats)
    assert _scan_files(db.parent, "the rebuilt DuckDB file", skip=Path(nats_server.data_dir)) > 0
    export = tmp_path / "lake"
    await _cli(capsys, "export", "--parquet", str(export), "--db", str(db), *nats)
    assert _scan_files(export, "the Parquet export") > 0
