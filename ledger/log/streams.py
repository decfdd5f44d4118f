"""Stream settings, explicit and in one place, and the idempotent call that applies them.

Settings of the LEDGER stream (run events and effect claims) and why:

- storage file: the log is the source of truth.
- subjects ledger.run.> and ledger.effect.>: one subject a run, one an idempotency key.
- duplicate_window 2 min (RUNLEDGER_DUPLICATE_WINDOW): a retried publish with the same
  Nats-Msg-Id is a no-op.
- deny_delete and deny_purge: events are immutable (these can never be turned off again).
- max_age 90 days (RUNLEDGER_RETENTION_DAYS, 0 keeps forever): the retention window, on purpose.
- replicas 1 on one node, 3 on a cluster (RUNLEDGER_REPLICAS overrides). A stream that
  exists keeps its replica count unless RUNLEDGER_REPLICAS asks for another: an agent
  connecting to one node of a cluster must never scale the log down by accident.
- allow_direct: fast reads of a subject's last message, for fencing checks.
- allow_atomic: a run in output durability stores each window of events as one atomic
  batch fenced on its first message (runledger.log.window; nats-server 2.12+).

LEDGER_CMD is a work queue (each re-run request consumed once), read through one pull consumer
(``rerun-workers``) made here with the streams, by the admin: a worker may update its settings but
may not create another consumer, so none of them delivers requests to a subject of its choosing
(runledger.protect.roles); LEDGER_BLOBS an
object store for payloads addressed by sha256 (``runledger.protect.blobs``), kept as long as the
events (same max age); LEDGER_KEYS the KV bucket of per-run keys (``runledger.protect.keystore``),
whose deletion erases a run's content, kept one day longer than the events so no event
outlives its key.

Retention, on purpose: 90 days is the default because a flight recorder is for
investigating recent behaviour and every day kept is a day of personal data held;
set RUNLEDGER_RETENTION_DAYS for a different window (0 keeps forever). Erasing one run
before that is ``runledger erase RUN`` (``runledger.protect.erasure``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, ObjectStoreConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from runledger.log.subjects import (
    BLOB_BUCKET,
    CMD_PREFIX,
    CMD_STREAM,
    EFFECT_PREFIX,
    KEY_BUCKET,
    KEY_STREAM,
    LEDGER_STREAM,
    RERUN_CONSUMER,
    RERUN_SUBJECT,
    RUN_PREFIX,
)

DAY = 86_400.0


def rerun_consumer_config(ack_wait_s: float = 30.0, max_deliver: int = 6) -> ConsumerConfig:
    """The work queue's consumer: pull (no deliver subject), explicit acks. The defaults are a
    worker's (``runledger worker``: 30 s, 3 attempts and a backstop of 3); a worker that starts with
    other settings updates it to its own."""
    return ConsumerConfig(
        name=RERUN_CONSUMER, durable_name=RERUN_CONSUMER, ack_policy=AckPolicy.EXPLICIT, ack_wait=ack_wait_s,
        max_deliver=max_deliver, filter_subject=RERUN_SUBJECT,
    )  # fmt: skip


@dataclass(frozen=True)
class StreamSettings:
    duplicate_window_s: float = 120.0
    retention_days: float = 90.0
    # None: 3 on a cluster and 1 on one node for a new stream; an existing stream keeps its own.
    replicas: int | None = None

    @classmethod
    def from_env(cls) -> StreamSettings:
        replicas = os.environ.get("RUNLEDGER_REPLICAS")
        return cls(
            duplicate_window_s=float(os.environ.get("RUNLEDGER_DUPLICATE_WINDOW", 120.0)),
            retention_days=float(os.environ.get("RUNLEDGER_RETENTION_DAYS", 90.0)),
            replicas=int(replicas) if replicas else None,
        )

    def resolved(self, clustered: bool) -> StreamSettings:
        """These settings with the replica count decided: as set, else 3 on a cluster, 1 alone."""
        if self.replicas is not None:
            return self
        return replace(self, replicas=3 if clustered else 1)

    def ledger_config(self) -> StreamConfig:
        return StreamConfig(
            name=LEDGER_STREAM,
            description="runledger: every event of every agent run (source of truth)",
            subjects=[f"{RUN_PREFIX}.>", f"{EFFECT_PREFIX}.>"],
            storage=StorageType.FILE,
            retention=RetentionPolicy.LIMITS,
            duplicate_window=self.duplicate_window_s,
            max_age=self.retention_days * DAY if self.retention_days > 0 else None,
            num_replicas=self.replicas or 1,
            deny_delete=True,
            deny_purge=True,
            allow_direct=True,
            allow_atomic=True,
            max_msg_size=1024 * 1024,
        )

    def cmd_config(self) -> StreamConfig:
        return StreamConfig(
            name=CMD_STREAM,
            description="runledger: operator commands (re-run requests), consumed once each",
            subjects=[f"{CMD_PREFIX}.>"],
            storage=StorageType.FILE,
            retention=RetentionPolicy.WORK_QUEUE,
            duplicate_window=self.duplicate_window_s,
            num_replicas=self.replicas or 1,
        )


async def ensure_streams(
    js: JetStreamContext, settings: StreamSettings | None = None, *, clustered: bool = False
) -> None:
    """Create or update LEDGER, LEDGER_CMD (and its workers' consumer) and the blob store. Safe to
    call any number of times.

    ``clustered``: the server is part of a JetStream cluster (new streams get 3 replicas
    unless the settings say otherwise)."""
    base = settings or StreamSettings.from_env()
    explicit = base.replicas is not None
    settings = base.resolved(clustered)
    for config in (settings.ledger_config(), settings.cmd_config()):
        assert config.name is not None
        try:
            info = await js.stream_info(config.name)
        except NotFoundError:
            await js.add_stream(config)
        else:
            if not explicit:
                config.num_replicas = info.config.num_replicas
            if not _same_settings(info.config, config):
                # Only when something changed: every agent connects through here, and on a
                # cluster each update is a round of the JetStream meta leader's consensus.
                await js.update_stream(config)
    try:
        await js.consumer_info(CMD_STREAM, RERUN_CONSUMER)
    except NotFoundError:
        await js.add_consumer(CMD_STREAM, rerun_consumer_config())
    max_age = settings.retention_days * DAY if settings.retention_days > 0 else None
    try:
        # The stream behind the bucket (what js.object_store reads too, so no extra round trip).
        blobs = await js.stream_info(f"OBJ_{BLOB_BUCKET}")
    except NotFoundError:
        await js.create_object_store(
            BLOB_BUCKET,
            ObjectStoreConfig(
                bucket=BLOB_BUCKET,
                description="runledger: payloads by reference, named by sha256",
                storage=StorageType.FILE,
                replicas=settings.replicas or 1,
                ttl=max_age,
            ),
        )
    else:
        await _keep_max_age(js, blobs.config, max_age)
    await ensure_key_bucket(js, replicas=settings.replicas or 1, max_age_s=None if max_age is None else max_age + DAY)


async def _keep_max_age(js: JetStreamContext, current: StreamConfig, max_age_s: float | None) -> None:
    """Give an existing bucket's stream the max age the retention asks for, when it has another.

    The buckets follow the LEDGER stream's window (blobs the same, keys a day longer): a window
    lengthened on LEDGER alone would let events outlive the blobs they reference and the keys that
    open them; one shortened on LEDGER alone would keep content past the promised window."""
    if (current.max_age or None) == (max_age_s or None):
        return
    current.max_age = max_age_s
    if max_age_s and current.duplicate_window and current.duplicate_window > max_age_s:
        current.duplicate_window = max_age_s  # the server refuses a duplicate window past the max age
    await js.update_stream(current)


def _same_settings(current: StreamConfig, wanted: StreamConfig) -> bool:
    """Whether the stream already has every setting runledger sets (fields left None are not compared)."""
    # The server reports an unset limit as 0 where the config says None: compare falsy as None.
    return all((getattr(current, name, None) or None) == (getattr(wanted, name) or None) for name in wanted.as_dict())


async def ensure_key_bucket(js: JetStreamContext, *, replicas: int = 1, max_age_s: float | None = None) -> None:
    """Create the LEDGER_KEYS bucket when missing, else give it ``max_age_s`` if it has another (idempotent).

    Created as the stream a KV bucket is (nats-py's ``create_key_value`` config) except for
    two settings: ``deny_delete`` off, so ``destroy`` can securely delete a key message
    (a KV made by ``create_key_value`` denies it, and that can never be turned off), and
    ``allow_direct`` on, so reads go through ``$JS.API.DIRECT.GET.KV_LEDGER_KEYS.<subject>``,
    which a permission can scope per agent (the STREAM.MSG.GET form cannot; runledger.protect.roles).
    """
    from nats.js.api import DiscardPolicy, StorageType, StreamConfig
    from nats.js.errors import NotFoundError

    try:
        info = await js.stream_info(KEY_STREAM)
    except NotFoundError:
        pass
    else:
        await _keep_max_age(js, info.config, max_age_s)
        return
    window = 120.0 if not max_age_s else min(120.0, max_age_s)
    await js.add_stream(
        StreamConfig(
            name=KEY_STREAM,
            description="runledger: per-run data and token keys (deleting one erases a run's content)",
            subjects=[f"$KV.{KEY_BUCKET}.>"],
            allow_direct=True,
            allow_rollup_hdrs=True,
            deny_delete=False,
            deny_purge=False,
            discard=DiscardPolicy.NEW,
            duplicate_window=window,
            max_age=max_age_s,
            max_consumers=-1,
            max_msgs=-1,
            max_msgs_per_subject=1,
            num_replicas=replicas,
            storage=StorageType.FILE,
        )
    )
