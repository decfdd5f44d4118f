"""Per-run keys, kept apart from the log: the data key that seals payloads and the token key of redaction.

Each run has a ``RunKeys`` record, ``kid = <agent>.<run_id>``: a 256-bit AES-GCM *data key*
that seals the run's content fields (``runledger.protect.capture``) and a 256-bit *token key* under
which redaction tokens are computed (the same value gives the same token across a
resume). The record lives in the JetStream KV bucket ``LEDGER_KEYS``, never in the
``LEDGER`` stream: the stream is immutable (deny_delete, deny_purge) and keeps
ciphertext; the key store is the one place where deleting something is allowed, so
erasing a run is deleting its key (``runledger.protect.erasure``). The hash chain is over the
ciphertext, so it still verifies after erasure.

Why a KV bucket and not a file store: the agents, the projector, the sandbox workers and
the operator CLI run on different machines and must all find a run's key, and the NATS
account already gives the bucket its own permissions (``$KV.LEDGER_KEYS.<agent>.>`` per
agent: an agent creates and reads only its own runs' keys; only the operator role may
delete). Why AES-GCM (the ``cryptography`` package): authenticated, so a payload that was
tampered with or sealed under another run's key fails to open instead of decrypting to
garbage; the run's kid is bound in as associated data.

The keys sit in the KV bucket in the clear, protected by NATS permissions and the
server's disk. Wrapping them under a master key (KMS, a file on the operator's machine)
is the next step up and would change only this module.

``cryptography`` and ``nats`` are imported where they are used: ``runledger.protect.capture`` imports
this module, and the sandbox guest, which imports capture, seals nothing and has no NATS.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from runledger.errors import KeyStoreError
from runledger.log.subjects import KEY_BUCKET, KEY_STREAM

if TYPE_CHECKING:
    import nats.js.kv
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from nats.js import JetStreamContext

ALG = "A256GCM"
_NONCE = 12
DELETE_DENIED = 10057


def run_kid(agent: str, run_id: str) -> str:
    """The key id of a run: also its KV key, so permissions can scope an agent to its own."""
    return f"{agent}.{run_id}"


@dataclass(frozen=True)
class RunKeys:
    kid: str
    data_key: bytes
    token_key: bytes
    _aead: AESGCM | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def generate(cls, kid: str) -> RunKeys:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        return cls(kid, AESGCM.generate_key(bit_length=256), os.urandom(32))

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "v": 1,
                "kid": self.kid,
                "alg": ALG,
                "data_key": base64.b64encode(self.data_key).decode(),
                "token_key": base64.b64encode(self.token_key).decode(),
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> RunKeys:
        try:
            d = json.loads(data)
            return cls(d["kid"], base64.b64decode(d["data_key"]), base64.b64decode(d["token_key"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise KeyStoreError(f"a key record in {KEY_BUCKET} is corrupt: {exc}") from exc

    def seal(self, plaintext: bytes) -> bytes:
        """nonce || AES-256-GCM(plaintext), with the kid as associated data."""
        nonce = os.urandom(_NONCE)
        return nonce + self._cipher().encrypt(nonce, plaintext, self.kid.encode())

    def _cipher(self) -> AESGCM:
        # One AESGCM per run's keys (it was built per sealed value: a third of seal's time). It holds
        # nothing the data key does not; it lives and dies with this object.
        aead = self._aead
        if aead is None:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            aead = AESGCM(self.data_key)
            object.__setattr__(self, "_aead", aead)
        return aead

    def unseal(self, sealed: bytes) -> bytes:
        """The plaintext of ``seal``; raises KeyStoreError when it was altered or sealed under another key."""
        from cryptography.exceptions import InvalidTag

        try:
            return self._cipher().decrypt(sealed[:_NONCE], sealed[_NONCE:], self.kid.encode())
        except (InvalidTag, ValueError) as exc:
            raise KeyStoreError(f"a payload sealed under {self.kid} fails authentication (altered?)") from exc


class KeyStore(Protocol):
    """Where run keys live. ``get`` returns None for a key that never existed or was destroyed."""

    async def create(self, kid: str) -> RunKeys: ...

    async def get(self, kid: str) -> RunKeys | None: ...

    async def destroy(self, kid: str) -> bool: ...


class MemoryKeyStore:
    """The in-memory reference implementation (unit tests)."""

    def __init__(self) -> None:
        self.keys: dict[str, RunKeys] = {}
        self.destroyed: set[str] = set()

    async def create(self, kid: str) -> RunKeys:
        if kid in self.destroyed:
            raise KeyStoreError(f"the keys of {kid} were destroyed (the run was erased)")
        return self.keys.setdefault(kid, RunKeys.generate(kid))

    async def get(self, kid: str) -> RunKeys | None:
        return self.keys.get(kid)

    async def destroy(self, kid: str) -> bool:
        self.destroyed.add(kid)
        return self.keys.pop(kid, None) is not None


class KVKeyStore:
    """Run keys in the JetStream KV bucket LEDGER_KEYS (history 1)."""

    def __init__(self, js: JetStreamContext) -> None:
        self._js = js
        self._kv: object | None = None

    async def _bucket(self) -> nats.js.kv.KeyValue:
        import nats
        from nats.js.errors import BucketNotFoundError, NotFoundError

        if self._kv is None:
            try:
                self._kv = await self._js.key_value(KEY_BUCKET)
            except (BucketNotFoundError, NotFoundError) as exc:
                raise KeyStoreError(f"the key store {KEY_BUCKET} does not exist: run `runledger up`") from exc
            except (TimeoutError, nats.errors.Error) as exc:
                raise KeyStoreError(f"the key store {KEY_BUCKET} is not reachable ({type(exc).__name__})") from exc
        return self._kv  # type: ignore[return-value]

    async def create(self, kid: str) -> RunKeys:
        """The run's keys, created on first use (atomic: two racing creators get the same keys).

        Refuses to re-create the keys of an erased run (its purge marker is the last entry)."""
        import nats
        from nats.js.errors import KeyWrongLastSequenceError

        from runledger.log.publish import retrying

        kv = await self._bucket()
        keys = RunKeys.generate(kid)
        try:
            # update(last=0), not create(): create() re-creates a deleted key, and an erased
            # run's key must stay gone (its purge marker keeps the subject non-empty). Retried
            # across a leader election: a retry after a lost ack meets our own keys (below).
            await retrying(lambda: kv.update(kid, keys.to_bytes(), last=0))
            return keys
        except KeyWrongLastSequenceError:
            pass
        except (TimeoutError, nats.errors.Error) as exc:
            raise KeyStoreError(f"cannot create the keys of {kid} ({type(exc).__name__})") from exc
        existing = await self.get(kid)
        if existing is None:
            raise KeyStoreError(f"the keys of {kid} were destroyed (the run was erased)")
        return existing

    async def get(self, kid: str) -> RunKeys | None:
        import nats
        from nats.js.errors import KeyNotFoundError

        from runledger.log.publish import retrying

        kv = await self._bucket()
        try:
            entry = await retrying(lambda: kv.get(kid))
        except KeyNotFoundError:
            return None
        except (TimeoutError, nats.errors.Error) as exc:
            raise KeyStoreError(f"cannot read the keys of {kid} ({type(exc).__name__})") from exc
        return None if entry.value is None else RunKeys.from_bytes(entry.value)

    async def destroy(self, kid: str) -> bool:
        """Securely delete every stored revision of the key, then leave a purge marker.

        ``STREAM.MSG.DELETE`` without ``no_erase`` overwrites the message on disk, so the key
        bytes do not linger in the store's block files."""
        from nats.js.errors import APIError, KeyNotFoundError

        kv = await self._bucket()
        existed = False
        while True:
            try:
                entry = await kv.get(kid)
            except KeyNotFoundError:
                break
            existed = True
            assert entry.revision is not None
            try:
                await self._js.delete_msg(KEY_STREAM, entry.revision)
            except APIError as exc:
                if exc.err_code != DELETE_DENIED:
                    raise KeyStoreError(f"cannot delete the keys of {kid}: {exc.description}") from exc
                break  # a bucket made with deny_delete: the purge below removes it, without overwriting
        with contextlib.suppress(KeyNotFoundError):
            await kv.purge(kid)
        return existed
