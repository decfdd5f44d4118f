"""The wire-format test vectors (tests/vectors, docs/wire.md "Test vectors") against the Python implementation."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import struct
from pathlib import Path
from typing import Any

from runledger.log.subjects import (
    FENCE_HEADER,
    FENCE_SUBJECT_HEADER,
    effect_msg_id,
    fence_filter,
    fence_for,
    parse_effect_subject,
    parse_run_subject,
    run_msg_id,
)
from runledger.protect.capture import DataPolicy, PayloadOpener, PayloadProtector
from runledger.protect.keystore import LocalMasterKey, MemoryKeyStore, RunKeys, run_kid, unwrap_keys
from runledger.record.canonical import CONTENT_FORMAT, canonical_json, digest, short_digest
from runledger.record.digests import Digester
from runledger.record.events import GENESIS, decode
from runledger.record.fold import fold
from runledger.record.records import Recorded
from runledger.sdk.effects import fold_key

VECTORS = Path(__file__).parents[1] / "vectors"


def load(name: str) -> Any:
    return json.loads((VECTORS / name).read_text(encoding="utf-8"))


def test_canonical_vectors() -> None:
    data = load("canonical.json")
    for case in data["cases"]:
        if "ieee754" in case:
            value = struct.unpack(">d", bytes.fromhex(case["ieee754"]))[0]
        else:
            value = json.loads(case["input"])
        canonical = canonical_json(value, 2)
        assert canonical.decode("utf-8") == case["canonical"], case["name"]
        assert hashlib.sha256(canonical).hexdigest() == case["sha256"], case["name"]
        assert canonical_json(value, 1).decode("utf-8") == case.get("legacy", case["canonical"]), case["name"]
    for key in data["keys"]:
        assert short_digest(key["key"]) == key["subject_token"]


def test_run_vectors_verify_and_fold() -> None:
    data = load("runs.json")
    chains: dict[str, tuple[int, str]] = {}
    last_of: dict[str, int] = {}
    by_run: dict[str, list[Recorded]] = {}
    by_key: dict[str, list[Recorded]] = {}
    for message in data["messages"]:
        raw = message["data"].encode("utf-8")
        event = decode(raw)
        assert canonical_json(json.loads(raw), data["chain_format"]) == raw  # the bytes are canonical
        assert event.hash == message["hash"]
        subject, headers = message["subject"], message["headers"]
        fence = fence_filter(subject)
        # A run's first message claims its id (every agent's subjects of it); the rest are fenced on the run.
        assert fence is not None and headers[FENCE_SUBJECT_HEADER] == fence_for(subject, last_of.get(fence, 0))
        assert headers[FENCE_HEADER] == str(last_of.get(fence, 0))
        last_of[fence] = message["stream_seq"]
        seq, prev = chains.get(fence, (0, GENESIS))
        assert (event.seq, event.prev_hash) == (seq, prev)
        chains[fence] = (seq + 1, event.hash)
        record = Recorded(event, message["stream_seq"])
        if parse_run_subject(subject):
            assert parse_run_subject(subject) == (event.agent, event.run_id)
            assert headers["Nats-Msg-Id"] == run_msg_id(event.run_id, event.seq)
            by_run.setdefault(event.run_id, []).append(record)
        else:
            parsed = parse_effect_subject(subject)
            assert parsed is not None and parsed[1] == short_digest(event.payload["key"])
            assert headers["Nats-Msg-Id"] == effect_msg_id(event.agent, event.payload["key"], event.seq)
            by_key.setdefault(subject.rpartition(".")[0], []).append(record)
        if "args_digest" in event.payload and "args" in event.payload:
            assert event.payload["args_digest"] == digest(event.payload["args"], data["chain_format"])
    run_a, run_b = (fold(by_run[data["runs"][name]]) for name in ("A", "B"))
    assert run_a.status == run_b.status == "completed"
    assert run_a.chain_format == data["chain_format"] and data["key"] in run_a.committed_keys
    (key_records,) = by_key.values()
    assert fold_key(data["key"], key_records).status == "committed"


def test_sealing_vectors_open_with_runledgers_keys() -> None:
    data = load("sealing.json")
    master = LocalMasterKey.from_text(data["master_key"], "the vectors")
    assert master.key_id == data["master_key_id"] and data["kid"] == run_kid("refund-agent", data["kid"].split(".")[1])
    record = data["key_record"].encode()
    assert base64.b64decode(json.loads(record)["wrapped"])[:12].hex() == data["wrap_nonce"]
    keys = asyncio.run(unwrap_keys(data["kid"], record, lambda: master))
    assert base64.b64encode(keys.data_key).decode() == data["data_key"]
    assert base64.b64encode(keys.token_key).decode() == data["token_key"]
    store = MemoryKeyStore()
    store.keys[keys.kid] = keys
    opener = PayloadOpener(store)
    for case in data["values"]:
        sealed = base64.b64decode(case["sealed"]["ct"])
        assert sealed[:12].hex() == case["nonce"] and case["sealed"]["kid"] == data["kid"]
        assert keys.unseal(sealed) == case["plaintext"].encode("utf-8") == canonical_json(case["value"], 2)
        assert asyncio.run(opener.open_value(case["sealed"])) == case["value"]
    for case in data["texts"]:
        assert asyncio.run(opener.open_text(case["sealed"])) == case["text"]


def test_digest_vectors_are_runledgers_digests_under_the_sealing_keys() -> None:
    """Keyed digests (scheme 2): the digest key is HKDF-SHA256-Expand of the data key (checked against
    cryptography's HKDFExpand, an implementation the docs name), and each digest is the HMAC of the
    value's canonical JSON under it; hash-only content is digested alike."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand

    data = load("digests.json")
    sealing = load("sealing.json")
    assert data["data_key"] == sealing["data_key"] and data["kid"] == sealing["kid"]
    keys = RunKeys(data["kid"], base64.b64decode(data["data_key"]), base64.b64decode(sealing["token_key"]))
    expanded = HKDFExpand(hashes.SHA256(), 32, data["digest_key_info"].encode()).derive(keys.data_key)
    assert base64.b64encode(keys.digest_key).decode() == data["digest_key"] == base64.b64encode(expanded).decode()
    keyed = Digester(data["chain_format"], data["digest_scheme"], keys.digest_key)
    for case in data["cases"]:
        raw = canonical_json(case["value"], 2)
        assert raw.decode() == case["canonical"]
        assert digest(case["value"], 2) == case["plain"] == hashlib.sha256(raw).hexdigest()
        assert keyed.digest(case["value"]) == case["keyed"] != case["plain"]
    protector = PayloadProtector(DataPolicy(capture="hash-only", encrypt=False), keys)
    protector.hashes = keyed
    token = CONTENT_FORMAT.set(2)
    try:
        assert asyncio.run(protector.protect_value("args", data["hash_only"]["value"])) == data["hash_only"]["recorded"]
    finally:
        CONTENT_FORMAT.reset(token)
    assert protector.protect_text(data["hash_only"]["text"]) == data["hash_only"]["recorded_text"]


def test_the_generator_still_writes_these_files() -> None:
    from tests.vectors.generate import canonical_vectors, digest_vectors, render, run_vectors, sealing_vectors

    assert render(digest_vectors()) == (VECTORS / "digests.json").read_text(encoding="utf-8")

    assert render(canonical_vectors()) == (VECTORS / "canonical.json").read_text(encoding="utf-8")
    assert render(run_vectors()) == (VECTORS / "runs.json").read_text(encoding="utf-8")
    assert render(sealing_vectors()) == (VECTORS / "sealing.json").read_text(encoding="utf-8")
