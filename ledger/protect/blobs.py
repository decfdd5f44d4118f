"""Payloads by reference: large bodies in the object store LEDGER_BLOBS, named by their sha256.

An event field whose value is larger than the run's threshold carries a reference
instead of the value::

    {"$ref": "blob", "sha256": "<hex of the stored bytes>", "size": <stored bytes>,
     "media_type": "application/json", "enc": "A256GCM", "kid": "<agent>.<run_id>"}

(``enc``/``kid`` only when the body is sealed under the run's data key; the stored bytes
are then the ciphertext, so the name reveals nothing about the content.) The body is
the canonical JSON of the field's value. Readers fetch it on demand and verify the
hash before using it; a checkpoint keeps the reference, so its size is bounded
whatever the agent reads.

The object store is addressed by name, not content (identical bodies under two names are
stored twice), so objects are named by their sha256 and put only when absent: two identical bodies are stored once and a
retried put is a no-op. ``fetch`` reads a blob as the object store lays it out: its metadata by
one direct get, then its chunks by batch direct gets (``runledger.log.reader.read_raw`` on the
blob stream), not through nats-py's ``get``, which looks up the stream, creates an ordered push
consumer and hands each chunk to a worker thread (a snapshot's journal, a replayed step's large
output). A direct get creates nothing on the server, which is all a role but the admin may do
there: a role that may create a consumer chooses where it delivers (runledger.protect.roles).
Only a blob not stored the usual way (a link, an odd chunk name; runledger never writes one) and
the in-memory ledger's go through nats-py's ``get``, which streams chunks into a temporary file
(``get(name, writeinto=...)``: ``get()`` into memory is quadratic in the size). Either way the
bytes are checked against the name (sha256) before they are returned.

``nats`` is imported inside ``BlobStore``'s methods: ``runledger.protect.capture`` needs this module's
references but not the store, and the sandbox guest imports capture without a NATS client.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import re
import tempfile
from typing import TYPE_CHECKING, Any

from runledger.errors import BlobCorruptError, BlobError, BlobMissingError, LedgerError
from runledger.log.subjects import BLOB_BUCKET

if TYPE_CHECKING:
    from runledger.log.client import LedgerClient

logger = logging.getLogger(__name__)
MEDIA_JSON = "application/json"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NUID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_BLOB_STREAM = f"OBJ_{BLOB_BUCKET}"  # nats.js.object_store.OBJ_STREAM_TEMPLATE


def is_blob_ref(value: Any) -> bool:
    """True for a reference written by this module (exact shape, so user data is rarely mistaken)."""
    return (
        isinstance(value, dict)
        and value.get("$ref") == "blob"
        and isinstance(value.get("sha256"), str)
        and bool(_HEX64.match(value["sha256"]))
        and isinstance(value.get("size"), int)
    )


def blob_ref(data: bytes, media_type: str = MEDIA_JSON, **extra: Any) -> dict[str, Any]:
    return {"$ref": "blob", "sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "media_type": media_type} | {
        k: v for k, v in extra.items() if v is not None
    }


class BlobStore:
    """Put and fetch bodies by sha256 in LEDGER_BLOBS."""

    def __init__(self, client: LedgerClient) -> None:
        self._client = client
        self._store: Any = None

    async def _os(self) -> Any:
        from nats.js.errors import BucketNotFoundError, NotFoundError

        if self._store is None:
            try:
                self._store = await self._client.js.object_store(BLOB_BUCKET)
            except (BucketNotFoundError, NotFoundError) as exc:
                raise BlobError(f"the object store {BLOB_BUCKET} does not exist: run `runledger up`") from exc
        return self._store

    async def put(self, data: bytes, media_type: str = MEDIA_JSON, **extra: Any) -> dict[str, Any]:
        """Store ``data`` under its sha256 unless already there; return the reference."""
        import nats

        ref = blob_ref(data, media_type, **extra)
        store = await self._os()
        if not await self.exists(ref["sha256"]):
            try:
                await store.put(ref["sha256"], data)
            except (TimeoutError, nats.errors.Error) as exc:
                raise BlobError(f"could not store blob {ref['sha256']} ({type(exc).__name__}: {exc})") from exc
        return ref

    async def exists(self, sha256: str) -> bool:
        from nats.js.errors import NotFoundError, ObjectNotFoundError

        store = await self._os()
        try:
            info = await store.get_info(sha256)
        except (ObjectNotFoundError, NotFoundError):
            return False
        return not getattr(info, "deleted", False)

    async def fetch(self, ref: dict[str, Any]) -> bytes:
        """The stored bytes of ``ref``, hash-verified. Raises BlobMissingError or BlobCorruptError."""
        sha = ref["sha256"]
        data = await self._read_direct(sha)
        return data if data is not None else await self._read_through_store(sha)

    async def _read_direct(self, sha: str) -> bytes | None:
        """The bytes of blob ``sha`` read as the object store lays them out: its metadata (one direct
        get), then its chunks by batch direct gets. Raises BlobCorruptError when they are not the
        bytes ``sha`` names.

        None when the blob is not stored the usual way (no metadata, a delete marker, a link, an odd
        chunk name) or could not be read so: ``_read_through_store`` decides then."""
        import nats.errors
        from nats.js.object_store import OBJ_CHUNKS_PRE_TEMPLATE, OBJ_META_PRE_TEMPLATE

        from runledger.log.reader import read_raw

        name = base64.urlsafe_b64encode(sha.encode()).decode()
        meta_subject = OBJ_META_PRE_TEMPLATE.format(bucket=BLOB_BUCKET, obj=name)
        try:
            meta = await self._client.js.get_last_msg(_BLOB_STREAM, meta_subject, direct=True)
            info = json.loads(meta.data or b"")
        except (TimeoutError, nats.errors.Error, ValueError):
            return None
        nuid = info.get("nuid") if isinstance(info, dict) else None
        options = info.get("options") if isinstance(info, dict) else None
        if (
            not isinstance(nuid, str) or not _NUID.match(nuid) or info.get("deleted")
            or (isinstance(options, dict) and options.get("link"))
        ):  # fmt: skip
            return None
        chunk_subject = OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=BLOB_BUCKET, obj=nuid)
        try:
            chunks = await read_raw(self._client, chunk_subject, stream=_BLOB_STREAM)
        except LedgerError:  # a refused or incomplete read
            return None
        data = b"".join(chunk.data for chunk in chunks)
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha:
            raise BlobCorruptError(sha, actual)
        return data

    async def _read_through_store(self, sha: str) -> bytes:
        """nats-py's read of blob ``sha`` (any layout it knows), and the body behind a delete marker
        whose chunks were never purged; hash-verified."""
        import nats.js.errors
        from nats.js.errors import NotFoundError, ObjectNotFoundError

        store = await self._os()
        with tempfile.TemporaryFile() as f:
            try:
                await store.get(sha, writeinto=f)
            except (ObjectNotFoundError, NotFoundError) as exc:
                behind = await self._behind_a_delete_marker(sha)
                if behind is None:
                    raise BlobMissingError(sha) from exc
                f.write(behind)
            except nats.js.errors.DigestMismatchError as exc:
                raise BlobCorruptError(sha, "a chunk digest mismatch") from exc
            f.seek(0)
            data = f.read()
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha:
            raise BlobCorruptError(sha, actual)
        return data

    async def _behind_a_delete_marker(self, sha: str) -> bytes | None:
        """The body of ``sha`` when its metadata says deleted but its chunks are still stored.

        Whoever may store blobs may also write a delete marker (the object store's metadata subject
        is the same for a put and a delete), but only an erasure (an operator) may purge the chunks:
        a marker whose chunks remain deletes nothing. The marker keeps the chunks' nuid; the body is
        read and checked against its name (a blob is named by its sha256), so nothing else passes."""
        chunks = await self._unpurged_chunks(sha)
        if chunks is None:
            return None  # no marker, or its chunks were purged: erased
        from runledger.log.reader import read_raw

        subject, count = chunks
        parts = await read_raw(self._client, subject, stream=_BLOB_STREAM)
        if len(parts) < count:
            return None
        data = b"".join(part.data for part in parts)
        if hashlib.sha256(data).hexdigest() != sha:
            return None
        logger.warning("blob %s has a delete marker but its chunks were never purged: read anyway", sha)
        return data

    async def delete(self, sha256: str) -> bool:
        """Delete the blob: its delete marker and the purge of its chunks (an erasure's). A marker
        already there (anyone who stores blobs may write one) does not stop the purge."""
        from nats.js.errors import NotFoundError, ObjectNotFoundError

        store = await self._os()
        with contextlib.suppress(ObjectNotFoundError, NotFoundError):
            await store.delete(sha256)
            return True
        chunks = await self._unpurged_chunks(sha256)
        if chunks is None:
            return False
        await self._client.js.purge_stream(f"OBJ_{BLOB_BUCKET}", subject=chunks[0])
        return True

    async def _unpurged_chunks(self, sha: str) -> tuple[str, int] | None:
        """The subject and count of the chunks a delete marker of ``sha`` left unpurged; None when there are none."""
        from nats.js.errors import NotFoundError, ObjectNotFoundError

        store = await self._os()
        try:
            info = await store.get_info(sha, show_deleted=True)
        except (ObjectNotFoundError, NotFoundError):
            return None
        if not getattr(info, "deleted", False) or not info.nuid:
            return None
        subject = f"$O.{BLOB_BUCKET}.C.{info.nuid}"
        stream_info = await self._client.js.stream_info(f"OBJ_{BLOB_BUCKET}", subjects_filter=subject)
        count = sum((stream_info.state.subjects or {}).values())
        return (subject, count) if count else None
