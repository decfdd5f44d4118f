"""Content opened for a caller allowed to read it: the projection's SQL, with sealed values opened.

The projection stores content as recorded (sealed under each run's key, hashed, or by reference:
docs/tables.md), so the file can be copied, shared and erased from without ever holding plaintext.
A caller allowed to read content asks for it per session (``runledger sql --content``, ``runledger
export --parquet DIR --content``, or ``content_session`` in Python): on that one DuckDB connection,

- ``runledger_open(JSON) -> JSON`` and ``runledger_open_text(VARCHAR) -> VARCHAR`` are registered:
  they open every sealed value and blob reference inside a value with the run's key, as
  ``runledger show`` does, through this caller's NATS login and master key;
- each table that holds content (``CONTENT_COLUMNS``) is shadowed by a TEMP view of the same name
  whose content columns pass through them. The views of the file (``effects``, ``approvals``,
  ``failed_runs`` ...) bind to those names, so every documented query reads content opened, with
  no change to its SQL: ``WHERE name = 'refund' AND args->>'amount' > 100`` works as written.

What opening gives is the content as it was recorded: after redaction, so redaction tokens
(``«redacted:<kind>:<hex>»``) stay where secrets were and no secret appears; ``capture="hash-only"``
values stay ``{"$hash", "size"}``, an erased run's content stays ``{"$erased": true}``, and a value
whose key this caller may not read (another agent's run) stays sealed.

Who may: the caller must hold the master key (``runledger.protect.keystore.master_key``: the local
owner has ``<home>/master.key``) and its login must be allowed to read the run keys in LEDGER_KEYS
(without ``--secure`` anyone local is; with it agents for their own runs, operators, workers, and
an analyst only when an operator granted it: ``runledger up --secure --grant-content analyst``,
``runledger.protect.roles``). ``check_grant`` asks both before anything is opened, and a caller
missing either gets ``ContentNotGrantedError`` saying which half and what to do, never a
half-opened result. Without ``--content`` nothing changes: content stays sealed.

Rejected: writing opened content into the projection file, or a second file next to it
(plaintext at rest in an analytics file that gets copied, and an erasure would have to chase every
copy; opened per session, a run erased since reads as erased at once); views over the functions
stored in the file (the file must open in any DuckDB client, runledger.projections.migrations,
and such a view fails in every client that lacks the function); opening in Python after the
query (a ``WHERE`` on an amount must see the amount).

The functions run on DuckDB's threads while the query runs off the event loop
(``asyncio.to_thread``); a run's key is fetched once, on the loop, the first time a value of the
run is opened (``run_coroutine_threadsafe``), so a query touches only the keys of the runs it reads.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from runledger.errors import KeyStoreError, MasterKeyError, PermissionDeniedError
from runledger.log.client import LedgerClient
from runledger.log.permissions import refused_at_once, watch_of
from runledger.log.subjects import KEY_BUCKET
from runledger.projections.errors import ContentNotGrantedError
from runledger.protect.blobs import is_blob_ref
from runledger.protect.capture import PayloadOpener, client_opener, is_sealed, is_sealed_text
from runledger.protect.keystore import RunKeys, key_read_subject, master_key, run_kid, unwrap_keys

T = TypeVar("T")

OPEN_JSON = "runledger_open"
OPEN_TEXT = "runledger_open_text"
# table -> (its JSON columns that hold content, its text columns that hold content)
CONTENT_COLUMNS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "events": (("payload",), ()),
    "runs": (("input", "output"), ("error_message",)),
    "steps": (("output", "error"), ()),
    "checkpoints": (("checkpoint",), ()),
    "effect_keys": (("result", "error"), ()),
}
_KEY_TIMEOUT = 30.0
_PROBE_TIMEOUT = 10.0


class ContentOpener:
    """Opens recorded values for one session: sealed values with their run's key, blob references
    by fetching them, and nothing else. Called from DuckDB's threads; keys and blobs are read on
    ``loop``, the event loop that owns the client (which must not be the calling thread's)."""

    def __init__(self, opener: PayloadOpener, loop: asyncio.AbstractEventLoop) -> None:
        self._opener = opener
        self._loop = loop
        self._keys: dict[str, RunKeys | None] = {}
        self._lock = threading.Lock()

    def _on_loop(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(_KEY_TIMEOUT)

    def key(self, kid: str) -> RunKeys | None:
        """The run's keys, or None when this caller cannot have them (erased, another agent's run)."""
        with self._lock:
            if kid in self._keys:
                return self._keys[kid]
        keys: RunKeys | None = self._on_loop(self._opener.key(kid, strict=False))
        with self._lock:
            self._keys[kid] = keys
        return keys

    def open(self, value: Any) -> Any:
        """``value`` with every sealed value and blob reference inside it opened where possible
        (``value`` itself when nothing in it is)."""
        if is_sealed(value) or is_blob_ref(value):
            return self._open_one(value)
        if isinstance(value, dict):
            opened = {k: self.open(v) for k, v in value.items()}
            return value if all(opened[k] is v for k, v in value.items()) else opened
        if isinstance(value, list):
            items = [self.open(v) for v in value]
            return value if all(a is b for a, b in zip(items, value, strict=True)) else items
        if isinstance(value, str) and is_sealed_text(value):
            return self.open_text(value)
        return value

    def _open_one(self, value: Any) -> Any:
        for _ in range(8):  # a branch may wrap a copied reference in its own seal
            if is_sealed(value):
                keys = self.key(value["kid"])
                if keys is None:
                    return value
                try:
                    value = json.loads(keys.unseal(base64.b64decode(value["ct"])))
                except KeyStoreError:
                    return value  # altered: `runledger verify --deep` names it; never shown as content
            elif is_blob_ref(value):
                return self._on_loop(self._opener.open_value(value, strict=False, fetch=True))
            else:
                return value
        return value

    def open_text(self, text: str) -> str:
        """An error text (``«sealed:A256GCM:<kid>:...»``) opened where possible."""
        if not is_sealed_text(text):
            return text
        kid, _, sealed = text[len("«sealed:A256GCM:") : -1].rpartition(":")
        keys = self.key(kid)
        if keys is None:
            return text
        try:
            return keys.unseal(base64.b64decode(sealed)).decode("utf-8")
        except KeyStoreError:
            return text

    def open_json(self, text: str) -> str:
        """The DuckDB function ``runledger_open``: JSON text in, JSON text out."""
        value = json.loads(text)
        opened = self.open(value)
        return text if opened is value else json.dumps(opened, ensure_ascii=False, separators=(",", ":"))


def attach(con: Any, opener: ContentOpener) -> None:
    """Register the functions on ``con`` and shadow each content table with its opened TEMP view."""
    con.create_function(OPEN_JSON, opener.open_json, ["JSON"], "JSON", side_effects=False)
    con.create_function(OPEN_TEXT, opener.open_text, ["VARCHAR"], "VARCHAR", side_effects=False)
    database = con.execute("SELECT current_database()").fetchall()[0][0]
    for table, (json_columns, text_columns) in CONTENT_COLUMNS.items():
        replaced = [f"{OPEN_JSON}({c}) AS {c}" for c in json_columns]
        replaced += [f"{OPEN_TEXT}({c}) AS {c}" for c in text_columns]
        source = f'"{database.replace(chr(34), chr(34) * 2)}".main.{table}'
        con.execute(f"CREATE OR REPLACE TEMP VIEW {table} AS SELECT * REPLACE ({', '.join(replaced)}) FROM {source}")


def _who(client: LedgerClient) -> tuple[str | None, str | None]:
    found = watch_of(client.nc)
    return (found.role, found.where) if found is not None else (None, None)


async def check_grant(client: LedgerClient, con: Any) -> None:
    """Raise ContentNotGrantedError unless this caller may open content: it holds the master key,
    its login may read run keys, and the master key unwraps them (probed with the keys of a run of
    the projection, when it has one)."""
    from nats.js.errors import KeyNotFoundError

    role, where = _who(client)
    try:
        master = master_key()
    except MasterKeyError as exc:
        raise ContentNotGrantedError("no master key", str(exc), role) from exc
    found = con.execute(
        "SELECT agent, run_id, subject FROM runs WHERE agent IS NOT NULL ORDER BY run_id LIMIT 1"
    ).fetchall()
    if not found:
        return
    agent, run_id, subject = found[0]
    kid = run_kid(agent, run_id, worker=subject.endswith(".w"))
    missing = "the login may not read run keys"
    try:
        kv = await client.js.key_value(KEY_BUCKET)
        entry = await asyncio.wait_for(refused_at_once(client.nc, key_read_subject(kid), kv.get(kid)), _PROBE_TIMEOUT)
    except KeyNotFoundError:
        return  # the login may read the bucket; this run's keys are gone (erased)
    except PermissionDeniedError as exc:
        raise ContentNotGrantedError(missing, f"reading the keys of run {run_id} was refused", role, where) from exc
    except TimeoutError as exc:
        reason = f"reading the keys of run {run_id} got no answer in {_PROBE_TIMEOUT:g}s"
        raise ContentNotGrantedError(missing, reason, role, where) from exc
    if entry.value:
        try:
            await unwrap_keys(kid, entry.value, lambda: master)
        except MasterKeyError as exc:
            raise ContentNotGrantedError("another master key than the ledger's", str(exc), role) from exc
        except KeyStoreError:
            pass  # a damaged record: that run's content stays sealed, `runledger verify --deep` names it


@contextmanager
def _attached(con: Any, opener: ContentOpener) -> Iterator[None]:
    attach(con, opener)
    try:
        yield
    finally:
        for table in CONTENT_COLUMNS:
            con.execute(f"DROP VIEW IF EXISTS temp.main.{table}")
        for name in (OPEN_JSON, OPEN_TEXT):
            con.remove_function(name)


async def content_session(client: LedgerClient, con: Any, work: Callable[[Any], T]) -> T:
    """``work(con)`` with content opened on ``con`` for this caller (``check_grant`` first), run off
    the event loop; the views and functions are gone again when it returns. Raises
    ContentNotGrantedError, or what ``work`` raises."""
    await check_grant(client, con)
    opener = ContentOpener(client_opener(client), asyncio.get_running_loop())
    with _attached(con, opener):
        return await asyncio.to_thread(work, con)
