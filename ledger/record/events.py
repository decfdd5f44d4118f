"""Events: the envelope of every recorded fact, the per-run hash chain, ``make_event`` and ``decode``.

Wire form: one NATS message per event, whose body is the canonical JSON of the
envelope (``id, run_id, agent, seq, type, schema_version, ts, payload,
prev_hash, hash``). ``hash = sha256(prev_hash || canonical JSON of the envelope
without hash)``, so each subject (a run, or one idempotency key) is a hash chain.

The envelope keeps the payload as the JSON object that was published, so the
bytes a reader hashes are the bytes the writer hashed; the typed payload model
(``Event.body``) is validated at construction and at decode. Old schema versions
are lifted by upcasters ``(type, from_version) -> fn(payload) -> payload`` before
validation; the hash is always checked over the bytes as stored.

The payload models, their registry (``PAYLOADS``) and the upcasters live in
``runledger.record.payloads``, which owns them; they are re-exported here so that
``from runledger.record.events import RunStarted`` keeps working.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import math
import operator
import re
import time
import types
import typing
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import SchemaValidator, from_json

from runledger.errors import EventDecodeError, UnknownSchemaVersionError
from runledger.record.canonical import CHAIN_FORMATS, LEGACY_CHAIN_FORMAT, canonical_json, read_back
from runledger.record.ids import new_id
from runledger.record.payloads import (
    PAYLOADS,
    UPCASTERS,
    ApprovalRequested,
    ApprovalResolved,
    BudgetGranted,
    Budgets,
    ChildCompleted,
    ChildFailed,
    ChildStarted,
    ClockRead,
    EffectCommitted,
    EffectFailed,
    EffectIntended,
    EffectResolved,
    EffectSimulated,
    ErrorInfo,
    GraphCheckpointed,
    GraphCheckpointsDeleted,
    GraphWritesSaved,
    JournalSnapshotted,
    ModelCalled,
    Payload,
    RandomDrawn,
    RunCompleted,
    RunErased,
    RunFailed,
    RunForked,
    RunResumed,
    RunRetried,
    RunStarted,
    RunSuspended,
    ToolCalled,
    ToolListing,
    Upcaster,
    Usage,
    VersionAccepted,
    VersionTuple,
    WorkflowCheckpointDeleted,
    WorkflowCheckpointed,
    upcast,
    upcaster,
)

# The payload models are re-exported: runledger.record.payloads owns them.
__all__ = [
    "GENESIS",
    "KEY_TYPES",
    "MAX_INT64",
    "MIN_INT64",
    "PAYLOADS",
    "RFC3339",
    "UPCASTERS",
    "ApprovalRequested",
    "ApprovalResolved",
    "BudgetGranted",
    "Budgets",
    "ChildCompleted",
    "ChildFailed",
    "ChildStarted",
    "ClockRead",
    "EffectCommitted",
    "EffectFailed",
    "EffectIntended",
    "EffectResolved",
    "EffectSimulated",
    "ErrorInfo",
    "Event",
    "GraphCheckpointed",
    "GraphCheckpointsDeleted",
    "GraphWritesSaved",
    "JournalSnapshotted",
    "ModelCalled",
    "Payload",
    "RandomDrawn",
    "RunCompleted",
    "RunErased",
    "RunFailed",
    "RunForked",
    "RunResumed",
    "RunRetried",
    "RunStarted",
    "RunSuspended",
    "ToolCalled",
    "ToolListing",
    "Upcaster",
    "Usage",
    "VersionAccepted",
    "VersionTuple",
    "WorkflowCheckpointDeleted",
    "WorkflowCheckpointed",
    "chain_hash",
    "decode",
    "decode_fast",
    "json_schemas",
    "make_event",
    "proven_event",
    "upcast",
    "upcaster",
    "utc_now",
]

GENESIS = "0" * 64
MAX_INT64 = 2**63 - 1
MIN_INT64 = -(2**63)
# Every ts is RFC 3339 with a time zone: what the fold parses and DuckDB stores.
RFC3339 = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$"


# -- the envelope ---------------------------------------------------------------------------------------


P = TypeVar("P", bound=Payload)


class Event(BaseModel):
    """One recorded fact. ``payload`` is the JSON object as published; ``body`` is its typed form."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    run_id: str
    agent: str
    seq: int = Field(ge=0, le=MAX_INT64)
    type: str
    schema_version: int = Field(ge=1)
    ts: str = Field(pattern=RFC3339)
    payload: dict[str, Any]
    prev_hash: str
    hash: str

    @property
    def body(self) -> Payload:
        """The payload as its typed, current-version model (upcast when needed)."""
        cls = PAYLOADS[self.type]
        data = self.payload
        if self.schema_version != cls.VERSION:
            data = upcast(self.type, self.schema_version, dict(data))
        return cls.model_validate(data)

    def body_as(self, cls: builtins.type[P]) -> P:
        body = self.body
        if not isinstance(body, cls):
            raise TypeError(f"event {self.type} is not a {cls.__name__}")
        return body

    @property
    def step(self) -> int | None:
        step = self.payload.get("step")
        return step if isinstance(step, int) else None

    def to_bytes(self, chain_format: int = LEGACY_CHAIN_FORMAT) -> bytes:
        """The wire bytes of this event in ``chain_format`` (its run's)."""
        return canonical_json(self.model_dump(mode="json"), chain_format)


_ENVELOPE_FIELDS = frozenset(Event.model_fields)


_second: tuple[int, str] = (-1, "")  # the last whole second utc_now formatted, and its text


def utc_now() -> str:
    """The current time as RFC 3339 UTC with microseconds: the form of every ``ts``."""
    # The date and time of day change once a second: formatted then, and the microseconds joined to
    # them (a quarter of datetime.now().isoformat()'s cost; one tuple read and written, thread-safe).
    global _second
    seconds, micros = divmod(time.time_ns() // 1000, 1_000_000)
    second = _second
    if second[0] != seconds:
        second = _second = (seconds, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)))
    return f"{second[1]}.{micros:06d}Z"


def chain_hash(prev_hash: str, unhashed: dict[str, Any], chain_format: int = LEGACY_CHAIN_FORMAT) -> str:
    """sha256(prev_hash || canonical JSON of the envelope without ``hash``), in ``chain_format``."""
    h = hashlib.sha256(prev_hash.encode("ascii"))
    h.update(canonical_json(unhashed, chain_format))
    return h.hexdigest()


def make_event(
    body: Payload,
    *,
    run_id: str,
    agent: str,
    seq: int,
    prev_hash: str,
    ts: str | None = None,
    chain_format: int = LEGACY_CHAIN_FORMAT,
) -> tuple[Event, bytes]:
    """Build the next event of a chain and its wire bytes, canonical in ``chain_format`` (the run's:
    runledger.record.canonical)."""
    unhashed: dict[str, Any] = {
        "id": new_id(),
        "run_id": run_id,
        "agent": agent,
        "seq": seq,
        "type": body.TYPE,
        "schema_version": body.VERSION,
        "ts": ts or utc_now(),
        "payload": body.model_dump(mode="json"),
        "prev_hash": prev_hash,
    }
    # The envelope's canonical JSON is encoded once: it is hashed as is, and the wire bytes are the
    # same bytes with '"hash":"<hex>",' after the agent ("agent" sorts first, "hash" second):
    # exactly what canonical_json of the envelope with its hash gives (and what decode_fast
    # relies on). The fallback is there for an encoder that would ever lay it out otherwise.
    unhashed_json = canonical_json(unhashed, chain_format)
    h = hashlib.sha256(prev_hash.encode("ascii"))
    h.update(unhashed_json)
    unhashed["hash"] = hash_ = h.hexdigest()
    head = b'{"agent":' + canonical_json(agent) + b","
    if unhashed_json.startswith(head):
        data = b"".join((head, b'"hash":"', hash_.encode("ascii"), b'",', unhashed_json[len(head) :]))
    else:  # pragma: no cover - not with the stdlib encoder
        data = canonical_json(unhashed, chain_format)
    return _built_event(unhashed), data  # every field was produced above from validated parts


def _built_event(fields: dict[str, Any]) -> Event:
    """What ``model_construct`` builds from the envelope's fields in declaration order, without its
    per-field alias and default lookups: for fields the caller produced or already checked."""
    event = Event.__new__(Event)
    object.__setattr__(event, "__dict__", fields)
    object.__setattr__(event, "__pydantic_fields_set__", set(_ENVELOPE_FIELDS))
    object.__setattr__(event, "__pydantic_extra__", None)
    object.__setattr__(event, "__pydantic_private__", None)
    return event


def decode(raw: bytes) -> Event:
    """Parse and validate one event from its wire bytes.

    Checks the envelope, the payload against its registered type and version (upcast
    when old), and that ``hash`` matches the content. Raises EventDecodeError (or
    UnknownSchemaVersionError) with the reason; readers quarantine instead of crashing.

    Validation is strict (pydantic's strict mode), envelope and payload: no value is coerced,
    because readers use the payload as stored (the fold, the projection), not the validated
    copy, so a value passes only if it already is what the schema says. A string is not an
    integer (``"step": "0"``), a bool is not a number, and a float is not an integer even when
    integral (``1.0``): JSON has one number type, but runledger's writers (canonical JSON of
    validated models) write integers without a fraction, and ``1.0`` stored as a step would reach
    the fold and the projection as a float. An integer is accepted where a float is declared (a
    JSON number without a fraction is still a number). Integers of typed fields (steps, token
    counts, budgets: everything a BIGINT column of the projection holds) must fit in 64 bits.
    """
    try:
        # pydantic-core parses and validates the envelope in one pass (about 5x json.loads).
        event = Event.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        raise _envelope_error(raw, exc) from exc
    cls = PAYLOADS.get(event.type)
    if cls is None:
        raise EventDecodeError(f"unknown event type {event.type!r}", raw)
    if event.schema_version > cls.VERSION:
        raise UnknownSchemaVersionError(event.type, event.schema_version, cls.VERSION, raw)
    try:
        data = event.payload
        if event.schema_version != cls.VERSION:
            data = upcast(event.type, event.schema_version, dict(data))
        cls.model_validate(data, strict=True)
        beyond = _beyond_int64(cls, data)
    except (ValidationError, EventDecodeError, ValueError) as exc:
        reason = _first_error(exc) if isinstance(exc, ValidationError) else str(exc)
        raise EventDecodeError(f"invalid {event.type} payload: {reason}", raw) from exc
    if beyond is not None:
        raise EventDecodeError(f"invalid {event.type} payload: {beyond}", raw)
    try:
        matches = _hash_matches(raw, event)
    except ValueError as exc:  # e.g. NaN or infinity in a payload: no canonical JSON exists for it
        raise EventDecodeError(f"event {event.run_id}/{event.seq}: not canonical JSON ({exc})", raw) from exc
    if not matches:
        raise EventDecodeError(f"event {event.run_id}/{event.seq}: hash does not match its content", raw)
    # NaN, Infinity and numbers beyond a double (1e400 parses as infinity) are not JSON, but a
    # hostile writer can hash bytes holding them. Readers must refuse them: a projection stores
    # the payload as JSON, and one such value would make a whole batch impossible to commit.
    # (A walk of the payload's structure: a few microseconds; most bytes are inside strings.)
    if not _finite(event.payload):
        raise EventDecodeError(f"event {event.run_id}/{event.seq}: NaN or infinity in the payload (not JSON)", raw)
    return _read_back(event, raw)


def _read_back(event: Event, raw: bytes) -> Event:
    """``event`` with a double JCS wrote as digits beyond 64 bits read back as a double (``read_back``)."""
    payload = read_back(event.payload, raw)
    return event if payload is event.payload else event.model_copy(update={"payload": payload})


def _int_paths(cls: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Where ``cls`` declares integers (``int``, ``int | None``), nested models included."""
    paths: list[tuple[str, ...]] = []
    for name, info in cls.model_fields.items():
        annotation = info.annotation
        union = typing.get_origin(annotation) in (typing.Union, types.UnionType)  # int | None, Optional[int]
        options = typing.get_args(annotation) if union else (annotation,)
        for option in options:
            if option is int:
                paths.append((*prefix, name))
            elif isinstance(option, type) and issubclass(option, BaseModel):
                paths.extend(_int_paths(option, (*prefix, name)))
    return paths


_INT_PATHS: dict[type[Payload], tuple[tuple[str, ...], ...]] = {}


def _beyond_int64(cls: type[Payload], payload: dict[str, Any]) -> str | None:
    """The first typed integer of a (validated) ``payload`` that no 64-bit integer holds, as a reason."""
    paths = _INT_PATHS.get(cls)
    if paths is None:
        paths = _INT_PATHS[cls] = tuple(_int_paths(cls))
    for path in paths:
        value: Any = payload
        for key in path:
            value = value.get(key) if type(value) is dict else None
        if type(value) is int and not MIN_INT64 <= value <= MAX_INT64:
            digits = len(str(abs(value))) if abs(value) < 10**100 else "over 100"
            return f"{'.'.join(path)}: an integer of {digits} digits, beyond 64 bits (-2**63..2**63-1)"
    return None


def _finite(value: Any) -> bool:
    """No NaN or infinity anywhere in ``value`` (a parsed JSON value)."""
    stack = [value]
    pop, isfinite = stack.pop, math.isfinite
    while stack:
        item = pop()
        kind = type(item)
        if kind is dict:
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
        elif kind is float and not isfinite(item):
            return False
    return True


# -- the fast path ---------------------------------------------------------------------------------------

_ENVELOPE = tuple(Event.model_fields)
_GET_ENVELOPE = operator.itemgetter(*_ENVELOPE)
# ASCII digits only and no trailing newline: a subset of what the pattern of ``Event.ts`` accepts.
RFC3339_ASCII = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2})"
)


def _fields_validator(cls: type[Payload]) -> SchemaValidator:
    """The validator of ``cls``'s fields alone: what ``cls.model_validate`` runs, minus the instance.

    The model's own fields schema and config (``extra="forbid"``...), so the same payloads
    pass and fail; nested models are still built."""
    schema: dict[str, Any] = dict(cls.__pydantic_core_schema__)
    model = schema["schema"] if schema["type"] == "definitions" else schema
    if model.get("type") != "model" or model["schema"].get("type") != "model-fields":  # pragma: no cover
        return SchemaValidator(cls.__pydantic_core_schema__)  # pydantic's layout changed: the whole model
    if schema["type"] == "definitions":
        schema["schema"] = model["schema"]
    else:
        schema = model["schema"]
    return SchemaValidator(schema, model.get("config"))


_FIELD_VALIDATORS: dict[type[Payload], SchemaValidator] = {}


def _field_validator(cls: type[Payload]) -> SchemaValidator:
    found = _FIELD_VALIDATORS.get(cls)
    if found is None:
        found = _FIELD_VALIDATORS[cls] = _fields_validator(cls)
    return found


def decode_fast(raw: bytes) -> Event:
    """``decode(raw)``, about twice as fast for the events runledger's writers produce.

    Same contract, same result: the fast path accepts only what ``decode`` accepts and builds
    the same ``Event``; anything else (a field of another JSON type, an integer beyond 64
    bits, an old schema version to upcast, bytes not in canonical layout, any error) is
    handed to ``decode``, which returns or raises exactly as it always does.

    The fast path parses the bytes once with pydantic-core's parser (the one
    ``Event.model_validate_json`` uses), checks the envelope's types directly, validates the
    payload strictly with its type's own field schema (and the 64-bit bound of its integers),
    and checks the hash over the stored bytes without re-serialising them.
    tests/unit/test_events.py compares both on hostile input.
    """
    event = _decode_fast(raw)
    if event is None or not _finite(event.payload):
        return decode(raw)  # which says what is wrong
    return _read_back(event, raw)


def _decode_fast(raw: bytes) -> Event | None:
    try:
        data = from_json(raw, allow_inf_nan=False)  # NaN, Infinity: decode's business (it refuses them)
    except ValueError:
        return None
    if type(data) is not dict or data.keys() != _ENVELOPE_FIELDS:
        return None
    values = _GET_ENVELOPE(data)  # declaration order: id run_id agent seq type schema_version ts payload prev hash
    id_, run_id, agent, seq, type_, version, ts, payload, prev_hash, hash_ = values
    if not (
        type(id_) is str and type(run_id) is str and type(agent) is str and type(type_) is str
        and type(ts) is str and type(prev_hash) is str and type(hash_) is str
        and type(seq) is int and 0 <= seq <= MAX_INT64 and type(version) is int and type(payload) is dict
        and ts.isascii() and RFC3339_ASCII.fullmatch(ts) is not None and hash_.isascii() and prev_hash.isascii()
    ):  # fmt: skip
        return None
    cls = PAYLOADS.get(type_)
    if cls is None or version != cls.VERSION:
        return None  # unknown, newer (errors) or older (upcast): decode's business
    return proven_event(raw, cls, dict(zip(_ENVELOPE, values, strict=True)))


def proven_event(raw: bytes, cls: type[Payload], fields: dict[str, Any]) -> Event | None:
    """The rest of a fast decoder's proof, shared by every fast decoder (one definition of a valid
    event): ``fields`` is the envelope of ``raw`` in declaration order, its JSON types, ``ts`` and
    ``seq`` already checked, its type ``cls`` at the current version. Returns what ``model_validate_json``
    would build when the payload is valid for ``cls`` strictly, its typed integers fit in 64 bits
    and ``hash`` is the hash of the stored bytes; None on any doubt (``decode`` then judges)."""
    payload, prev_hash, hash_ = fields["payload"], fields["prev_hash"], fields["hash"]
    try:
        _field_validator(cls).validate_python(payload, strict=True)
    except (ValidationError, ValueError):
        return None
    if _beyond_int64(cls, payload) is not None:
        return None
    needle = b'"hash":"' + hash_.encode("ascii") + b'",'
    at = raw.find(needle)
    if at <= 0:
        return None
    h = hashlib.sha256(prev_hash.encode("ascii"))
    h.update(raw[:at])
    h.update(raw[at + len(needle) :])
    if h.hexdigest() != hash_:
        return None
    return _built_event(fields)  # without validating each field again: all were checked


def _hash_matches(raw: bytes, event: Event) -> bool:
    # Fast path: canonical bytes hold '"hash":"<hex>",' right after "agent"; the hash is over
    # the same bytes without it. A match proves the content is what the writer hashed.
    needle = b'"hash":"' + event.hash.encode("ascii", "replace") + b'",'
    at = raw.find(needle)
    if at > 0:
        h = hashlib.sha256(event.prev_hash.encode("ascii", "replace"))
        h.update(raw[:at])
        h.update(raw[at + len(needle) :])
        if h.hexdigest() == event.hash:
            return True
    # Slow path: bytes that are not in canonical form (another writer's JSON encoder). One event
    # does not say its run's chain format: it matches if its content hashes right in either (a
    # writer able to publish can compute a valid hash in any format; verify checks the run's).
    data = json.loads(raw)
    unhashed = {k: v for k, v in data.items() if k != "hash"}
    return any(chain_hash(event.prev_hash, unhashed, fmt) == event.hash for fmt in CHAIN_FORMATS)


def _envelope_error(raw: bytes, exc: ValidationError) -> EventDecodeError:
    kind = exc.errors()[0]["type"]
    if kind in ("json_invalid", "json_type"):
        return EventDecodeError(f"not JSON: {exc.errors()[0]['msg']}", raw)
    if kind == "model_type":
        return EventDecodeError("not a JSON object", raw)
    return EventDecodeError(f"not an event envelope: {_first_error(exc)}", raw)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(root)"
    return f"{where}: {err['msg']}"


# The event types a key's subject holds (docs/wire.md, "The claim protocol for effects").
KEY_TYPES = frozenset({"effect.intended", "effect.committed", "effect.failed", "effect.resolved"})
_KEY_SUBJECT = (
    "On a key: publish to ledger.effect.<agent>.<digest>.<writer> (digest: the first 32 hex digits of "
    "sha256 of the idempotency key) with Nats-Msg-Id effect:<agent>:<digest>:<seq>, seq being the key's "
    "own, fenced on the whole key; never <run_id>:<seq> there: msg ids are compared across the whole "
    "stream, and the run's event already holds that id, so the key's event would be acknowledged as a "
    "duplicate and never stored. "
)


def json_schemas() -> dict[str, Any]:
    """The JSON Schema of every event type, keyed by type, for publishers in any language."""
    envelope = Event.model_json_schema()
    out: dict[str, Any] = {}
    for type_, cls in sorted(PAYLOADS.items()):
        schema = json.loads(json.dumps(envelope))
        schema["title"] = f"runledger event {type_}"
        schema["properties"]["type"] = {"const": type_}
        schema["properties"]["schema_version"] = {"const": cls.VERSION}
        payload = cls.model_json_schema()
        # Hoist nested definitions so "#/$defs/..." references resolve from the root.
        schema.setdefault("$defs", {}).update(payload.pop("$defs", {}))
        schema["properties"]["payload"] = payload
        schema["description"] = (
            "hash = sha256 hex of (prev_hash as ASCII || canonical JSON of this object without 'hash'); "
            "canonical JSON: RFC 8785 in runs whose run.started has chain_format 2, else the legacy "
            "form (docs/wire.md). seq 0 has prev_hash = 64 zeros. "
            "On a run: publish to ledger.run.<agent>.<run_id>.<writer> with Nats-Msg-Id <run_id>:<seq>, "
            f"fenced on the whole run (docs/wire.md). {_KEY_SUBJECT if type_ in KEY_TYPES else ''}"
            f"{cls.__doc__ or ''}"
        ).strip()
        out[type_] = schema
    return out
