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
retried put is a no-op. Reads stream chunks into a temporary file
(``get(name, writeinto=...)``): ``get()`` into memory is quadratic in the size.

``nats`` is imported inside ``BlobStore``'s methods: ``runledger.protect.capture`` needs this module's
references but not the store, and the sandbox guest imports capture without a NATS client.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import tempfile
from typing import TYPE_CHECKING, Any

from runledger.errors import BlobCorruptError, BlobError, BlobMissingError
from runledger.log.subjects import BLOB_BUCKET

if TYPE_CHECKING:
    from runledger.log.client import LedgerClient

logger = logging.getLogger(__name__)
MEDIA_JSON = "application/json"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


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
        import nats.js.errors
        from nats.js.errors import NotFoundError, ObjectNotFoundError

        sha = ref["sha256"]
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
        subject, count = chunks
        sub = await self._client.js.subscribe(subject, ordered_consumer=True)
        try:
            parts = [(await sub.next_msg(timeout=10)).data for _ in range(count)]
        finally:
            await sub.unsubscribe()
        data = b"".join(parts)
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
