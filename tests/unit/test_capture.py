"""Content protection without a server: capture modes, sealing, opening, erasure by key deletion."""

from __future__ import annotations

import json

import pytest

from runledger.errors import KeyStoreError, PayloadUnavailableError
from runledger.protect.capture import (
    DataPolicy,
    PayloadOpener,
    PayloadProtector,
    is_placeholder,
    is_sealed,
)
from runledger.protect.keystore import MemoryKeyStore
from runledger.record.events import ErrorInfo, RunFailed, ToolCalled, decode
from tests.unit.helpers import Chain

SECRET = "sk-proj-Abcdefghij0123456789KLMNOPqrstuv"


def _tool(output: object) -> ToolCalled:
    return ToolCalled(step=0, name="fetch", args={"q": f"key {SECRET}"}, args_digest="d" * 64, output=output)


async def test_redacted_and_sealed_content_opens_to_the_redacted_value() -> None:
    store = MemoryKeyStore()
    keys = await store.create("a.R1")
    protector = PayloadProtector(DataPolicy(), keys)
    body = await protector.protect(_tool({"text": "plain", "auth": SECRET}))
    assert isinstance(body, ToolCalled)
    assert is_sealed(body.args) and is_sealed(body.output)
    assert body.name == "fetch" and body.args_digest == "d" * 64  # structure stays readable
    raw = Chain("R1").add(body)
    assert SECRET not in raw.to_bytes().decode()
    opener = PayloadOpener(store)
    opened = await opener.open_event(raw)
    assert opened.payload["output"]["text"] == "plain"
    assert opened.payload["output"]["auth"].startswith("«redacted:field:auth")
    assert opened.payload["args"]["q"].startswith("key «redacted:openai_key:")
    assert opened.hash == raw.hash


async def test_full_capture_without_sealing_records_content_as_is() -> None:
    protector = PayloadProtector(DataPolicy(capture="full", encrypt=False), None)
    body = await protector.protect(_tool({"text": "plain"}))
    assert body == _tool({"text": "plain"})


async def test_hash_only_records_no_content_and_cannot_be_replayed() -> None:
    store = MemoryKeyStore()
    protector = PayloadProtector(DataPolicy(capture="hash-only"), await store.create("a.R1"))
    body = await protector.protect(_tool("a long output"))
    assert isinstance(body, ToolCalled)
    assert set(body.output) == {"$hash", "size"} and "output" not in json.dumps(body.output)
    with pytest.raises(PayloadUnavailableError, match="hash-only"):
        await PayloadOpener(store).open_value(body.output)


async def test_errors_are_redacted_and_sealed_as_text() -> None:
    store = MemoryKeyStore()
    protector = PayloadProtector(DataPolicy(), await store.create("a.R1"))
    failed = RunFailed(
        reason="exception",
        error=ErrorInfo(type="ValueError", message=f"bad key {SECRET}", traceback="x" * 100_000 + "\n" + SECRET),
    )
    body = await protector.protect(failed)
    assert isinstance(body, RunFailed)
    assert body.error.type == "ValueError" and body.error.message.startswith("«sealed:A256GCM:a.R1:")
    event = decode(Chain("R1").add(body).model_dump_json().encode())  # still a valid event
    opened = await PayloadOpener(store).open_event(event)
    assert opened.payload["error"]["message"].startswith("bad key «redacted:openai_key:")
    assert len(opened.payload["error"]["traceback"]) <= 16 * 1024 + 100
    assert SECRET not in opened.payload["error"]["traceback"]


async def test_destroying_the_key_makes_content_unreadable_but_keeps_the_event() -> None:
    store = MemoryKeyStore()
    protector = PayloadProtector(DataPolicy(), await store.create("a.R1"))
    event = Chain("R1").add(await protector.protect(_tool({"text": "personal data"})))
    assert await store.destroy("a.R1")
    opened = await PayloadOpener(store).open_event(event)
    assert is_placeholder(opened.payload["output"])  # lenient readers keep the sealed form
    with pytest.raises(PayloadUnavailableError, match="erased"):
        await PayloadOpener(store).open_value(event.payload["output"])
    with pytest.raises(KeyStoreError, match="erased"):
        await store.create("a.R1")


async def test_a_sealed_value_moved_to_another_run_does_not_open() -> None:
    store = MemoryKeyStore()
    a = PayloadProtector(DataPolicy(), await store.create("a.R1"))
    await store.create("a.R2")
    sealed = await a.protect_value("output", "text")
    moved = dict(sealed, kid="a.R2")
    with pytest.raises(KeyStoreError, match="fails authentication"):
        await PayloadOpener(store).open_value(moved)


async def test_content_a_step_encoded_is_sealed_from_its_bytes_only_when_redaction_leaves_it() -> None:
    """``protect(body, encoded)``: a content field that redaction leaves as it is is sealed from the
    bytes the step encoded; one that redaction changes is encoded again (its secret never sealed)."""
    from runledger.record.canonical import canonical_json

    store = MemoryKeyStore()
    keys = await store.create("a.R2")
    protector = PayloadProtector(DataPolicy(), keys)
    args, output = {"q": "where is my parcel"}, {"text": f"key {SECRET}"}
    body = ToolCalled(step=0, name="fetch", args=args, args_digest="d" * 64, output=output)
    # Bytes that are not the value's: sealed as given for the unredacted field, ignored for the other.
    marked = b'{"q":"where is my parcel","marked":1}'
    sealed = await protector.protect(body, {"args": marked, "output": canonical_json(output)})
    assert isinstance(sealed, ToolCalled)
    opener = PayloadOpener(store)
    assert await opener.open_value(sealed.args) == json.loads(marked)
    opened_output = await opener.open_value(sealed.output)
    assert SECRET not in json.dumps(opened_output) and opened_output["text"].startswith("key «redacted:")
    # Without bytes, the same content as before.
    again = await protector.protect(body)
    assert isinstance(again, ToolCalled)
    assert await opener.open_value(again.args) == args


def test_every_content_field_takes_any_json_value() -> None:
    """What ``protect`` relies on to return a copy with markers in place of content, unvalidated: a
    content field is ``Any`` or a ``dict`` (a marker is a dict), an error's texts are strings."""
    from typing import Any

    from runledger.protect.capture import CONTENT_FIELDS, ERROR_TYPES
    from runledger.record.events import PAYLOADS

    for event_type, names in CONTENT_FIELDS.items():
        for name in names:
            annotation = PAYLOADS[event_type].model_fields[name].annotation
            assert annotation in (Any, dict[str, Any], dict[str, Any] | None), (event_type, name, annotation)
    for event_type in ERROR_TYPES:
        assert PAYLOADS[event_type].model_fields["error"].annotation in (ErrorInfo, ErrorInfo | None)
