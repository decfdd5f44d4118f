"""What a run records of its content, and how readers get it back.

Every event has *structure* (type, step, tool and model names, args digests, token
usage, durations, statuses, idempotency keys) and *content* (the fields listed in
``CONTENT_FIELDS``: inputs, model requests and responses, tool arguments and outputs,
effect arguments and results, approval arguments, run outputs, error messages and
tracebacks). Structure is always recorded as is: the fold, budgets, resume checks
and the projections run on it. Content goes through ``PayloadProtector`` in the
SDK, before any byte leaves the agent process:

1. **capture policy** (recorded in ``run.started.capture``): ``full`` records content
   as the agent saw it (only values that ``secret://`` references resolved to are
   removed); ``redacted`` (the default) also applies the run's ``Redactor`` (detectors
   and field paths, ``runledger.protect.redaction``); ``hash-only`` records
   ``{"$hash": digest of the redacted value, "size": n}`` and nothing else (the run's digest:
   keyed under its digest key, which erasure destroys, in runs that record digest scheme 2).
2. **sealing** (``DataPolicy.encrypt``, on by default): the value's canonical JSON is
   encrypted under the run's data key (``runledger.protect.keystore``) as
   ``{"$enc": "A256GCM", "kid": ..., "ct": base64}``; error messages and tracebacks
   (string fields) as ``"«sealed:A256GCM:<kid>:<base64>»"``. Erasing a run destroys the
   key, which makes this unreadable everywhere while the hash chain (over the
   ciphertext) still verifies.
3. **by reference**: a value whose (sealed) bytes exceed ``blob_threshold`` is stored
   in the object store and replaced by a blob reference (``runledger.protect.blobs``).

Trade-off, on purpose: the agent always gets the real values in live mode; the
*record* holds what the policy kept. A resume replays recorded values, so a redacted
step replays with its tokens (``«redacted:...»``) in place of the secrets, and a
``hash-only`` step, or a step of an erased run, cannot be replayed at all
(``PayloadUnavailableError``). Credentials belong in ``secret://NAME`` references,
which replay unchanged and are resolved again where the tool runs. ``args_digest`` is
computed over the real arguments, so the nondeterminism check of a resume still holds; in a
run with keys it is an HMAC under the run's digest key (runledger.record.digests), so once the
run is erased a low-entropy value in the arguments (a card number, an amount) can no longer be
confirmed by trying every candidate against it.

``PayloadOpener`` is the other half: it unseals content fields with the run's key
(when available) and, on request, fetches and verifies blobs. Readers that cannot
open a value (no key: erased, or no permission) leave the sealed form in place, so
nothing ever shows ciphertext as if it were content, and a resume that needs it fails
with a clear error.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from runledger.errors import KeyStoreError, LedgerError, MasterKeyMissingError, PayloadUnavailableError
from runledger.protect.blobs import MEDIA_JSON, BlobStore, is_blob_ref
from runledger.protect.data_policy import DEFAULT_BLOB_THRESHOLD as DEFAULT_BLOB_THRESHOLD
from runledger.protect.data_policy import Capture as Capture
from runledger.protect.data_policy import DataPolicy as DataPolicy
from runledger.protect.keystore import ALG, KeyStore, KVKeyStore, RunKeys, run_kid
from runledger.record.canonical import CONTENT_FORMAT, canonical_json, jsonable, read_back
from runledger.record.digests import Digester
from runledger.record.events import Event, Payload

if TYPE_CHECKING:
    from runledger.log.client import LedgerClient
    from runledger.protect.redaction import SecretResolver

# Redaction (its detectors' patterns, ~30 ms to import) is imported by the write side when a run's
# protector is made: readers of content (``runledger show``, ``runs``) open sealed values and never redact.

# DataPolicy, Capture and DEFAULT_BLOB_THRESHOLD (imported above, importable from here) have a module
# of their own, runledger.protect.data_policy: an agent module makes a DataPolicy at import, and
# needs none of this module's imports (the key store, blobs, redaction, the event models) for it.

# Content fields of each event type (top-level payload keys). Everything else is structure.
CONTENT_FIELDS: dict[str, tuple[str, ...]] = {
    "run.started": ("input",),
    "run.completed": ("output",),
    "model.called": ("request", "response"),
    "tool.called": ("args", "output"),
    "effect.intended": ("args",),
    "effect.committed": ("result",),
    "effect.resolved": ("result",),
    "effect.simulated": ("args", "result"),
    "approval.requested": ("args",),
    "child.completed": ("output",),
    "graph.checkpointed": ("values", "metadata", "checkpoint"),
    "graph.writes_saved": ("writes",),
    "workflow.checkpointed": ("checkpoint",),
    "journal.snapshotted": ("journal",),
}
# Event types whose ``error`` (an ErrorInfo) carries content in ``message`` and ``traceback``.
ERROR_TYPES = frozenset({"run.failed", "model.called", "tool.called", "effect.failed", "child.failed"})
ERROR_TEXT_FIELDS = ("message", "traceback")
MAX_TRACEBACK = 16 * 1024

_SEALED_TEXT = re.compile(r"^«sealed:A256GCM:([A-Za-z0-9_.=-]+):([A-Za-z0-9+/=]+)»$")

logger = logging.getLogger(__name__)


def is_sealed(value: Any) -> bool:
    return isinstance(value, dict) and value.get("$enc") == ALG and "kid" in value and "ct" in value


def is_hashed(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 2 and "$hash" in value and "size" in value


def is_sealed_text(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("«sealed:") and bool(_SEALED_TEXT.match(value))


def content_values(event: Event) -> list[Any]:
    """The content of ``event`` as recorded: its content fields and error texts (non-null)."""
    p = event.payload
    values = [p.get(f) for f in CONTENT_FIELDS.get(event.type, ()) if p.get(f) is not None]
    err = p.get("error") if event.type in ERROR_TYPES else None
    if isinstance(err, dict):
        values += [err.get(f) for f in ERROR_TEXT_FIELDS if isinstance(err.get(f), str)]
    return values


def is_placeholder(value: Any) -> bool:
    """Whether a recorded content value is a stand-in the run's data policy wrote in place of the
    content (sealed, sealed text, hashed, or a blob reference) rather than the content itself: what a
    reader of a run (``runledger.load_run``) finds where content was not, or could not be, opened
    (an erased run, a missing key, ``capture="hash"``)."""
    return is_sealed(value) or is_blob_ref(value) or is_hashed(value) or is_sealed_text(value)


class PayloadProtector:
    """The write side: turns a payload into what may be recorded. One per run (it holds the run's keys)."""

    def __init__(
        self,
        policy: DataPolicy,
        keys: RunKeys | None,
        blobs: BlobStore | None = None,
        resolver: SecretResolver | None = None,
    ) -> None:
        if policy.encrypt and keys is None:
            raise LedgerError("sealing content needs the run's keys: pass keys or DataPolicy(encrypt=False)")
        if policy.capture != "full" and keys is None:
            raise LedgerError(f"capture={policy.capture} needs the run's token key: pass keys")
        self.policy = policy
        self.keys = keys
        self.blobs = blobs
        # Without keys (capture=full, no sealing) tokens of resolved secrets still need a key:
        # a process-local one is fine, since they are never joined across runs.
        token_key = keys.token_key if keys is not None else hashlib.sha256(b"runledger-full-capture").digest()
        from runledger.protect.redaction import Redactor, SecretResolver, off_loop

        self._off_loop = off_loop
        self.redactor = Redactor(token_key, policy.redaction)
        self.resolver = resolver or SecretResolver()
        # How hash-only content is digested: the run's digests (runledger.record.digests; set by the
        # run, RecordedRun), plain sha256 until then.
        self.hashes = Digester()
        self.resolver.on_resolve = lambda name, value: self.redactor.add_secret(value, f"secret:{name}")

    async def protect(self, body: Payload, encoded: Mapping[str, bytes] | None = None) -> Payload:
        """``body`` as it may be recorded: a copy with its content fields and error texts replaced by
        what the policy records (every content field takes any JSON value, so the copy is as valid
        as ``body``; runledger's content fields are ``Any`` or ``dict``, tests/unit/test_capture.py).

        ``encoded``: the canonical JSON (in the chain's format, ``CONTENT_FORMAT``) of some of its
        content fields, by name, when the caller has it already (a step encodes its arguments for
        their digest): such a field holds a JSON-native value, and when redaction leaves it as it is
        it is sealed from those bytes instead of being encoded again."""
        fields = CONTENT_FIELDS.get(body.TYPE, ())
        error = getattr(body, "error", None) if body.TYPE in ERROR_TYPES else None
        if error is None and all(is_placeholder(v) for n in fields if (v := getattr(body, n)) is not None):
            return body  # nothing to protect, or protected already (an effect's intent, claim and outcome)
        known = encoded or {}
        updates: dict[str, Any] = {}
        for name in fields:
            value = getattr(body, name)
            if value is not None:
                raw = known.get(name)
                # The JSON form a dump of the model would give (tuples as lists, models as dicts...):
                # what redaction walks. A field given with its bytes is JSON-native already.
                updates[name] = await self.protect_value(name, value if raw is not None else jsonable(value), raw)
        if error is not None:  # an ErrorInfo in every ERROR_TYPES event
            texts: dict[str, str] = {}
            for name in ERROR_TEXT_FIELDS:
                text = getattr(error, name)
                if isinstance(text, str):
                    text = text[-MAX_TRACEBACK:] if name == "traceback" else text
                    texts[name] = await self._off_loop(text, self.protect_text, text)  # large: in a worker thread
            updates["error"] = error.model_copy(update=texts)
        return body.model_copy(update=updates)

    def _clean(self, name: str, value: Any) -> Any:
        """``value`` as the policy keeps it: ``value`` itself when the policy changes nothing in it."""
        if is_placeholder(value):
            return value  # already protected (a branch copying a recorded reference)
        if self.policy.capture == "full":
            return self._known_only(value) if self.redactor.has_known_secrets else value
        return self.redactor.redact(value, (name,))

    def _known_only(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redactor.redact_known(value)
        if isinstance(value, dict):
            return {k: self._known_only(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._known_only(v) for v in value]
        return value

    async def protect_value(self, name: str, value: Any, encoded: bytes | None = None) -> Any:
        """The recorded form of the content field ``name``. ``encoded``: ``value``'s canonical JSON in
        ``CONTENT_FORMAT``, if the caller has it (used when redaction leaves ``value`` as it is)."""
        cleaned = await self._off_loop(value, self._clean, name, value)  # a large value: in a worker thread
        if is_placeholder(cleaned):
            return cleaned
        # In the format of the chain it is recorded in (CONTENT_FORMAT); the caller's bytes are of ``value``.
        raw = encoded if cleaned is value and encoded is not None else canonical_json(cleaned, CONTENT_FORMAT.get())
        if self.policy.capture == "hash-only":
            return {"$hash": self.hashes.of_bytes(raw), "size": len(raw)}
        if self.policy.encrypt:
            assert self.keys is not None
            sealed = self.keys.seal(raw)
            if self.blobs is not None and len(sealed) > self.policy.blob_threshold:
                return await self.blobs.put(sealed, MEDIA_JSON, enc=ALG, kid=self.keys.kid)
            return {"$enc": ALG, "kid": self.keys.kid, "ct": base64.b64encode(sealed).decode("ascii")}
        if self.blobs is not None and len(raw) > self.policy.blob_threshold:
            return await self.blobs.put(raw, MEDIA_JSON)
        return cleaned

    def protect_text(self, text: str) -> str:
        text = self._clean("error", text)
        if self.policy.capture == "hash-only":
            return f"«hash:{self.hashes.of_bytes(text.encode())}»"
        if self.policy.encrypt:
            assert self.keys is not None
            sealed = base64.b64encode(self.keys.seal(text.encode("utf-8"))).decode("ascii")
            return f"«sealed:{ALG}:{self.keys.kid}:{sealed}»"
        return text

    def resolve_secrets(self, args: Any) -> Any:
        """``args`` with ``secret://NAME`` references resolved, for the tool only (never recorded)."""
        return self.resolver.resolve(args)


KeyLookup = Callable[[str], Awaitable[RunKeys | None]]


class PayloadOpener:
    """The read side: unseals content with run keys and fetches blob bodies, verifying hashes.

    ``strict`` opening (a resume replaying a value) raises PayloadUnavailableError when a
    value cannot be read; lenient opening (a reader showing a run) leaves it sealed.
    """

    def __init__(self, keys: KeyStore | None, blobs: BlobStore | None = None) -> None:
        self._store = keys
        self._blobs = blobs
        self._cache: dict[str, RunKeys | None] = {}
        self._told_master = False

    def remember(self, keys: RunKeys) -> None:
        self._cache[keys.kid] = keys

    async def key(self, kid: str, *, strict: bool = True) -> RunKeys | None:
        """The run's keys; None when it has none (erased). Without a master key (an analyst's
        process, by design) a lenient read leaves content sealed; a strict one raises
        MasterKeyMissingError, which says what to do."""
        if kid not in self._cache:
            try:
                self._cache[kid] = None if self._store is None else await self._store.get(kid)
            except KeyStoreError:
                self._cache[kid] = None
            except MasterKeyMissingError as exc:
                if strict:
                    raise
                if not self._told_master:
                    self._told_master = True
                    logger.warning("content stays sealed: %s", exc)
                return None
        return self._cache[kid]

    async def open_event(self, event: Event, *, fetch: bool = False) -> Event:
        """``event`` with its content fields opened where possible (lenient). Same hash: the
        returned event is for reading; the chain is verified over the stored bytes."""
        fields = CONTENT_FIELDS.get(event.type, ())
        p = event.payload
        err = p.get("error") if event.type in ERROR_TYPES else None
        if not any(is_placeholder(p.get(f)) for f in fields) and not (
            isinstance(err, dict) and any(is_sealed_text(err.get(f)) for f in ERROR_TEXT_FIELDS)
        ):
            return event
        data = dict(p)
        for name in fields:
            data[name] = await self.open_value(data.get(name), strict=False, fetch=fetch)
        if isinstance(err, dict):
            err = dict(err)
            for name in ERROR_TEXT_FIELDS:
                if isinstance(err.get(name), str):
                    err[name] = await self.open_text(err[name], strict=False)
            data["error"] = err
        return event.model_copy(update={"payload": data})

    async def open_value(self, value: Any, *, strict: bool = True, fetch: bool = True) -> Any:
        """The content behind ``value`` (itself when it is plain content)."""
        for _ in range(8):  # a branch may wrap a copied reference in its own seal
            if is_sealed(value):
                keys = await self.key(value["kid"], strict=strict)
                if keys is None:
                    if strict:
                        what = f"content sealed under {value['kid']}"
                        raise PayloadUnavailableError(what, missing_key_reason(value["kid"]))
                    return value
                value = _loads(keys.unseal(base64.b64decode(value["ct"])))
            elif is_blob_ref(value):
                if not fetch or self._blobs is None:
                    if strict:
                        raise PayloadUnavailableError(f"blob {value['sha256']}", "no object store to fetch it from")
                    return value
                enc_kid = value.get("kid") if value.get("enc") else None
                keys = await self.key(enc_kid, strict=strict) if enc_kid else None
                if enc_kid and keys is None:
                    if strict:
                        raise PayloadUnavailableError(f"blob {value['sha256']}", missing_key_reason(enc_kid))
                    return value
                try:
                    data = await self._blobs.fetch(value)
                except LedgerError as exc:
                    if strict:
                        raise PayloadUnavailableError(f"blob {value['sha256']}", str(exc)) from exc
                    return value
                value = _loads(keys.unseal(data) if keys is not None else data)
            elif is_hashed(value):
                if strict:
                    raise PayloadUnavailableError("content", "the run was recorded with capture=hash-only")
                return value
            else:
                return value
        return value

    async def open_text(self, text: str, *, strict: bool = True) -> str:
        m = _SEALED_TEXT.match(text)
        if m is None:
            return text
        keys = await self.key(m.group(1))
        if keys is None:
            if strict:
                raise PayloadUnavailableError(f"text sealed under {m.group(1)}", missing_key_reason(m.group(1)))
            return text
        return keys.unseal(base64.b64decode(m.group(2))).decode("utf-8")


def missing_key_reason(kid: str) -> str:
    """Why content sealed under ``kid`` cannot be opened (every reader that needs the key says so)."""
    return f"the key {kid} is not in the key store (the run was erased, or this role may not read it)"


def _loads(data: bytes) -> Any:
    return read_back(json.loads(data), data)


async def run_protector(
    client: LedgerClient,
    agent: str,
    run_id: str,
    policy: DataPolicy,
    *,
    resolver: SecretResolver | None = None,
    keystore: KeyStore | None = None,
    worker: bool = False,
    known: RunKeys | None = None,
    digests: bool = False,
) -> PayloadProtector:
    """The protector of one run, with its keys created (first start) or fetched (resume); ``worker``:
    a run a worker writes (a branch), whose keys live under the workers' prefix. ``known``: the
    run's keys as the caller read them a moment ago (a resume from its snapshot), used instead of
    reading them again when they are the run's. ``digests``: the run's digests are keyed (it records
    digest scheme 2), so its keys are fetched whatever the policy says of sealing.

    Raises KeyStoreError for a run whose keys were destroyed (erased runs are not continued)."""
    keys: RunKeys | None = None
    if policy.encrypt or policy.capture != "full" or digests:
        kid = run_kid(agent, run_id, worker=worker)
        keys = known if known is not None and known.kid == kid else None
        if keys is None:
            keys = await (keystore or KVKeyStore(client.js)).create(kid)
    return PayloadProtector(policy, keys, BlobStore(client), resolver)


def client_opener(client: LedgerClient) -> PayloadOpener:
    """A lenient-or-strict reader of content for this connection (KV key store, object store)."""
    return PayloadOpener(KVKeyStore(client.js), BlobStore(client))
