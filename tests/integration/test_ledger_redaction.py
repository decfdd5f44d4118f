"""Redaction before publish, against a real server: planted secrets never reach any stored byte.

The planted-secret test records 1,000 steps whose inputs and outputs carry known
secrets in varied places and then searches every byte the server stored: the
messages of every stream (run events, effect claims, blob chunks) and the files of
the JetStream store directory. The planted-passphrase test does the same for
multi-word passphrases in the shapes a password takes in free text (quoted, to the
end of the line, in a URL query, JSON inside a string, URL-encoded, base64) and under
credential-named keys: no word of any passphrase may be stored.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runledger import AgentSpec, ModelResponse, Run, ScriptedModel, ToolFailedError
from runledger.log.client import LedgerClient
from runledger.log.reader import read_raw
from runledger.log.server import ServerState
from runledger.ops.decisions import approve
from runledger.ops.trace import list_runs
from runledger.protect.capture import DataPolicy, client_opener
from runledger.protect.loading import load_run
from runledger.protect.redaction import SecretResolver
from runledger.sdk.lifecycle import resume_run, start_run

pytestmark = pytest.mark.integration

# (what is planted, the secret part that must never be stored)
PLANTED = [
    ("sk-proj-Q9x8W7v6U5t4S3r2Q1p0OnMlKjIhGfEd", "sk-proj-Q9x8W7v6U5t4S3r2Q1p0OnMlKjIhGfEd"),
    ("sk-ant-api03-ZyXwVuTsRqPoNmLkJiHgFeDcBa9876543210-AAA", "sk-ant-api03-ZyXwVuTsRqPoNmLkJiHgFeDcBa9876543210-AAA"),
    ("AKIAZ7Y6X5W4V3U2T1S0", "AKIAZ7Y6X5W4V3U2T1S0"),
    ("aws_secret_access_key=Zx9Yw8Xv7Wu6Vt5Us4Tr3Sq2Rp1Qo0PnMmLlKkJj", "Zx9Yw8Xv7Wu6Vt5Us4Tr3Sq2Rp1Qo0PnMmLlKkJj"),
    ("ghp_Pl4ntedGitHubT0kenAbCdEfGhIjKlMnOpQrSt", "ghp_Pl4ntedGitHubT0kenAbCdEfGhIjKlMnOpQrSt"),
    ("xoxb-998877665544-112233445566-PlantedSlackTok", "xoxb-998877665544-112233445566-PlantedSlackTok"),
    ("AIzaSyPlantedGoogleKey_0123456789abcdefgh", "AIzaSyPlantedGoogleKey_0123456789abcdefgh"),
    ("Bearer pl4nted.bearer-T0KEN_value", "pl4nted.bearer-T0KEN_value"),
    ("https://svc:PlantedUrlPassw0rd@api.internal/v1", "PlantedUrlPassw0rd"),
    ("card 4539 1488 0343 6467", "4539 1488 0343 6467"),
    ("card 4539148803436467", "4539148803436467"),
    (
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJwbGFudGVkLXVzZXIifQ.UGxhbnRlZFNpZ25hdHVyZVZhbHVlMTIz",
        "UGxhbnRlZFNpZ25hdHVyZVZhbHVlMTIz",
    ),
    (
        "-----BEGIN PRIVATE KEY-----\nMIIPlantedPrivateKeyBodyLine0123456789abcdef\n-----END PRIVATE KEY-----",
        "MIIPlantedPrivateKeyBodyLine0123456789abcdef",
    ),
    ("password=PlantedPassw0rd!", "PlantedPassw0rd"),
]
RESOLVED = "resolved-by-reference-9f8e7d6c5b4a"  # what secret://PAYMENTS_KEY resolves to
NEEDLES = [secret for _, secret in PLANTED] + [RESOLVED]


def _forms(secret: str) -> list[bytes]:
    """The byte forms a secret could take in stored JSON."""
    return sorted({secret.encode(), json.dumps(secret)[1:-1].encode(), json.dumps(secret, ensure_ascii=False).encode()})


def _assert_clean(blob: bytes, where: str) -> None:
    for secret in NEEDLES:
        for form in _forms(secret):
            assert form not in blob, f"{secret!r} found in {where}"


def planted_agent(steps: int) -> Any:
    async def agent(run: Run) -> Any:
        for i in range(steps):
            planted, _ = PLANTED[i % len(PLANTED)]
            note = f"note-{i}"
            place = i % 7
            if place == 0:  # headers of a tool call
                headers = {"X-Trace": note, "X-Upstream-Auth": planted}
                await run.tool("http", {"headers": headers, "url": "/x"}, fn=_echo)
            elif place == 1:  # nested JSON in a tool's output
                await run.tool("lookup", {"id": note}, fn=lambda a, p=planted: {"a": {"b": [{"c": p, "id": a["id"]}]}})
            elif place == 2:  # free text in a model message (the scripted reply echoes it)
                await run.model([{"role": "user", "content": f"{note}: please use {planted} for this"}])
            elif place == 3:  # tool arguments
                await run.tool("deploy", {"note": note, "config": f"{planted}\nregion=eu"}, fn=lambda a: "ok")
            elif place == 4:  # a tool that fails with the secret in its message
                with contextlib.suppress(ToolFailedError):
                    await run.tool("flaky", {"note": note}, fn=lambda a, p=planted: _raise(f"{a['note']} failed: {p}"))
            elif place == 5:  # a credential by reference, echoed back by the tool
                await run.tool("pay", {"note": note, "key": "secret://PAYMENTS_KEY"}, fn=_echo)
            else:  # an effect whose arguments and result carry it
                await run.effect("notify", {"note": note, "body": planted}, key=f"notify:{run.run_id}:{i}", fn=_echo)
        big = "\n".join(f"line {n} {PLANTED[n % len(PLANTED)][0]} note-big-{n}" for n in range(3000))
        await run.tool("read_document", {"doc": "big"}, fn=lambda a: big)  # > 64 KiB: goes to the object store
        raise RuntimeError(f"agent crashed holding {PLANTED[0][0]} and {PLANTED[9][0]}")

    return agent


def _echo(args: Any) -> Any:
    return {"echo": args}


def _raise(message: str) -> Any:
    raise ValueError(message)


def _model() -> ScriptedModel:
    def reply(messages: list[dict[str, Any]]) -> ModelResponse:
        return ModelResponse(content=f"I will use it: {messages[-1]['content']}", input_tokens=5, output_tokens=5)

    return ScriptedModel(reply, name="echo-model")


async def _all_stored_messages(client: LedgerClient) -> bytes:
    """Every message of every stream on the server (LEDGER, LEDGER_CMD, blobs, keys)."""
    out: list[bytes] = []
    for raw in await read_raw(client, "ledger.>"):
        out.append(raw.data)
    names = [s.config.name for s in await client.js.streams_info()]
    for stream in names:
        if stream in ("LEDGER", "KV_LEDGER_KEYS"):
            continue
        info = await client.js.stream_info(stream)
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            try:
                msg = await client.js.get_msg(stream, seq)
            except Exception:  # deleted sequence (object store rollups)
                continue
            out.append(msg.data or b"")
    return b"\n".join(out)


@pytest.mark.parametrize("encrypt", [True, False], ids=["sealed", "redaction-only"])
async def test_planted_secrets_reach_no_stored_byte(
    client: LedgerClient, nats_server: ServerState, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, encrypt: bool
) -> None:
    monkeypatch.setenv("RUNLEDGER_SECRET_PAYMENTS_KEY", RESOLVED)
    steps = 1000
    spec = AgentSpec(
        "planted", planted_agent(steps), _model(), agent_version="v1", data_policy=DataPolicy(encrypt=encrypt)
    )
    started = time.perf_counter()
    result = await start_run(client, spec, {"customer": "ann", "api_key": PLANTED[0][0]}, run_id=f"planted{encrypt}")
    elapsed = time.perf_counter() - started
    assert result.status == "failed" and "agent crashed" in (result.error or "")
    print(f"\n{steps} planted steps recorded in {elapsed:.2f}s ({elapsed / steps * 1000:.2f} ms/step)")

    stored = await _all_stored_messages(client)
    _assert_clean(stored, "the stored messages")
    # And the bytes on disk: every file of the JetStream store directory.
    for path in Path(nats_server.data_dir).rglob("*"):
        if path.is_file():
            _assert_clean(path.read_bytes(), str(path))

    # What a reader with the run's key sees: opened content, blobs fetched, still no secret.
    log = await load_run(client, result.run_id, fetch=True)
    opened = json.dumps([r.event.payload for r in log.records], ensure_ascii=False)
    _assert_clean(opened.encode(), "the opened content")
    for i in range(steps):
        assert f"note-{i}" in opened, f"non-secret content of step {i} lost"
    assert "note-big-2999" in opened and '"customer": "ann"' in opened
    if not encrypt:
        assert b"note-999" in stored and b"note-big-1" in stored  # redaction alone keeps content readable
    # `runledger runs` shows the (redacted) error of the failed run, opened with its key.
    [summary] = [r for r in await list_runs(client) if r.run_id == result.run_id]
    assert (summary.error or "").startswith("agent crashed holding «redacted:openai_key:")
    # The DuckDB projection and its Parquet export (what analysts read).
    dump = await _projection_dump(client, tmp_path)
    _assert_clean(dump.encode(), "the DuckDB projection and its Parquet export")
    if not encrypt:
        missing = [i for i in range(steps) if f"note-{i}" not in dump]
        assert not missing, (missing[:20], len(missing))  # non-secret content intact there too
    # The same secret gives the same token everywhere in the run (analysts can join on it).
    tokens = {t for t in _tokens(opened) if ":card_number:" in t}
    assert len(tokens) == 2  # the spaced and the unspaced form of the card are different strings


async def _projection_dump(client: LedgerClient, tmp_path: Path) -> str:
    """Every value of every table of a fresh projection and of its Parquet export, as text, plus the raw file bytes."""
    import duckdb

    from runledger.projections import export_parquet, project

    db = tmp_path / "ledger.duckdb"
    await project(client, db)
    con = duckdb.connect(str(db))
    try:
        export_parquet(con, tmp_path / "parquet")
        tables = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
        parts = [repr(con.execute(f'SELECT * FROM "{t}"').fetchall()) for t in tables]
        for directory in sorted(p for p in (tmp_path / "parquet").iterdir() if p.is_dir()):
            files = sorted(directory.rglob("*.parquet"))
            if files:
                listed = ", ".join(f"'{f}'" for f in files)
                query = f"SELECT * FROM read_parquet([{listed}], union_by_name=true)"
                parts.append(repr(con.execute(query).fetchall()))
    finally:
        con.close()
    raw = [db.read_bytes(), *(f.read_bytes() for f in (tmp_path / "parquet").rglob("*") if f.is_file())]
    return "\n".join(parts) + b"\n".join(raw).decode("utf-8", "replace")


def _tokens(text: str) -> list[str]:
    return re.findall(r"«redacted:[^»]+»", text)


async def test_the_agent_sees_real_values_live_and_recorded_ones_on_resume(client: LedgerClient) -> None:
    seen: list[Any] = []
    secret = PLANTED[0][0]

    async def agent(run: Run) -> Any:
        out = await run.tool("read_config", {"path": "/etc/app", "token_hint": secret}, fn=lambda a: {"key": secret})
        seen.append((run.replaying, out, run.input))
        await run.approval("use it", {"n": 1})
        return "done"

    spec = AgentSpec("resumer", agent, ScriptedModel([]), agent_version="v1")
    first = await start_run(client, spec, {"token": secret, "q": "x"}, run_id="redact-resume")
    assert first.status == "suspended"
    await approve(client, "redact-resume", first.pending[0], by="op")
    second = await resume_run(client, spec, "redact-resume")  # args digest over the real args: no mismatch
    assert second.status == "completed"
    (live_replaying, live_out, live_input), (replay_replaying, replay_out, replay_input) = seen
    assert not live_replaying and live_out == {"key": secret} and live_input == {"token": secret, "q": "x"}
    assert replay_replaying and replay_out["key"].startswith("«redacted:openai_key:")
    assert replay_input["token"].startswith("«redacted:field:token:") and replay_input["q"] == "x"


async def test_secret_references_reach_only_the_tool(client: LedgerClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNLEDGER_SECRET_DB", "db-password-value-123")
    got: list[Any] = []

    async def agent(run: Run) -> Any:
        return await run.tool("query", {"dsn": "pg://app:secret://DB@db/x"}, fn=lambda a: got.append(a) or a["dsn"])

    spec = AgentSpec("refs", agent, ScriptedModel([]), agent_version="v1")
    result = await start_run(client, spec, None, run_id="refs1")
    assert got == [{"dsn": "pg://app:db-password-value-123@db/x"}]
    assert result.output == "pg://app:db-password-value-123@db/x"  # the live agent gets what the tool returned
    log = await load_run(client, "refs1")
    recorded = json.dumps([r.event.payload for r in log.records], ensure_ascii=False)
    assert "db-password-value-123" not in recorded
    assert "pg://app:secret://DB@db/x" in recorded  # the reference is recorded, not the secret
    assert "«redacted:" in recorded


async def test_capture_policy_is_recorded_and_hash_only_keeps_structure(client: LedgerClient) -> None:
    async def agent(run: Run) -> Any:
        return await run.tool("t", {"x": 1}, fn=lambda a: "private answer")

    for capture in ("full", "redacted", "hash-only"):
        spec = AgentSpec("cap", agent, ScriptedModel([]), agent_version="v1", data_policy=DataPolicy(capture=capture))
        await start_run(client, spec, "in", run_id=f"cap-{capture}")
        log = await load_run(client, f"cap-{capture}")
        assert log.records[0].event.payload["capture"] == capture
        tool = next(r.event.payload for r in log.records if r.event.type == "tool.called")
        assert tool["name"] == "t" and len(tool["args_digest"]) == 64
        if capture == "hash-only":
            assert set(tool["output"]) == {"$hash", "size"}
        else:
            assert tool["output"] == "private answer"


async def test_a_secret_resolver_given_in_code(client: LedgerClient) -> None:
    from runledger.protect.capture import run_protector

    protector = await run_protector(client, "a", "res1", DataPolicy(), resolver=SecretResolver({"K": "v-123456"}))
    assert protector.resolve_secrets({"k": "secret://K"}) == {"k": "v-123456"}
    assert "v-123456" not in json.dumps(await protector.protect_value("output", "echo v-123456"))
    opener = client_opener(client)
    opened = await opener.open_value(await protector.protect_value("output", "echo v-123456"))
    assert opened.startswith("echo «redacted:secret:k:")


# -- multi-word passphrases ----------------------------------------------------------------------------------

PASSPHRASES = {
    "words": "quixotic zebrafish marzipan lantern",
    "symbols": "Vortex#9 plinth&quasar !jubilee",
    "mixed": "nebula-otter 44 tamarind;aubergine",  # (after `; ` the next words are a list's next item)
}


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# The shapes a password takes in free text; each is planted in a tool's output, a model message and an
# effect's arguments.
SHAPES: list[tuple[str, Callable[[str], str]]] = [
    ("yaml", lambda p: f"password: {p}"),
    ("env line", lambda p: f"DB_PASSWORD={p}\nDB_HOST=db.internal"),
    ("json", lambda p: json.dumps({"user": "ann", "password": p})),
    ("shell", lambda p: f"export PASSPHRASE='{p}'"),
    ("pwd", lambda p: f"mysql --user=ann pwd={p}"),
    ("json in a string", lambda p: json.dumps(json.dumps({"client_secret": p}))),
    ("query", lambda p: f"https://x/login?user=ann&password={urllib.parse.quote_plus(p)}&next=/home"),
    ("url-encoded", lambda p: "body=" + urllib.parse.quote(f"password={p}", safe="")),
    ("base64", lambda p: "data: " + _b64(f"password: {p}")),
]


def _passphrase_needles() -> list[str]:
    """Every word of every passphrase (and each run of 4+ letters and digits in one), as stored text
    could hold it (plain, URL-encoded); and the planted base64 wrappers themselves."""
    needles: set[str] = set()
    for p in PASSPHRASES.values():
        for word in {*p.split(), *re.findall(r"[A-Za-z0-9]{4,}", p)}:
            if len(word) >= 4:
                needles |= {word, urllib.parse.quote(word, safe=""), urllib.parse.quote_plus(word)}
        needles.add(_b64(f"password: {p}"))
    return sorted(needles)


def _assert_no_passphrase(blob: bytes, where: str) -> None:
    for needle in _passphrase_needles():
        for form in _forms(needle):
            assert form not in blob, f"{needle!r} found in {where}"


def passphrase_agent() -> Any:
    async def agent(run: Run) -> Any:
        for i, (_, make) in enumerate(SHAPES):
            for name, p in PASSPHRASES.items():
                planted = make(p)
                tag = f"shape-{i}-{name}"
                await run.tool(
                    "read_config", {"tag": tag}, fn=lambda a, t=planted: {"config": {"text": t}, "tag": a["tag"]}
                )
                await run.model([{"role": "user", "content": f"{tag}: connect with {planted}"}])
                await run.effect("notify", {"tag": tag, "body": planted}, key=f"notify:{run.run_id}:{tag}", fn=_echo)
        # Credential-named keys: matched by pattern, whatever the case and separators.
        creds = {
            "db_password": PASSPHRASES["words"],
            "DB_PWD": PASSPHRASES["symbols"],
            "X-Auth-Token": PASSPHRASES["mixed"],
        }
        await run.tool(
            "connect", {"tag": "keys", **creds}, fn=lambda a: {"session_token": PASSPHRASES["words"], "ok": 1}
        )
        return "done"

    return agent


@pytest.mark.parametrize("encrypt", [True, False], ids=["sealed", "redaction-only"])
async def test_planted_passphrases_reach_no_stored_byte(
    client: LedgerClient, nats_server: ServerState, tmp_path: Path, encrypt: bool
) -> None:
    spec = AgentSpec(
        "passphrases", passphrase_agent(), _model(), agent_version="v1", data_policy=DataPolicy(encrypt=encrypt)
    )
    result = await start_run(client, spec, {"note": "planted passphrases"}, run_id=f"passphrases{encrypt}")
    assert result.status == "completed", result.error

    stored = await _all_stored_messages(client)
    _assert_no_passphrase(stored, "the stored messages")
    for path in Path(nats_server.data_dir).rglob("*"):
        if path.is_file():
            _assert_no_passphrase(path.read_bytes(), str(path))
    # What a reader with the run's key sees.
    log = await load_run(client, result.run_id, fetch=True)
    opened = json.dumps([r.event.payload for r in log.records], ensure_ascii=False)
    _assert_no_passphrase(opened.encode(), "the opened content")
    # The rest of the content is kept: every step's tag, and the text around the secrets.
    for i in range(len(SHAPES)):
        for name in PASSPHRASES:
            assert f"shape-{i}-{name}" in opened
    assert "«redacted:credential:" in opened and "«redacted:base64:credential:" in opened
    assert "«redacted:urlencoded:credential:" in opened and "«redacted:field:dbpassword:" in opened
    assert "DB_HOST=db.internal" in opened and "&next=/home" in opened
    if not encrypt:
        assert b"shape-8-mixed" in stored  # redaction alone keeps the rest readable in the stream
    dump = await _projection_dump(client, tmp_path)
    _assert_no_passphrase(dump.encode(), "the DuckDB projection and its Parquet export")
