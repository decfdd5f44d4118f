"""Reading the log back: raw records of a subject filter, decoded events of one run, every run's
events live (``follow_events``).

Reads speak the NATS protocol on a connection of their own (``runledger.log.fastread``, ~5 us a
message against nats-py's ~30-100) and fall back, where that reader cannot connect (TLS,
credentials files, nkeys), to the same requests through nats-py (``runledger.log.directget``).
Both read by batch direct gets, which create nothing on the server; an agent's login reads its
own runs and keys through a consumer filtered to them instead (its permissions can scope that,
not a direct get: runledger.log.fastread), nats-py's ordered push consumer where the socket
cannot go. None is trusted blindly: an answer that does not name the one before it, a
slow-consumer error, a pending count that skips, a read that does not drain, or a count short of
what the server reports for the filter is an error, not a shorter history.

On a cluster a direct get may be answered by a replica that lags the leader by a few
milliseconds: a read asks the leader for the filter's last stream sequence first and reads again
until it got that far.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import nats
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from runledger.errors import (
    DirectGetDenied,
    EventDecodeError,
    LedgerError,
    LedgerReadError,
    ReaderUnavailableError,
    RunNotFoundError,
    RunOfAnotherAgentError,
)
from runledger.log.client import LedgerClient
from runledger.log.directget import DirectReader, read_direct
from runledger.log.fastread import POLL_S, read_subject, reads_by_consumer
from runledger.log.subjects import LEDGER_STREAM, RUN_PREFIX, any_agent_run_subject, parse_run_subject, run_filter
from runledger.record.events import Event, decode_fast
from runledger.record.fold import split_refused
from runledger.record.records import Quarantined, RawRecord, Recorded

logger = logging.getLogger(__name__)


@dataclass
class RunLog:
    """One run as read from the log (``runledger.load_run`` returns it with its content opened):
    its decoded events in stream order (``records``, each with its stream sequence and subject;
    ``events`` for the events alone) and the messages left out (``quarantined``: bytes that do not
    decode, or that the fold refuses from their writer). ``runledger.fold(log.events)`` is its state."""

    run_id: str
    agent: str
    subject: str  # where the run's own writer appends (the subject of its run.started)
    records: list[Recorded] = field(default_factory=list)
    quarantined: list[Quarantined] = field(default_factory=list)
    # Read with an agent's credentials (which read only its own subjects): the other agents' subjects
    # under the same run id, with their message counts (stream info names them), left unread. Under
    # one id only one agent's run is genuine (the first to start it): a reader of every run tells which.
    unread: dict[str, int] = field(default_factory=dict)

    @property
    def events(self) -> list[Event]:
        return [r.event for r in self.records]

    @property
    def last_stream_seq(self) -> int:
        """The run's last stream sequence, over every writer's subject: what a writer fences on.
        Garbage published onto them is not part of the chain but still moves it, so quarantined
        bytes count."""
        return max([r.stream_seq for r in self.records] + [q.stream_seq for q in self.quarantined], default=0)


async def subject_counts(client: LedgerClient, subject_filter: str, stream: str = LEDGER_STREAM) -> dict[str, int]:
    """Messages per subject matching ``subject_filter`` (from the stream's own state)."""
    try:
        info = await client.js.stream_info(stream, subjects_filter=subject_filter)
    except NotFoundError as exc:
        raise LedgerError(f"stream {stream} does not exist: run `runledger up`") from exc
    return dict(info.state.subjects or {})


async def run_id_holders(client: LedgerClient, run_id: str) -> dict[str, int]:
    """Every subject that holds messages under ``run_id`` (any agent's, any writer's), with its count:
    from the stream's state, which every role may ask (no message is read)."""
    return await subject_counts(client, any_agent_run_subject(run_id))


def agents_of(subjects: dict[str, int]) -> list[str]:
    """The agents of run subjects, sorted."""
    return sorted({parsed[0] for subject in subjects if (parsed := parse_run_subject(subject))})


async def own_run_filter(client: LedgerClient, run_id: str, agent: str | None) -> tuple[str, dict[str, int]]:
    """What a client reads of run ``run_id``: every agent's subjects of it, or, logged in as an agent
    (``client.agent``: an agent reads its own runs only), its own, with the other agents' subjects under
    the id that it leaves unread. ``agent``: the agent whose run is asked for, when the caller knows it.

    Raises RunOfAnotherAgentError when an agent asks for another agent's run: named by ``agent``, or
    an id under which only other agents hold messages."""
    own = getattr(client, "agent", None)
    if own is None:
        return (run_filter(agent, run_id) if agent else any_agent_run_subject(run_id)), {}
    if agent is not None:
        if agent != own:
            raise RunOfAnotherAgentError(run_id, own, [agent])
        return run_filter(own, run_id), {}  # the caller knows whose run it reads (a resume): one read
    holders = await run_id_holders(client, run_id)
    others = {s: n for s, n in holders.items() if (parse_run_subject(s) or ("", ""))[0] != own}
    if others and len(others) == len(holders):
        raise RunOfAnotherAgentError(run_id, own, agents_of(others))
    return run_filter(own, run_id), others


async def read_raw(
    client: LedgerClient,
    subject_filter: str,
    *,
    start_seq: int = 1,
    timeout: float = 30.0,
    stream: str = LEDGER_STREAM,
) -> list[RawRecord]:
    """Every message on ``subject_filter`` of ``stream`` (LEDGER by default) from ``start_seq`` on,
    in stream order.

    Raises LedgerError (LedgerReadError when the read was incomplete: read again)."""
    if not client.clustered or reads_by_consumer(client, stream):
        return await _read(client, stream, subject_filter, start_seq, timeout)
    # A replica may answer a direct get before it has what the leader acknowledged.
    try:
        last = (await client.js.get_msg(stream, subject=subject_filter)).seq or 0
    except NotFoundError:
        last = 0
    except (TimeoutError, nats.errors.Error) as exc:
        raise LedgerReadError(f"reading {subject_filter}: the stream's leader did not answer ({exc!r})") from exc
    for _ in range(_REPLICA_READS):
        records = await _read(client, stream, subject_filter, start_seq, timeout)
        if last < start_seq or (records and records[-1].stream_seq >= last):
            return records
        await asyncio.sleep(_REPLICA_WAIT_S)
    raise LedgerReadError(f"reading {subject_filter}: no replica answered up to sequence {last}; read again")


_REPLICA_READS = 40
_REPLICA_WAIT_S = 0.05


async def _read(
    client: LedgerClient, stream: str, subject_filter: str, start_seq: int, timeout: float
) -> list[RawRecord]:
    try:
        return await read_subject(client, stream, subject_filter, start_seq=start_seq, timeout=timeout)
    except ReaderUnavailableError:
        pass  # TLS, a credentials file or an nkey: the same through nats-py
    if not reads_by_consumer(client, stream):
        try:
            return await asyncio.wait_for(read_direct(client, stream, subject_filter, start_seq=start_seq), timeout)
        except DirectGetDenied:
            pass  # a server whose permissions allow this login consumers instead (configured by hand)
        except TimeoutError as exc:
            raise LedgerReadError(f"reading {subject_filter} timed out after {timeout:g}s") from exc
    return await _read_ordered(client, subject_filter, start_seq=start_seq, timeout=timeout, stream=stream)


async def _read_ordered(
    client: LedgerClient, subject_filter: str, *, start_seq: int, timeout: float, stream: str = LEDGER_STREAM
) -> list[RawRecord]:
    """nats-py's ordered push consumer, named so a role's permissions can match its filter."""
    expected = sum((await subject_counts(client, subject_filter, stream)).values())
    if expected == 0:
        return []
    out: list[RawRecord] = []
    done = asyncio.Event()
    slow_before = client.slow_consumer_errors

    async def on_msg(msg: Any) -> None:
        meta = msg.metadata
        out.append(RawRecord(meta.sequence.stream, msg.subject, msg.data, msg.headers))
        if meta.num_pending == 0:
            done.set()

    config = ConsumerConfig(
        # A named consumer is created through $JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>,
        # where a role's permissions can restrict the filter (runledger.protect.roles); the unnamed form
        # cannot be restricted.
        name=f"rl{uuid.uuid4().hex}",
        deliver_policy=DeliverPolicy.ALL if start_seq <= 1 else DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=start_seq if start_seq > 1 else None,
    )
    try:
        sub = await client.js.subscribe(
            subject_filter,
            stream=stream,
            config=config,
            cb=on_msg,
            ordered_consumer=True,
            pending_msgs_limit=1_000_000,
            pending_bytes_limit=1024 * 1024 * 1024,
        )
    except (TimeoutError, nats.errors.Error) as exc:
        raise LedgerError(
            f"cannot read {subject_filter} ({type(exc).__name__}): the server did not answer, or these "
            "credentials may not read it (a refused JetStream request looks like a timeout)"
        ) from exc
    try:
        await asyncio.wait_for(done.wait(), timeout=timeout)
    except TimeoutError as exc:
        raise LedgerError(f"reading {subject_filter} timed out after {timeout:g}s with {len(out)} messages") from exc
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
    if client.slow_consumer_errors != slow_before:
        raise LedgerError(f"reading {subject_filter}: the client dropped messages (slow consumer); retry")
    if start_seq <= 1 and len(out) < expected:
        raise LedgerError(f"reading {subject_filter}: got {len(out)} messages, the stream holds {expected}")
    return out


def decode_records(raws: list[RawRecord]) -> tuple[list[Recorded], list[Quarantined]]:
    good: list[Recorded] = []
    bad: list[Quarantined] = []
    for raw in raws:
        try:
            good.append(Recorded(decode_fast(raw.data), raw.stream_seq, raw.subject))
        except EventDecodeError as exc:
            bad.append(Quarantined(raw.stream_seq, raw.subject, raw.data, exc.reason))
    return good, bad


async def read_run(client: LedgerClient, run_id: str, *, agent: str | None = None) -> RunLog:
    """All events of one run as stored (content still sealed), quarantining what does not decode and
    what the fold refuses from its writer (a forged envelope, a worker on an agent's run, another
    agent's run with the same id: ``runledger.record.fold.refusal``), so every reader of the run
    leaves out and reports the same messages.

    Raises RunNotFoundError. Knowing the ``agent`` reads the run's own subject, which an agent
    role may read; the default finds the run under any agent (roles that may read every run), and
    logged in as an agent (``client.agent``) that agent's own run, raising RunOfAnotherAgentError for
    another agent's (``own_run_filter``). ``runledger.protect.loading.load_run`` reads a run with its
    content opened.
    """
    subjects, unread = await own_run_filter(client, run_id, agent)
    raws = await read_raw(client, subjects)
    if not raws:
        raise RunNotFoundError(run_id)
    good, bad = decode_records(raws)
    good, refused = split_refused(good)
    if refused:  # forged or stray messages (runledger.record.fold.refusal): quarantined, in stream order
        data = {raw.stream_seq: raw.data for raw in raws}
        bad = sorted(bad + [Quarantined(r.stream_seq, r.subject, data[r.stream_seq], why) for r, why in refused],
                     key=lambda q: q.stream_seq)  # fmt: skip
    subject = good[0].subject if good else raws[0].subject
    parsed = parse_run_subject(subject)
    return RunLog(run_id=run_id, agent=parsed[0] if parsed else "", subject=subject, records=good, quarantined=bad,
                  unread=unread)  # fmt: skip


@contextlib.asynccontextmanager
async def follow_events(client: LedgerClient, on_event: Callable[[Event], object]) -> AsyncIterator[None]:
    """Every run's events as they are appended, from now until the block exits: each decoded event
    is passed to ``on_event`` (called in the client's event loop; hand slow work to a queue)::

        async with runledger.follow_events(client, lambda e: queue.put_nowait(e)):
            ...  # the stream's position is taken: events from here on are seen

    Batch direct gets of every run subject from the stream's last sequence on, asked again every
    ``POLL_S`` when nothing is new (events before the block are not seen: read those with
    ``load_run``); a message that is not an event (the projections quarantine it) is skipped.
    Raises LedgerError when the stream cannot be read."""
    try:
        start = (await client.js.stream_info(LEDGER_STREAM)).state.last_seq + 1
    except (TimeoutError, nats.errors.Error) as exc:
        raise LedgerError(f"cannot follow the run events ({type(exc).__name__}): is the server up?") from exc
    async with DirectReader(client, LEDGER_STREAM) as reader:
        task = asyncio.ensure_future(_follow(reader, start, on_event))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _follow(reader: DirectReader, seq: int, on_event: Callable[[Event], object]) -> None:
    while True:
        try:
            records, _ = await reader.batch(seq, 1000, f"{RUN_PREFIX}.>")
        except LedgerReadError as exc:  # a reconnect, a server restart: ask again from where we are
            logger.warning("following the run events: %s; asking again", exc)
            records = []
        for rec in records:
            seq = rec.stream_seq + 1
            if parse_run_subject(rec.subject) is None:
                continue
            try:
                event = decode_fast(rec.data)
            except LedgerError:  # not an event: the projection quarantines it; nothing to follow
                continue
            on_event(event)
        if not records:
            await asyncio.sleep(POLL_S)
