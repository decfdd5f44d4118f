"""Writes the wire-format test vectors of this folder (docs/wire.md, "Test vectors").

    .venv/bin/python tests/vectors/generate.py     # rewrites canonical.json, runs.json, sealing.json, digests.json

``tests/unit/test_canonical_vectors.py`` checks the Python implementation against the files and
that this script still produces them byte for byte; other implementations replay the files.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import json
import struct
import sys
from pathlib import Path
from typing import Any
from unittest import mock

from runledger.log.subjects import (
    AGENT_WRITER,
    FENCE_HEADER,
    FENCE_SUBJECT_HEADER,
    OPERATOR_WRITER,
    effect_msg_id,
    effect_subject,
    fence_filter,
    fence_for,
    run_msg_id,
    run_subject,
)
from runledger.protect import keystore
from runledger.protect.capture import DataPolicy, PayloadProtector
from runledger.protect.keystore import DIGEST_KEY_INFO, LocalMasterKey, RunKeys, run_kid, wrap_keys
from runledger.record import events as events_module
from runledger.record.canonical import CONTENT_FORMAT, JCS_CHAIN_FORMAT, canonical_json, digest, short_digest
from runledger.record.digests import KEYED_DIGESTS, Digester
from runledger.record.events import (
    GENESIS,
    ApprovalRequested,
    ApprovalResolved,
    EffectCommitted,
    EffectIntended,
    ModelCalled,
    Payload,
    RunCompleted,
    RunResumed,
    RunStarted,
    RunSuspended,
    ToolCalled,
    Usage,
    VersionTuple,
    make_event,
)

HERE = Path(__file__).parent

# -- canonical JSON --------------------------------------------------------------------------------------

# RFC 8785, Appendix B: IEEE 754 doubles (hex) and the string JCS writes for each.
RFC_NUMBERS = [
    ("0000000000000000", "0"),
    ("8000000000000000", "0"),
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]

# JSON texts (as a reader receives them) and their canonical forms. The first six are the
# RFC's reference data (github.com/cyberphone/json-canonicalization, testdata/input and output).
TEXTS = [
    ("rfc arrays", '[56, {"d": true, "10": null, "1": [ ]}]'),
    (
        "rfc french",
        '{"peach": "This sorting order", "p\\u00e9ch\\u00e9": "is wrong according to French", '
        '"p\\u00eache": "but canonicalization MUST", "sin": "ignore locale"}',
    ),
    (
        "rfc structures",
        '{"1": {"f": {"f": "hi","F": 5} ,"\\n": 56.0}, "10": { }, "": "empty", "a": { }, '
        '"111": [ {"e": "yes","E": "no" } ], "A": { }}',
    ),
    ("rfc unicode", '{"Unnormalized Unicode":"A\\u030a"}'),
    (
        "rfc values",
        '{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001], '
        '"string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/", "literals": [null, true, false]}',
    ),
    (
        "rfc weird",
        '{"\\u20ac": "Euro Sign", "\\r": "Carriage Return", "\\u000a": "Newline", "1": "One", '
        '"\\u0080": "Control\\u007f", "\\ud83d\\ude02": "Smiley", "\\u00f6": "Latin Small Letter O With '
        'Diaeresis", "\\ufb33": "Hebrew Letter Dalet With Dagesh", "</script>": "Browser Challenge"}',
    ),
    (
        "rfc 3.2.3 sorting (non-BMP key)",
        '{"\\u20ac": "Euro Sign", "\\r": "Carriage Return", "\\ufb33": "Hebrew Letter '
        'Dalet With Dagesh", "1": "One", "\\ud83d\\ude00": "Emoji: Grinning Face", '
        '"\\u0080": "Control", "\\u00f6": "Latin Small Letter O With Diaeresis"}',
    ),
    ("non-BMP keys against U+E000-U+FFFF", '{"\\uffff": 1, "\\ud800\\udc00": 2, "\\ue000": 3, "z": 4}'),
    ("integral floats", '{"a": 1.0, "b": -0.0, "c": 300.0, "d": 1e3}'),
    ("small and large floats", "[1e-5, 0.0001, 1e16, 1e21, 123456789012345680000, 1.5e-7]"),
    ("integers beyond 2**53 (the one extension: exact digits)", "[9007199254740993, -9223372036854775808]"),
    ("escapes", '["\\u0000\\u001f\\u007f\\u2028", "tab\\there", "quote\\" backslash\\\\ slash/"]'),
    ("nesting", '{"b": [{"z": null, "y": [true, false]}], "a": {"c": {}, "b": []}}'),
]


def canonical_vectors() -> dict[str, Any]:
    cases: list[dict[str, Any]] = []
    for hex_, expected in RFC_NUMBERS:
        value = struct.unpack(">d", bytes.fromhex(hex_))[0]
        text = canonical_json(value, 2).decode()
        case = {"name": f"rfc number {hex_}", "ieee754": hex_, "canonical": text,
                "sha256": hashlib.sha256(text.encode()).hexdigest()}  # fmt: skip
        if canonical_json(value, 1).decode() != text:
            case["legacy"] = canonical_json(value, 1).decode()
        cases.append(case)
        assert text == expected, (hex_, text, expected)
    for name, text in TEXTS:
        value = json.loads(text)
        canonical = canonical_json(value, 2)
        case = {
            "name": name,
            "input": text,
            "canonical": canonical.decode(),
            "sha256": hashlib.sha256(canonical).hexdigest(),
        }
        legacy = canonical_json(value, 1)
        if legacy != canonical:
            case["legacy"] = legacy.decode()  # chain format 1, where it differs
        cases.append(case)
    keys = [{"key": k, "subject_token": short_digest(k)} for k in ("refund:order-8891", "charge:ünïcode-😀", "")]
    return {
        "about": "chain format 2 (RFC 8785) canonical JSON: parse `input` as JSON (or `ieee754` as a big-endian "
        "double), canonicalize, compare with `canonical` (UTF-8) and its sha256; `legacy` is chain format 1's "
        "form where it differs. `keys`: idempotency keys and the subject token derived from each.",
        "cases": cases,
        "keys": keys,
    }


# -- complete runs ---------------------------------------------------------------------------------------

AGENT = "refund-agent"
RUN_A = "01JRUNA0000000000000000000"
RUN_B = "01JRUNB0000000000000000000"
KEY = "refund:order-8891"


class _Stream:
    """An empty LEDGER stream, as the messages of the vectors land in it."""

    def __init__(self) -> None:
        self.seq = 0
        self.last: dict[str, int] = {}  # fence filter -> last stream seq
        self.chains: dict[str, tuple[int, str]] = {}  # filter -> (next seq, prev hash)
        self.messages: list[dict[str, Any]] = []

    def publish(self, subject: str, run_id: str, body: Payload, msg_id_of: Any, chain_format: int) -> dict[str, Any]:
        fence = fence_filter(subject)
        assert fence is not None
        seq, prev = self.chains.get(fence, (0, GENESIS))
        event, data = make_event(body, run_id=run_id, agent=AGENT, seq=seq, prev_hash=prev, chain_format=chain_format)
        last = self.last.get(fence, 0)  # a run's first message claims its id: fenced on every agent's subjects
        headers = {"Nats-Msg-Id": msg_id_of(seq), FENCE_HEADER: str(last),
                   FENCE_SUBJECT_HEADER: fence_for(subject, last)}  # fmt: skip
        self.seq += 1
        self.last[fence] = self.seq
        self.chains[fence] = (seq + 1, event.hash)
        message = {"stream_seq": self.seq, "subject": subject, "headers": headers, "data": data.decode("utf-8"),
                   "hash": event.hash}  # fmt: skip
        self.messages.append(message)
        return message


def run_vectors() -> dict[str, Any]:
    ids = (f"01JEVENT{n:018d}" for n in itertools.count())
    times = (f"2025-01-02T03:04:{n:02d}.000000Z" for n in itertools.count())
    stream = _Stream()
    fmt = JCS_CHAIN_FORMAT  # the example runs are what another language should write
    with mock.patch.object(events_module, "new_id", lambda: next(ids)), \
         mock.patch.object(events_module, "utc_now", lambda: next(times)):  # fmt: skip
        a = run_subject(AGENT, RUN_A, AGENT_WRITER)

        def on_a(body: Payload) -> None:
            stream.publish(a, RUN_A, body, lambda s: run_msg_id(RUN_A, s), fmt)

        version = VersionTuple(agent_version="node-1", model="scripted",
                               prompt_hash=hashlib.sha256(b"You issue refunds.").hexdigest())  # fmt: skip
        run_input = {"order": "order-8891", "amount": 12.5, "note": "broken \u00e9cran \U0001f600"}
        on_a(RunStarted(agent=AGENT, version=version, input=run_input, capture="full", chain_format=fmt))
        messages = [{"role": "user", "content": "refund order-8891"}]
        params = {"temperature": 0.0}
        on_a(ModelCalled(step=0, model="scripted", request={"messages": messages, "params": params},
                         args_digest=digest({"messages": messages, "params": params}, fmt),
                         response={"content": "refunding", "tool_calls": [], "finish_reason": "stop"},
                         usage=Usage(input_tokens=12, output_tokens=3), duration_ms=3.0))  # fmt: skip
        lookup = {"order": "order-8891"}
        found = {"order": "order-8891", "amount": 12.5, "currency": "EUR"}
        on_a(ToolCalled(step=1, name="lookup_order", args=lookup, args_digest=digest(lookup, fmt), output=found,
                        duration_ms=0.25))  # fmt: skip
        refund = {"order": "order-8891", "amount": 12.5}
        intent = EffectIntended(step=2, name="refund", key=KEY, args=refund, args_digest=digest(refund, fmt),
                                effect_class="irreversible", lease_s=30.0)  # fmt: skip
        on_a(intent)
        k = effect_subject(AGENT, KEY, AGENT_WRITER)
        claim = stream.publish(k, RUN_A, intent, lambda s: effect_msg_id(AGENT, KEY, s), fmt)
        result = {"refund_id": "rf-1", "amount": 12.5}
        committed = EffectCommitted(step=2, key=KEY, result=result, duration_ms=41.5, fencing_token=claim["stream_seq"])
        stream.publish(k, RUN_A, committed, lambda s: effect_msg_id(AGENT, KEY, s), fmt)
        on_a(committed)
        on_a(RunCompleted(output={"refunded": 12.5}))

        b = run_subject(AGENT, RUN_B, AGENT_WRITER)
        o = run_subject(AGENT, RUN_B, OPERATOR_WRITER)

        def on_b(subject: str, body: Payload) -> None:
            stream.publish(subject, RUN_B, body, lambda s: run_msg_id(RUN_B, s), fmt)

        on_b(b, RunStarted(agent=AGENT, version=version, input={"order": "order-7"}, capture="full", chain_format=fmt))
        approval_args = {"order": "order-7", "amount": 250}
        approval_digest = digest({"action": "refund", "args": approval_args}, fmt)
        on_b(
            b, ApprovalRequested(step=0, request_id="ap-0", action="refund", args=approval_args, digest=approval_digest)
        )
        on_b(b, RunSuspended(step=0, request_id="ap-0"))
        on_b(o, ApprovalResolved(request_id="ap-0", digest=approval_digest, approved=True, by="alice"))
        on_b(b, RunResumed(attempt=2, from_step=0, worker="host:42"))
        on_b(b, RunCompleted(output={"approved": True}))
    return {
        "about": "Messages in the order they were published to an empty LEDGER stream (stream_seq is what the "
        "server assigns). `data` is the message body (UTF-8), `hash` the event's hash; a publisher that builds the "
        "same events (same ids, ts and payloads) must produce exactly these subjects, headers and bytes; a reader "
        "must verify each run and key chain and fold the runs to: run A completed with key committed, run B "
        "completed after an operator's approval.",
        "chain_format": fmt,
        "agent": AGENT,
        "runs": {"A": RUN_A, "B": RUN_B},
        "key": KEY,
        "messages": stream.messages,
    }


# -- sealing ------------------------------------------------------------------------------------------

SEALED_VALUES = [
    ("a refund's arguments", {"order": "order-8891", "amount": 12.5, "note": "broken \u00e9cran \U0001f600"}),
    ("an integral float and a list", {"amount": 950.0, "lines": [1, 2.5, None, True]}),
    ("a bare string", "refunding"),
]
SEALED_TEXTS = [("an error message", "card declined: insufficient funds \u20ac")]


def sealing_vectors() -> dict[str, Any]:
    """A master key, one run's keys, their key record and sealed values, made by runledger's own
    sealing code (keystore, PayloadProtector) with the random bytes fixed."""
    master = LocalMasterKey(bytes(range(32)), "the vectors")
    kid = run_kid(AGENT, RUN_A)
    keys = RunKeys(kid, bytes(range(0x40, 0x60)), bytes(range(0x80, 0xA0)))
    nonces = [bytes([n]) * 12 for n in range(1, 32)]
    used: list[bytes] = []

    def urandom(size: int) -> bytes:
        assert size == 12, size
        used.append(nonces[len(used)])
        return used[-1]

    protector = PayloadProtector(DataPolicy(capture="full", encrypt=True), keys)
    values, texts = [], []
    token = CONTENT_FORMAT.set(JCS_CHAIN_FORMAT)
    try:
        with mock.patch.object(keystore.os, "urandom", urandom):
            record = asyncio.run(wrap_keys(master, keys))
            wrap_nonce = used[-1]
            for name, value in SEALED_VALUES:
                sealed = asyncio.run(protector.protect_value("args", value))
                plaintext = canonical_json(value, JCS_CHAIN_FORMAT).decode()
                values.append({"name": name, "value": value, "plaintext": plaintext, "nonce": used[-1].hex(),
                               "sealed": sealed})  # fmt: skip
            for name, text in SEALED_TEXTS:
                sealed_text = protector.protect_text(text)
                texts.append({"name": name, "text": text, "nonce": used[-1].hex(), "sealed": sealed_text})
    finally:
        CONTENT_FORMAT.reset(token)
    return {
        "about": 'Sealed content (docs/wire.md, "Sealing, exactly"), made with the nonces given: `master_key` '
        "(base64) and its id; the run's `kid`, `data_key` and `token_key` (base64); `key_record`, the exact bytes "
        "runledger stores at $KV.LEDGER_KEYS.<kid> (wrapped with `wrap_nonce`); each value with its plaintext "
        "(canonical JSON, chain format 2), its nonce and the sealed form; each text (an error message) likewise. "
        "Sealing with the same keys and nonces must give the same bytes; opening must give the value back.",
        "chain_format": JCS_CHAIN_FORMAT,
        "master_key": base64.b64encode(bytes(range(32))).decode(),
        "master_key_id": master.key_id,
        "kid": kid,
        "data_key": base64.b64encode(keys.data_key).decode(),
        "token_key": base64.b64encode(keys.token_key).decode(),
        "wrap_nonce": wrap_nonce.hex(),
        "key_record": record.decode(),
        "values": values,
        "texts": texts,
    }


# -- keyed digests ---------------------------------------------------------------------------------

DIGESTED_VALUES = [
    (
        "a model request",
        {"messages": [{"role": "user", "content": "refund order-8891"}], "params": {"temperature": 0.0}},
    ),
    ("a tool's arguments holding a card number", {"card": "4111 1111 1111 1111", "order": "order-8891"}),
    ("an approval's action and arguments", {"action": "refund", "args": {"order": "order-7", "amount": 250}}),
    ("an effect's arguments with a small integer", {"order": "order-8891", "amount": 7}),
    ("a bare yes", "yes"),
]


def digest_vectors() -> dict[str, Any]:
    """The digests of values under digest scheme 2 (keyed) and 1 (plain), with the run keys of the
    sealing vectors: what a writer of a run with keys records as ``args_digest`` and approval digests."""
    keys = RunKeys(run_kid(AGENT, RUN_A), bytes(range(0x40, 0x60)), bytes(range(0x80, 0xA0)))
    keyed, plain = Digester(JCS_CHAIN_FORMAT, KEYED_DIGESTS, keys.digest_key), Digester(JCS_CHAIN_FORMAT)
    cases = []
    for name, value in DIGESTED_VALUES:
        raw = canonical_json(value, JCS_CHAIN_FORMAT)
        cases.append({"name": name, "value": value, "canonical": raw.decode(), "plain": plain.of_bytes(raw),
                      "keyed": keyed.of_bytes(raw)})  # fmt: skip
    text = "card declined: insufficient funds \u20ac"
    return {
        "about": 'Digests of content (docs/wire.md, "Digests of content"): a run that records `digest_scheme: 2` '
        "in run.started digests with HMAC-SHA256 under its digest key, HKDF-SHA256-Expand of its `data_key` "
        "(the pseudorandom key) with info `digest_key_info`, 32 bytes: `digest_key` (base64). Each case: the "
        "value, its canonical JSON (chain format 2), its `plain` digest (scheme 1: sha256) and its `keyed` one "
        "(scheme 2: HMAC-SHA256 of the same bytes). `hash_only`: what capture hash-only records for a value "
        '(`{"$hash": keyed digest of its canonical JSON, "size"}`) and for an error text (`«hash:` keyed '
        "digest of its UTF-8 bytes `»`).",
        "chain_format": JCS_CHAIN_FORMAT,
        "digest_scheme": KEYED_DIGESTS,
        "kid": keys.kid,
        "data_key": base64.b64encode(keys.data_key).decode(),
        "digest_key_info": DIGEST_KEY_INFO.decode(),
        "digest_key": base64.b64encode(keys.digest_key).decode(),
        "cases": cases,
        "hash_only": {
            "value": DIGESTED_VALUES[3][1],
            "recorded": {"$hash": cases[3]["keyed"], "size": len(cases[3]["canonical"].encode())},
            "text": text,
            "recorded_text": f"«hash:{keyed.of_bytes(text.encode())}»",
        },
    }


def render(value: Any) -> str:
    return json.dumps(value, indent=1, ensure_ascii=False) + "\n"


def main() -> None:
    (HERE / "canonical.json").write_text(render(canonical_vectors()), encoding="utf-8")
    (HERE / "runs.json").write_text(render(run_vectors()), encoding="utf-8")
    (HERE / "sealing.json").write_text(render(sealing_vectors()), encoding="utf-8")
    (HERE / "digests.json").write_text(render(digest_vectors()), encoding="utf-8")
    print(f"wrote {HERE / 'canonical.json'}, {HERE / 'runs.json'}, {HERE / 'sealing.json'} and {HERE / 'digests.json'}",
          file=sys.stderr)  # fmt: skip


if __name__ == "__main__":
    main()
