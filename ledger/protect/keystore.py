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

**Keys at rest are wrapped.** The bucket holds each run's keys encrypted (AES-256-GCM, the
kid as associated data) under a *master key* that is never in NATS (format v2:
``{"v": 2, "kid", "alg", "mk": <master key id>, "wrapped": base64}``). Whoever can read the
bucket (a role, a stolen disk or backup of the server) gets nothing that opens content. The
master key comes from, in this order (``master_key()``):

1. ``$RUNLEDGER_KMS``: a KMS, named by an entry point of the group ``runledger.kms`` or as
   ``module:attribute``; it is called without arguments and returns a ``KeyWrapper``
   (``key_id``, ``wrap``, ``unwrap``): the hook for a cloud KMS or an HSM;
2. ``$RUNLEDGER_MASTER_KEY``: the key itself, base64 of 32 bytes;
3. ``$RUNLEDGER_MASTER_KEY_FILE``, else ``<home>/master.key``: a file holding that text, which
   ``runledger up`` creates (mode 0600, its directory 0700; ``ensure_master_key``).

Nothing is ever created on the way: a process without a master key is told where it looked
and what to do (``MasterKeyMissingError``); one with another master key than the record was
wrapped under is told both key ids (``WrongMasterKeyError``: the id, a digest, names the key
without revealing it) instead of reading garbage. Neither is a ``KeyStoreError``, which readers
take for "no key" and answer by showing content sealed: a misconfigured process must be told.
``destroy`` (erasure) needs no master key.

Who holds the master key is the second half of the role table: the processes that open
content, i.e. agents (NATS permissions still let an agent read only its own runs' wrapped
keys), operators, sandbox workers and any projector that is to see content. Analysts do not
get it: they read structure and the projections. A master key file readable by others is
used with a warning. Records written before wrapping (format v1: the keys in the clear) are
still read, with one warning per process naming the first such run; ``wrap_unwrapped``
re-wraps them in place.

Rejected: a master key stored in NATS (a second bucket, a stream message): whoever reads the
server's disk or backups would get both halves. Deriving run keys from the master key (HKDF
of the kid): erasure by deleting a key would then be impossible, since anyone with the master
key could derive an erased run's key again.

``cryptography`` and ``nats`` are imported where they are used: ``runledger.protect.capture`` imports
this module, and the sandbox guest, which imports capture, seals nothing and has no NATS.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import importlib
import json
import logging
import os
import tempfile
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from runledger.errors import KeyStoreError, MasterKeyError, MasterKeyMissingError, WrongMasterKeyError
from runledger.log.private import FILE_MODE, private_dir
from runledger.log.server import runledger_home
from runledger.log.subjects import KEY_BUCKET, KEY_STREAM

if TYPE_CHECKING:
    import nats.js.kv
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from nats.js import JetStreamContext

log = logging.getLogger(__name__)

ALG = "A256GCM"
_NONCE = 12
DELETE_DENIED = 10057

ENV_KMS = "RUNLEDGER_KMS"
ENV_MASTER_KEY = "RUNLEDGER_MASTER_KEY"
ENV_MASTER_KEY_FILE = "RUNLEDGER_MASTER_KEY_FILE"
KMS_ENTRY_POINTS = "runledger.kms"
MASTER_KEY_FILE = "master.key"
RECORD_VERSION = 2
_KEY_BYTES = 32
# Domain separation: a wrapped run key can only be unwrapped as the run key of the same kid.
_WRAP_AAD = b"runledger.run-keys.v2:"
_warned_unwrapped = False
_MAKE_ONE = (
    "`runledger up` makes one (<home>/master.key), or: "
    'python -c "import os, base64; print(base64.b64encode(os.urandom(32)).decode())"'
)


# The KV keys of runs a worker writes (re-runs' branches) start with a token no agent name can be
# ("=" is not in a name: runledger.record.ids), so a worker may create and erase only those.
WORKER_KID_PREFIX = "=w"


def key_read_subject(kid: str) -> str:
    """The API subject a read of run ``kid``'s keys goes to (the bucket allows direct gets)."""
    return f"$JS.API.DIRECT.GET.{KEY_STREAM}.$KV.{KEY_BUCKET}.{kid}"


# The HKDF info of a run's digest key (RunKeys.digest_key).
DIGEST_KEY_INFO = b"runledger digest key"


def run_kid(agent: str, run_id: str, *, worker: bool = False) -> str:
    """The key id of a run: also its KV key, so permissions can scope an agent to its own (and a
    worker to the branches it writes: ``=w.<agent>.<run_id>``)."""
    return f"{WORKER_KID_PREFIX}.{agent}.{run_id}" if worker else f"{agent}.{run_id}"


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
        """The keys in the clear (format v1): what the bucket held before wrapping; never stored now."""
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

    @property
    def digest_key(self) -> bytes:
        """The key of the run's keyed digests (``runledger.record.digests``, scheme 2): HKDF-SHA256-Expand
        of the data key (the pseudorandom key) with info ``runledger digest key``, 32 bytes, which is
        ``HMAC-SHA256(data_key, b"runledger digest key" + b"\\x01")``. Derived, never stored: it is gone
        with the data key (docs/wire.md, "Digests of content")."""
        return hmac.new(self.data_key, DIGEST_KEY_INFO + b"\x01", hashlib.sha256).digest()

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


# -- the master key ------------------------------------------------------------------------------------


class KeyWrapper(Protocol):
    """Wraps run keys under a master key kept outside NATS: ``LocalMasterKey``, or a KMS (``$RUNLEDGER_KMS``).

    ``key_id`` names the master key without revealing it; it is stored with every wrapped key.
    ``unwrap`` gets the ``key_id`` the record names (a KMS may hold several keys, e.g. across a
    rotation) and raises MasterKeyError (WrongMasterKeyError for a key it does not hold), or
    KeyStoreError when the wrapped bytes fail authentication (the record was altered)."""

    @property
    def key_id(self) -> str: ...

    async def wrap(self, kid: str, secret: bytes) -> bytes: ...

    async def unwrap(self, kid: str, key_id: str, wrapped: bytes) -> bytes: ...


class LocalMasterKey:
    """A 256-bit master key held by this process (from the environment or a file): AES-256-GCM key wrap."""

    def __init__(self, key: bytes, source: str = "a key given in code") -> None:
        if len(key) != _KEY_BYTES:
            raise MasterKeyError(f"the master key from {source} has {len(key)} bytes, not {_KEY_BYTES}; {_MAKE_ONE}")
        self._key = key
        self.source = source
        self.key_id = "local:" + hashlib.sha256(b"runledger master key id\0" + key).hexdigest()[:16]
        self._aead: AESGCM | None = None

    def __repr__(self) -> str:
        return f"LocalMasterKey({self.key_id}, from {self.source})"

    @classmethod
    def generate(cls, source: str = "a new key") -> LocalMasterKey:
        return cls(os.urandom(_KEY_BYTES), source)

    @classmethod
    def from_text(cls, text: str, source: str) -> LocalMasterKey:
        """The key of ``to_text`` (base64, standard or URL-safe alphabet, surrounding blanks ignored)."""
        cleaned = text.strip()
        try:
            key = base64.b64decode(cleaned.replace("-", "+").replace("_", "/"), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise MasterKeyError(
                f"the master key from {source} is not base64 of {_KEY_BYTES} bytes; {_MAKE_ONE}"
            ) from exc
        return cls(key, source)

    def to_text(self) -> str:
        return base64.b64encode(self._key).decode("ascii")

    def _cipher(self) -> AESGCM:
        if self._aead is None:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            self._aead = AESGCM(self._key)
        return self._aead

    async def wrap(self, kid: str, secret: bytes) -> bytes:
        nonce = os.urandom(_NONCE)
        return nonce + self._cipher().encrypt(nonce, secret, _WRAP_AAD + kid.encode())

    async def unwrap(self, kid: str, key_id: str, wrapped: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag

        if key_id != self.key_id:
            raise WrongMasterKeyError(kid, key_id, f"{self.key_id} (from {self.source})")
        try:
            return self._cipher().decrypt(wrapped[:_NONCE], wrapped[_NONCE:], _WRAP_AAD + kid.encode())
        except (InvalidTag, ValueError) as exc:
            raise KeyStoreError(
                f"the wrapped keys of {kid} fail authentication under master key {self.key_id} "
                "(the record was altered, or copied from another run)"
            ) from exc


def master_key_path(home: Path | None = None) -> Path:
    """Where the local master key file is: ``$RUNLEDGER_MASTER_KEY_FILE``, else ``<home>/master.key``."""
    named = os.environ.get(ENV_MASTER_KEY_FILE)
    return Path(named) if named else (home or runledger_home()) / MASTER_KEY_FILE


def master_key(environ: Mapping[str, str] | None = None) -> KeyWrapper:
    """This process's master key (see the module docstring for the order). Creates nothing.

    Raises MasterKeyMissingError when none is configured, MasterKeyError when one is malformed."""
    env = os.environ if environ is None else environ
    kms = env.get(ENV_KMS)
    if kms:
        return _load_kms(kms)
    text = env.get(ENV_MASTER_KEY)
    if text:
        return LocalMasterKey.from_text(text, f"${ENV_MASTER_KEY}")
    named = env.get(ENV_MASTER_KEY_FILE)
    path = Path(named) if named else runledger_home() / MASTER_KEY_FILE  # as master_key_path(), for ``environ``
    try:
        return read_master_key_file(path)
    except FileNotFoundError:
        raise MasterKeyMissingError(f"${ENV_KMS}, ${ENV_MASTER_KEY}, ${ENV_MASTER_KEY_FILE} and {path}") from None


def read_master_key_file(path: Path) -> LocalMasterKey:
    """The key in ``path``. Raises FileNotFoundError, MasterKeyError (unreadable or malformed)."""
    try:
        with open(path) as f:
            mode = os.fstat(f.fileno()).st_mode
            text = f.read()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise MasterKeyError(f"cannot read the master key file {path}: {exc.strerror or exc}") from exc
    if mode & 0o077:
        log.warning("the master key file %s is readable by others (mode %o): chmod 600 %s", path, mode & 0o777, path)
    return LocalMasterKey.from_text(text, str(path))


@dataclass(frozen=True)
class MasterKeySource:
    """Which master key a process uses: ``where`` it comes from, its ``key_id``, and whether it was just ``created``."""

    where: str
    key_id: str
    created: bool = False


def ensure_master_key(home: Path | None = None) -> MasterKeySource:
    """The master key of a ledger's machine, created when none is configured (``runledger up``).

    A KMS or ``$RUNLEDGER_MASTER_KEY`` is used as is; otherwise the key file
    (``$RUNLEDGER_MASTER_KEY_FILE``, else ``<home>/master.key``) is created if missing: mode
    0600 in a 0700 directory, written whole before it appears (never clobbers one made meanwhile)."""
    if os.environ.get(ENV_KMS):
        wrapper = master_key()
        return MasterKeySource(f"the KMS ${ENV_KMS}={os.environ[ENV_KMS]}", wrapper.key_id)
    if os.environ.get(ENV_MASTER_KEY):
        return MasterKeySource(f"${ENV_MASTER_KEY}", master_key().key_id)
    path = master_key_path(home)
    try:
        return MasterKeySource(str(path), read_master_key_file(path).key_id)
    except FileNotFoundError:
        pass
    private_dir(path.parent)
    key = LocalMasterKey.generate(str(path))
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "w") as f:
            f.write(key.to_text() + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # atomic and never replaces: a racing `up` keeps the first key
        except FileExistsError:
            return MasterKeySource(str(path), read_master_key_file(path).key_id)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return MasterKeySource(str(path), key.key_id, created=True)


def _load_kms(name: str) -> KeyWrapper:
    try:
        if ":" in name:
            module, _, attr = name.partition(":")
            factory: Any = getattr(importlib.import_module(module), attr)
        else:
            found = {ep.name: ep for ep in entry_points(group=KMS_ENTRY_POINTS)}
            if name not in found:
                known = ", ".join(sorted(found)) or "none installed"
                raise MasterKeyError(
                    f"${ENV_KMS}={name!r} names no KMS: entry points of group {KMS_ENTRY_POINTS} are {known} "
                    "(or give module:attribute)"
                )
            factory = found[name].load()
        wrapper: KeyWrapper = factory()
    except MasterKeyError:
        raise
    except Exception as exc:  # a third party's import or constructor: say which KMS failed, and why
        raise MasterKeyError(f"the KMS ${ENV_KMS}={name!r} cannot be loaded: {type(exc).__name__}: {exc}") from exc
    return wrapper


async def wrap_keys(wrapper: KeyWrapper, keys: RunKeys) -> bytes:
    """The bucket record of ``keys`` (format v2): the keys wrapped under the master key."""
    wrapped = await wrapper.wrap(keys.kid, keys.data_key + keys.token_key)
    record = {
        "v": RECORD_VERSION,
        "kid": keys.kid,
        "alg": ALG,
        "mk": wrapper.key_id,
        "wrapped": base64.b64encode(wrapped).decode("ascii"),
    }
    return json.dumps(record, sort_keys=True).encode()


async def unwrap_keys(kid: str, data: bytes, master: Callable[[], KeyWrapper] = master_key) -> RunKeys:
    """The keys in a bucket record: v2 unwrapped under ``master()`` (called only then), v1 as is.

    Raises KeyStoreError (corrupt, altered, of another kid, or too new), MasterKeyError."""
    try:
        d = json.loads(data)
        version = d.get("v", 1) if isinstance(d, dict) else None
    except ValueError as exc:
        raise KeyStoreError(f"the key record of {kid} in {KEY_BUCKET} is corrupt: {exc}") from exc
    if version == 1:
        _warn_unwrapped(kid)
        return RunKeys.from_bytes(data)
    if version != RECORD_VERSION:
        raise KeyStoreError(
            f"the key record of {kid} has format {version!r}; this runledger reads 1 and {RECORD_VERSION}: upgrade it"
        )
    try:
        if d["kid"] != kid:
            raise KeyStoreError(f"the key record stored under {kid} is the record of {d['kid']} (copied?)")
        key_id, wrapped = str(d["mk"]), base64.b64decode(d["wrapped"], validate=True)
    except (KeyError, TypeError, binascii.Error) as exc:
        raise KeyStoreError(f"the key record of {kid} in {KEY_BUCKET} is corrupt: {exc!r}") from exc
    secret = await master().unwrap(kid, key_id, wrapped)
    if len(secret) != 2 * _KEY_BYTES:
        raise KeyStoreError(f"the unwrapped keys of {kid} have {len(secret)} bytes, not {2 * _KEY_BYTES}")
    return RunKeys(kid, secret[:_KEY_BYTES], secret[_KEY_BYTES:])


def _warn_unwrapped(kid: str) -> None:
    global _warned_unwrapped
    if not _warned_unwrapped:
        _warned_unwrapped = True
        log.warning(
            "the keys of %s (and maybe other runs) are stored unwrapped, as runledger did before master keys: "
            "they are read as they are; KVKeyStore.wrap_unwrapped() wraps them under the master key",
            kid,
        )


# -- the stores ----------------------------------------------------------------------------------------


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


# The bucket's handle per JetStream context: ``key_value`` is a stream-info request (a round trip and
# ~0.3 ms of parsing), and every run's start makes a store (runledger.protect.capture.run_protector).
# The handle holds names only (bucket, stream, subject prefix, direct gets), none of the bucket's state.
_BUCKETS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


class KVKeyStore:
    """Run keys in the JetStream KV bucket LEDGER_KEYS (history 1), wrapped under the master key.

    ``wrapper`` is the master key; None finds it (``master_key()``) when a key is first wrapped
    or unwrapped, so a store that only destroys keys (erasure) needs none."""

    def __init__(self, js: JetStreamContext, wrapper: KeyWrapper | None = None) -> None:
        self._js = js
        self._kv: object | None = None
        self._wrapper = wrapper

    def _master(self) -> KeyWrapper:
        if self._wrapper is None:
            self._wrapper = master_key()
        return self._wrapper

    async def _bucket(self) -> nats.js.kv.KeyValue:
        import nats
        from nats.js.errors import BucketNotFoundError, NotFoundError

        if self._kv is None:
            with contextlib.suppress(TypeError):  # (a stand-in that cannot be weakly referenced)
                self._kv = _BUCKETS.get(self._js)
        if self._kv is None:
            try:
                self._kv = kv = await self._js.key_value(KEY_BUCKET)
            except (BucketNotFoundError, NotFoundError) as exc:
                raise KeyStoreError(f"the key store {KEY_BUCKET} does not exist: run `runledger up`") from exc
            except (TimeoutError, nats.errors.Error) as exc:
                raise KeyStoreError(f"the key store {KEY_BUCKET} is not reachable ({type(exc).__name__})") from exc
            with contextlib.suppress(TypeError):
                _BUCKETS[self._js] = kv
        return self._kv  # type: ignore[return-value]

    async def create(self, kid: str) -> RunKeys:
        """The run's keys, created on first use (atomic: two racing creators get the same keys).

        Refuses to re-create the keys of an erased run (its purge marker is the last entry)."""
        import nats
        from nats.js.errors import KeyWrongLastSequenceError

        from runledger.log.permissions import refused_at_once
        from runledger.log.publish import retrying

        keys = RunKeys.generate(kid)
        record = await wrap_keys(self._master(), keys)  # before anything is written: no master key, no keys
        kv = await self._bucket()
        try:
            # update(last=0), not create(): create() re-creates a deleted key, and an erased
            # run's key must stay gone (its purge marker keeps the subject non-empty). Retried
            # across a leader election: a retry after a lost ack meets our own keys (below). A
            # permission denial (another agent's keys) fails at once, naming who may create them.
            await refused_at_once(self._js, f"$KV.{KEY_BUCKET}.{kid}", retrying(lambda: kv.update(kid, record, last=0)))
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

        from runledger.errors import PermissionDeniedError
        from runledger.log.permissions import refused_at_once
        from runledger.log.publish import retrying

        kv = await self._bucket()
        try:
            # A login that may not read run keys (an analyst without the content grant) is refused at
            # once, not after the retries' deadline: its readers show content sealed (KeyStoreError).
            entry = await refused_at_once(self._js, key_read_subject(kid), retrying(lambda: kv.get(kid)))
        except KeyNotFoundError:
            return None
        except PermissionDeniedError as exc:
            raise KeyStoreError(f"this login may not read the keys of {kid} ({exc.who})") from exc
        except (TimeoutError, nats.errors.Error) as exc:
            raise KeyStoreError(f"cannot read the keys of {kid} ({type(exc).__name__})") from exc
        if entry.value is None:
            return None
        # The master key is looked up only now: a v1 record needs none, a missing run none either.
        return await unwrap_keys(kid, entry.value, self._master)

    async def wrap_unwrapped(self) -> int:
        """Wrap every key record still in the clear (format v1) under the master key, in place.

        Each is replaced by compare-and-set (a record erased meanwhile stays erased); the old
        revision is then securely deleted where the bucket allows it. Returns how many were wrapped."""
        import nats
        from nats.js.errors import APIError, KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError

        kv = await self._bucket()
        wrapper = self._master()
        try:
            kids = await kv.keys()
        except NoKeysError:
            return 0
        wrapped = 0
        for kid in kids:
            try:
                entry = await kv.get(kid)
            except KeyNotFoundError:
                continue
            if entry.value is None or json.loads(entry.value).get("v", 1) != 1:
                continue
            keys = RunKeys.from_bytes(entry.value)
            try:
                await kv.update(kid, await wrap_keys(wrapper, keys), last=entry.revision)
            except KeyWrongLastSequenceError:
                continue
            except (TimeoutError, nats.errors.Error) as exc:
                raise KeyStoreError(f"cannot wrap the keys of {kid} ({type(exc).__name__})") from exc
            assert entry.revision is not None
            with contextlib.suppress(APIError):  # already gone (history 1), or a deny_delete bucket
                await self._js.delete_msg(KEY_STREAM, entry.revision)
            wrapped += 1
        return wrapped

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
