"""The facts docs/wire.md gives a writer in another language, checked against the code: what a key's msg
id is, the shapes of ``model.called``, what a claim takes from its intent, the holder's format and
when it is dead, the ``effect_class`` of a plain tool in ``tool_schema_hashes``, and the sealing
scheme (worked from the page's own recipe against tests/vectors/sealing.json)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from runledger.log.subjects import effect_msg_id
from runledger.protect.data_policy import DEFAULT_BLOB_THRESHOLD
from runledger.protect.keystore import RECORD_VERSION, LocalMasterKey
from runledger.record.canonical import canonical_json, digest, short_digest
from runledger.record.events import KEY_TYPES, json_schemas
from runledger.sdk.holder import is_gone, this_holder
from runledger.sdk.models import ModelResponse
from runledger.sdk.tools import tool

ROOT = Path(__file__).parents[2]
DOC = ROOT / "docs" / "wire.md"
VECTORS = ROOT / "tests" / "vectors"


def doc() -> str:
    return " ".join(DOC.read_text(encoding="utf-8").split())  # prose wraps anywhere: compare with single spaces


def vectors(name: str) -> Any:
    return json.loads((VECTORS / name).read_text(encoding="utf-8"))


def test_a_keys_msg_id_is_its_own_everywhere_it_is_named() -> None:
    text = doc()
    example = effect_msg_id("refund-agent", "refund:order-8891", 0)
    assert example == "effect:refund-agent:b162a7b324dc9d36feabbeeaa5d36f81:0" and f"`{example}`" in text
    assert "A key's msg id is never `<run_id>:<seq>`" in text and "never stored" in text
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    (line,) = [part for part in readme.split("- **") if part.startswith("Exactly once")]
    assert "`<run_id>:<seq>`" in line and "`effect:<agent>:<digest>:<seq>`" in line
    for type_, schema in json_schemas().items():
        described = schema["description"]
        assert "Nats-Msg-Id <run_id>:<seq>" in described
        assert ("Nats-Msg-Id effect:<agent>:<digest>:<seq>" in described) == (type_ in KEY_TYPES), type_
        assert "never <run_id>:<seq> there" in described or type_ not in KEY_TYPES
    # The types the event table says travel on a key are the types whose description says how.
    on_key = set(re.findall(r"\| `([a-z.]+)` \| \d+ \| [^|]*; key: ", DOC.read_text(encoding="utf-8")))
    assert on_key == KEY_TYPES


def test_the_model_called_example_is_the_vectors_step_and_its_shapes() -> None:
    text = DOC.read_text(encoding="utf-8")
    block = text.split("Example (the vectors' step 0):", 1)[1].split("```json", 1)[1].split("```", 1)[0]
    example = json.loads(block)
    (recorded,) = [json.loads(m["data"]) for m in vectors("runs.json")["messages"] if '"model.called"' in m["data"]]
    assert example == recorded["payload"]
    assert set(example["request"]) == {"messages", "params"}
    assert example["args_digest"] == digest(example["request"], 2)
    flat = doc()
    assert 'exactly `{"messages": MESSAGES, "params": PARAMS}`' in flat
    for field in ("content", "tool_calls", "finish_reason"):
        assert field in ModelResponse.model_fields and f"`{field}`" in flat
    assert {"input_tokens", "output_tokens"} <= set(ModelResponse.model_fields)  # recorded as usage, not response


def test_a_claim_has_its_own_id_ts_seq_and_msg_id_and_the_intents_payload() -> None:
    messages = vectors("runs.json")["messages"]
    intent, claim = (json.loads(m["data"]) for m in messages if '"effect.intended"' in m["data"])
    (claim_message,) = [m for m in messages if m["subject"].startswith("ledger.effect.")][:1]
    assert claim["payload"] == intent["payload"] and claim["run_id"] == intent["run_id"]
    assert claim["id"] != intent["id"] and claim["ts"] != intent["ts"]
    assert claim["seq"] == 0 and claim["prev_hash"] == "0" * 64 and intent["seq"] > 0
    assert claim_message["headers"]["Nats-Msg-Id"] == effect_msg_id(claim["agent"], claim["payload"]["key"], 0)
    text = doc()
    assert "**its own `id` (a new ULID) and its own `ts`**" in text


def test_the_holder_format_and_when_it_is_dead() -> None:
    text = doc()
    assert "`<host>/<pid namespace>/<pid>/<start time>`" in text and "field 22 of `/proc/<pid>/stat`" in text
    me = this_holder()
    host, namespace, pid, start = me.split("/")
    assert host == socket.gethostname() and namespace == os.readlink("/proc/self/ns/pid") and pid == str(os.getpid())
    assert re.fullmatch(r"pid:\[\d+\]", namespace) and start.isdigit() and not is_gone(me)
    # A process that ran here and ended is dead; the same pid with another start time is not the holder.
    child = subprocess.run([sys.executable, "-c", "from runledger.sdk.holder import this_holder; print(this_holder())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert is_gone(child.stdout.strip())
    assert is_gone(f"{host}/{namespace}/{pid}/{int(start) + 1}")
    # Another host, another namespace, no holder, or a name of another shape: not known dead.
    for unknown in (f"elsewhere/{namespace}/999999/1", f"{host}/pid:[1]/999999/1", "", None, "a/b/c", "h/n/x/1"):
        assert not is_gone(unknown), unknown


def test_a_plain_tool_is_read_in_tool_schema_hashes_and_the_example_hash_is_the_codes() -> None:
    schema = {"type": "object", "properties": {"order": {"type": "string"}}}

    @tool("lookup_order", schema=schema)
    def lookup_order(args: Any) -> Any:
        return args

    @tool("refund", effect="irreversible", key=lambda a: "k", schema=schema)
    def refund(args: Any) -> Any:
        return args

    text = doc()
    assert lookup_order.effect_class == "read"
    assert 'A plain tool (one that is not an effect) has `"effect_class": "read"`' in text
    spelled = canonical_json({"effect_class": "read", "name": "lookup_order", "schema": schema}, 1).decode()
    assert f"`{spelled}`" in text and f"`{hashlib.sha256(spelled.encode()).hexdigest()}`" in text
    assert lookup_order.schema_hash == hashlib.sha256(spelled.encode()).hexdigest()
    assert refund.schema_hash == digest({"name": "refund", "effect_class": "irreversible", "schema": schema})


def test_sealing_by_the_pages_recipe_gives_the_vectors() -> None:
    """Every step of "Sealing, exactly" done by hand (AES-GCM, the page's associated data and key id),
    not by runledger's code: the page says enough to seal and to wrap."""
    text = doc()
    data = vectors("sealing.json")
    key = base64.b64decode(data["master_key"])
    by_page = "local:" + hashlib.sha256(b"runledger master key id" + b"\0" + key).hexdigest()[:16]
    assert by_page == data["master_key_id"] == LocalMasterKey(key).key_id
    assert '`"runledger master key id"` || a zero byte || the 32 key bytes' in text
    record = json.loads(data["key_record"])
    assert record == {"alg": "A256GCM", "kid": data["kid"], "mk": by_page, "v": RECORD_VERSION,
                      "wrapped": record["wrapped"]}  # fmt: skip
    assert data["key_record"] == json.dumps(record, sort_keys=True)
    assert '"runledger.run-keys.v2:" || the kid\'s UTF-8 bytes' in text
    wrapped = base64.b64decode(record["wrapped"])
    secret = AESGCM(key).decrypt(wrapped[:12], wrapped[12:], b"runledger.run-keys.v2:" + data["kid"].encode())
    data_key, token_key = secret[:32], secret[32:]
    assert base64.b64encode(data_key).decode() == data["data_key"]
    assert base64.b64encode(token_key).decode() == data["token_key"]
    assert wrapped == bytes.fromhex(data["wrap_nonce"]) + AESGCM(key).encrypt(
        bytes.fromhex(data["wrap_nonce"]), secret, b"runledger.run-keys.v2:" + data["kid"].encode()
    )
    aead = AESGCM(data_key)
    for case in data["values"]:
        plaintext = canonical_json(case["value"], 2)
        assert plaintext.decode() == case["plaintext"]
        nonce = bytes.fromhex(case["nonce"])
        sealed = nonce + aead.encrypt(nonce, plaintext, data["kid"].encode())
        assert case["sealed"] == {"$enc": "A256GCM", "kid": data["kid"], "ct": base64.b64encode(sealed).decode()}
    for case in data["texts"]:
        nonce = bytes.fromhex(case["nonce"])
        sealed = nonce + aead.encrypt(nonce, case["text"].encode(), data["kid"].encode())
        assert case["sealed"] == f"«sealed:A256GCM:{data['kid']}:{base64.b64encode(sealed).decode()}»"
    assert DEFAULT_BLOB_THRESHOLD == 64 * 1024 and "longer than 64 KiB" in text
    assert short_digest("refund:order-8891") in text
