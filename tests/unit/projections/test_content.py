"""ContentOpener: what a content session opens inside a projected value, and what it leaves as recorded."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Iterator
from typing import Any

import duckdb
import pytest

from runledger.projections.content import ContentOpener, attach
from runledger.protect.capture import PayloadOpener
from runledger.protect.keystore import MemoryKeyStore, RunKeys


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """The event loop that owns the keys, in a thread of its own (as the CLI's loop is, while the
    query runs on DuckDB's threads)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def sealed(keys: RunKeys, value: Any) -> dict[str, Any]:
    ct = base64.b64encode(keys.seal(json.dumps(value).encode())).decode()
    return {"$enc": "A256GCM", "kid": keys.kid, "ct": ct}


def sealed_text(keys: RunKeys, text: str) -> str:
    return f"«sealed:A256GCM:{keys.kid}:{base64.b64encode(keys.seal(text.encode())).decode()}»"


def test_sealed_values_open_and_everything_else_stays_as_recorded(loop: asyncio.AbstractEventLoop) -> None:
    store = MemoryKeyStore()
    keys = asyncio.run_coroutine_threadsafe(store.create("refunder.r1"), loop).result(5)
    gone = RunKeys.generate("refunder.erased")  # its keys are not in the store
    opener = ContentOpener(PayloadOpener(store), loop)
    token = "«redacted:card_number:0123456789ab»"
    payload = {
        "step": 3,
        "args": sealed(keys, {"amount": 150, "note": f"card {token}"}),
        "output": {"$hash": "ab" * 32, "size": 9},
        "result": {"$erased": True},
        "other": sealed(gone, {"amount": 999}),
        "error": {"type": "ValueError", "message": sealed_text(keys, "no such order")},
    }
    opened = opener.open(payload)
    assert opened["args"] == {"amount": 150, "note": f"card {token}"}  # redaction tokens stay
    assert opened["output"] == payload["output"] and opened["result"] == {"$erased": True}
    assert opened["other"] == payload["other"]  # a key this caller cannot have: sealed, never garbage
    assert opened["error"] == {"type": "ValueError", "message": "no such order"}

    altered = sealed(keys, {"amount": 1})
    altered["ct"] = base64.b64encode(b"\0" * 12 + base64.b64decode(altered["ct"])[12:]).decode()
    assert opener.open(altered) == altered  # fails authentication: left sealed
    plain = '{"amount":40}'
    assert opener.open_json(plain) is plain  # nothing sealed: the same text back


def test_a_session_shadows_the_content_tables_and_the_views_read_them(loop: asyncio.AbstractEventLoop) -> None:
    from runledger.projections.migrations import migrate

    store = MemoryKeyStore()
    keys = asyncio.run_coroutine_threadsafe(store.create("refunder.r1"), loop).result(5)
    con = duckdb.connect()
    migrate(con, "memory")
    con.execute(
        "INSERT INTO steps (run_id, step, kind, name, status, input_hash, output, effect_key) "
        "VALUES ('r1', 0, 'effect', 'refund', 'committed', 'd', ?, 'refund:r1')",
        [json.dumps(sealed(keys, {"refund_id": "rf-1"}))],
    )
    payload = {"step": 0, "name": "refund", "args": sealed(keys, {"amount": 150})}
    con.execute(
        "INSERT INTO events (stream_seq, subject, id, run_id, agent, type, ts_text, step, payload, prev_hash, hash, "
        "size) VALUES (1, 'ledger.run.refunder.r1.a', 'e', 'r1', 'refunder', 'effect.intended', '', 0, ?, '', '', 0)",
        [json.dumps(payload)],
    )
    query = "SELECT args->>'amount', result->>'refund_id' FROM effects WHERE TRY_CAST(args->>'amount' AS INT) > 100"
    assert con.execute(query).fetchall() == []
    attach(con, ContentOpener(PayloadOpener(store), loop))
    assert con.execute(query).fetchall() == [("150", "rf-1")]
    stored = con.execute("SELECT payload FROM memory.main.events").fetchall()[0][0]  # the table itself
    assert json.loads(stored)["args"]["$enc"] == "A256GCM"
