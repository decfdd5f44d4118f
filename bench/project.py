"""Projection: the DuckDB rebuild rate against a raw nats-py read of the same stream.

Workload: N events of synthetic agent runs (about 10 events a run: run.started, two model
calls with a ~300-byte history, a tool call, an effect claimed and committed on its key
subject and mirrored in the run, a clock read, run.completed; every 10th run asks for an
approval, half of those are resolved and resumed; every 7th run fails in a tool), plus one
run of 1,000 steps. Events are built with the ledger's own canonical JSON and hash chain
and published as raw bytes with ``Nats-Msg-Id`` (``js.publish_async`` in windows, each
window awaited with a timeout and republished on timeout: dedup makes that safe).

Measured, in one run on one server (fsync off: reads are measured, not writes):
- raw read: nats-py's ordered push consumer with a callback that only counts (the
  fastest nats-py reader, as measured here), until it has every message of the stream;
- the projector's own reader doing nothing with the messages (for transparency);
- rebuild: ``runledger project --rebuild`` in-process (read, decode, fold, Arrow, DuckDB,
  one transaction a batch, swap), events/s and the file size;
- ``checkpoint --at-step K`` of the 1,000-step run, median over K: the ledger's command
  path (``load_run`` + ``fold``) and the projection path (``runledger.projections.queries.checkpoint_at``).
Raw reads and rebuilds alternate (``--rounds``) so both see the same machine noise.

``--approaches`` measures instead, without a server, what the per-event path of a rebuild costs
with each approach to decoding and row building, in CPU time a record (DuckDB's threads
included), interleaved round by round on the same records: the ledger's ``decode_fast`` against
the projector's decoder (``runledger.projections.decoder``), a partition's whole batch path with
each, and the ``events`` rows built in Python against built by DuckDB's JSON functions from the
raw payloads.

    python -m bench.project [--events 1000000] [--rounds 2] [--queries]
    python -m bench.project --approaches [--events 100000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import itertools
import random
import re
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nats.js.api import ConsumerConfig, DeliverPolicy

from bench.common import server, summary, table
from bench.report import STAT_COLUMNS, Goal, Section, SuiteOptions, Table, num, ratio_cell, ratio_stats, stat_cells
from runledger.log.client import LedgerClient, connect
from runledger.log.subjects import (
    LEDGER_STREAM,
    OPERATOR_WRITER,
    effect_msg_id,
    effect_subject,
    run_msg_id,
    run_subject,
)
from runledger.protect.loading import load_run
from runledger.record.canonical import canonical_json, digest
from runledger.record.events import GENESIS
from runledger.record.fold import OPERATOR_TYPES, fold
from runledger.record.ids import new_id

# -- the workload ---------------------------------------------------------------------------------------

VERSION = {"agent_version": "code:bench", "model": "bench-model-1", "prompt_hash": "p" * 64,
           "tool_schema_hashes": {"lookup_order": "h" * 16, "refund": "r" * 16}}  # fmt: skip
HISTORY = [
    {"role": "system", "content": "You are a support agent for an online shop. Classify each ticket and decide."},
    {"role": "user", "content": "TASK classify\nMy blender arrived broken, I want my money back. Order 8891."},
]
Message = tuple[str, bytes, str]  # subject, data, msg id
DOC_QUERIES = Path(__file__).resolve().parent.parent / "docs" / "queries.md"


_ID_PREFIX = new_id()[:10]
_counter = itertools.count()
_EPOCH = int(time.time())


def _stamp(offset_us: int) -> str:
    seconds, micros = divmod(offset_us, 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(_EPOCH + seconds)) + f".{micros:06d}Z"


class ChainBuilder:
    """Builds the wire bytes of one subject's hash chain, as ``runledger.record.events.make_event`` does.

    Faster than ``make_event`` (no pydantic models, one canonical encoding: the hash member
    is spliced in after "agent", the first key of the canonical form); a unit test decodes
    its output with ``runledger.record.events.decode``.
    """

    def __init__(self, subject: str, run_id: str, agent: str, msg_id: Any) -> None:
        self.subject, self.run_id, self.agent, self.msg_id = subject, run_id, agent, msg_id
        self.seq = 0
        self.prev = GENESIS

    def add(self, type_: str, payload: dict[str, Any]) -> Message:
        n = next(_counter)
        unhashed = {
            "id": f"{_ID_PREFIX}{n:016d}", "run_id": self.run_id, "agent": self.agent, "seq": self.seq,
            "type": type_, "schema_version": 1, "ts": _stamp(n * 500), "payload": payload, "prev_hash": self.prev,
        }  # fmt: skip
        body = canonical_json(unhashed)
        digest_ = hashlib.sha256(self.prev.encode("ascii"))
        digest_.update(body)
        self.prev = digest_.hexdigest()
        head = canonical_json({"agent": self.agent})[:-1]  # '{"agent":"..."'
        assert body.startswith(head)
        data = head + b',"hash":"' + self.prev.encode("ascii") + b'"' + body[len(head) :]
        # An operator's decision travels on the run's operator subject (runledger.log.subjects).
        subject = self.subject[:-1] + OPERATOR_WRITER if type_ in OPERATOR_TYPES else self.subject
        message = (subject, data, self.msg_id(self.seq))
        self.seq += 1
        return message


@functools.lru_cache(maxsize=8192)
def _model(step: int, content: str, tokens_in: int, tokens_out: int) -> dict[str, Any]:
    # Cached: the same payload object is shared by many events (only ever read).
    request = {"messages": [*HISTORY, {"role": "user", "content": f"step {step}"}], "params": {}}
    return {
        "step": step, "model": VERSION["model"], "request": request, "args_digest": digest(request),
        "response": {"content": content, "tool_calls": [], "finish_reason": "stop"},
        "usage": {"input_tokens": tokens_in, "output_tokens": tokens_out}, "duration_ms": 412.5,
    }  # fmt: skip


def synthetic_run(i: int, agents: int = 5) -> list[Message]:
    """The messages of run ``i`` (run subject and effect-key subjects), in publish order."""
    agent = f"agent-{i % agents}"
    run_id = f"run-{i:08d}"
    run = ChainBuilder(run_subject(agent, run_id), run_id, agent, lambda s: run_msg_id(run_id, s))
    out = [run.add("run.started", {
        "agent": agent, "version": VERSION, "budgets": {"turns": 10, "tokens": 5000, "seconds": None},
        "input": {"ticket": f"W-{i}", "order": f"order-{i}", "text": "My blender arrived broken."},
        "capture": "full", "labels": {"ticket": f"W-{i}"},
    })]  # fmt: skip
    out.append(run.add("model.called", _model(0, '{"intent": "refund"}', 120 + i % 50, 8)))
    order = {"order": f"order-{i}"}
    if i % 7 == 3:
        error = {"type": "LookupError", "message": f"no order 'order-{i}'", "traceback": None}
        failed = {"step": 1, "name": "lookup_order", "args": order, "args_digest": digest(order), "error": error}
        out.append(run.add("tool.called", {**failed, "duration_ms": 3.1}))
        out.append(run.add("run.failed", {"reason": "exception", "error": error, "step": 1}))
        return out
    found = {"order": f"order-{i}", "amount": 10 + i % 900, "item": "blender", "status": "delivered"}
    out.append(run.add("tool.called", {"step": 1, "name": "lookup_order", "args": order,
                                       "args_digest": digest(order), "output": found, "duration_ms": 3.1}))  # fmt: skip
    out.append(run.add("model.called", _model(2, '{"refund": true}', 240 + i % 70, 30)))
    step = 3
    args = {"order": f"order-{i}", "amount": found["amount"]}
    if i % 10 == 5:
        request_id = f"req{i:08d}"
        approval = {"action": "refund", "args": args}
        out.append(run.add("approval.requested", {"step": step, "request_id": request_id, "action": "refund",
                                                  "args": args, "digest": digest(approval)}))  # fmt: skip
        out.append(run.add("run.suspended", {"step": step, "request_id": request_id, "reason": "approval"}))
        if i % 20 == 15:
            return out  # still waiting for an operator
        out.append(run.add("approval.resolved", {"request_id": request_id, "digest": digest(approval),
                                                 "approved": True, "by": "ops", "reason": "ok"}))  # fmt: skip
        out.append(run.add("run.resumed", {"attempt": 2, "from_step": step, "worker": "bench"}))
        step += 1
    key = f"refund:order-{i}"
    claim = {"step": step, "name": "refund", "key": key, "args": args, "args_digest": digest(args),
             "effect_class": "irreversible"}  # fmt: skip
    result = {"refund_id": f"rf-{i}", "amount": found["amount"]}
    out.append(run.add("effect.intended", claim))
    ledger_key = ChainBuilder(effect_subject(agent, key), run_id, agent, lambda s: effect_msg_id(agent, key, s))
    out.append(ledger_key.add("effect.intended", claim))
    commit = {"step": step, "key": key, "result": result, "duration_ms": 25.0, "via": "act"}
    out.append(ledger_key.add("effect.committed", commit))
    out.append(run.add("effect.committed", commit))
    out.append(run.add("clock.read", {"step": step + 1, "value": "2026-01-01T00:00:00+00:00"}))
    out.append(run.add("run.completed", {"output": {"refunded": True, "refund": result}}))
    return out


def long_run(steps: int, run_id: str = "run-long") -> list[Message]:
    """One run of ``steps`` steps alternating model and tool calls, then run.completed."""
    agent = "agent-long"
    run = ChainBuilder(run_subject(agent, run_id), run_id, agent, lambda s: run_msg_id(run_id, s))
    out = [run.add("run.started", {"agent": agent, "version": VERSION, "input": {"n": steps}})]
    for step in range(steps):
        if step % 2 == 0:
            out.append(run.add("model.called", _model(step, f"thought {step}", 300, 20)))
        else:
            args = {"query": f"q{step}"}
            out.append(run.add("tool.called", {"step": step, "name": "search", "args": args,
                                               "args_digest": digest(args), "output": {"rows": step},
                                               "duration_ms": 1.0}))  # fmt: skip
    out.append(run.add("run.completed", {"output": {"steps": steps}}))
    return out


def workload(events: int, *, start: int = 0) -> Iterator[Message]:
    """About ``events`` messages of synthetic runs (whole runs: it may run over by a few)."""
    produced, i = 0, start
    while produced < events:
        for message in synthetic_run(i):
            produced += 1
            yield message
        i += 1


async def publish_raw(client: LedgerClient, messages: Iterator[Message], *, chunk: int = 20_000) -> int:
    """Publish pre-built events fast; returns how many. Each one is stored exactly once.

    Core-NATS publishes (no per-message ack: ~60x faster than ``js.publish`` here, and
    ``publish_async`` futures can hang: nats.py issue 985) in chunks; after each chunk the stream's
    message count must reach what was sent, else the chunk is sent again with awaited
    ``js.publish`` and the same ``Nats-Msg-Id`` (dedup makes repeats no-ops).
    """
    info = await client.js.stream_info(LEDGER_STREAM)
    stored = int(info.state.messages)
    total = 0
    batch = list(itertools.islice(messages, chunk))
    while batch:
        for subject, data, msg_id in batch:
            await client.nc.publish(subject, data, headers={"Nats-Msg-Id": msg_id})
        # A server that fsyncs every message behind a busy machine answers the flush's PING late.
        await client.nc.flush(timeout=60)
        stored += len(batch)
        deadline, seen = time.monotonic() + 20, -1
        while (now := int((await client.js.stream_info(LEDGER_STREAM)).state.messages)) < stored:
            if now > seen:  # still storing (one fsync a message, on a busy machine): not lost, wait on
                deadline, seen = time.monotonic() + 20, now
            if time.monotonic() > deadline:
                for subject, data, msg_id in batch:
                    await client.js.publish(subject, data, headers={"Nats-Msg-Id": msg_id}, timeout=10)
                break
            await asyncio.sleep(0.02)
        total += len(batch)
        batch = list(itertools.islice(messages, chunk))
    return total


# -- measurements ---------------------------------------------------------------------------------------


async def raw_read(client: LedgerClient, expected: int) -> float:
    """Seconds for nats-py's ordered consumer to deliver ``expected`` messages to a counting callback."""
    count = 0
    done = asyncio.Event()

    async def on_msg(msg: Any) -> None:
        nonlocal count
        count += 1
        if count >= expected:
            done.set()

    started = time.perf_counter()
    sub = await client.js.subscribe(
        "ledger.>", stream=LEDGER_STREAM, cb=on_msg, ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
        pending_msgs_limit=2_000_000, pending_bytes_limit=4 * 1024**3,
    )  # fmt: skip
    await asyncio.wait_for(done.wait(), timeout=3600)
    elapsed = time.perf_counter() - started
    await sub.unsubscribe()
    if client.slow_consumer_errors:
        raise RuntimeError("the raw reader dropped messages (slow consumer): the measurement is void")
    return elapsed


async def projector_reader_only(client: LedgerClient, expected: int) -> float:
    from runledger.projections.reader import PullReader

    reader = PullReader(client, LEDGER_STREAM)
    started = time.perf_counter()
    await reader.start(1)
    count = 0
    try:
        while count < expected:
            count += len(await reader.next_batch(20_000, 5.0))
    finally:
        await reader.close()
    return time.perf_counter() - started


async def measure(
    events: int,
    rounds: int,
    long_steps: int,
    work: Path,
    *,
    queries: dict[str, str] | None = None,
    query_repeats: int = 3,
) -> dict[str, Any]:
    """Publish the workload, then per round: raw read, the projector's reader alone, a rebuild.

    Then checkpoints at a step of the long run (ledger path and projection path), and, with
    ``queries`` (name -> SQL), each query run ``query_repeats`` times on the rebuilt file.
    Returns the numbers; times in seconds unless the key says ms.
    """
    from runledger.projections.projector import rebuild
    from runledger.projections.queries import checkpoint_at, run_sql
    from runledger.projections.store import ProjectionStore

    out: dict[str, Any] = {"events_requested": events, "rounds": rounds, "long_steps": long_steps}
    with server(sync_always=False) as state:
        client = await connect(state.url)
        try:
            t0 = time.perf_counter()
            published = await publish_raw(client, workload(events))
            published += await publish_raw(client, iter(long_run(long_steps)))
            info = await client.js.stream_info(LEDGER_STREAM)
            total = int(info.state.messages)
            assert total == published, f"stream holds {total} of {published} published messages"
            out.update(events=total, stream_bytes=int(info.state.bytes), publish_s=time.perf_counter() - t0)

            raw_s, rebuild_s, own_s = [], [], []
            db = work / "bench.duckdb"
            for _ in range(rounds):
                raw_s.append(await raw_read(client, total))
                own_s.append(await projector_reader_only(client, total))
                started = time.perf_counter()
                result = await rebuild(client, db)
                rebuild_s.append(time.perf_counter() - started)
                assert result.events + result.quarantined == total, result
            out.update(raw_s=raw_s, reader_s=own_s, rebuild_s=rebuild_s, reader_kind=result.reader,
                       db_bytes=db.stat().st_size)  # fmt: skip

            ks = random.Random(7).sample(range(long_steps), min(21, long_steps))
            ledger_ms, db_ms = [], []
            with ProjectionStore(db, writer=False) as store:
                for k in ks:
                    started = time.perf_counter()
                    log = await load_run(client, "run-long")
                    expected = fold(log.records, upto_step=k)
                    ledger_ms.append((time.perf_counter() - started) * 1000)
                    started = time.perf_counter()
                    got = checkpoint_at(store.con, "run-long", k)
                    db_ms.append((time.perf_counter() - started) * 1000)
                    assert got.to_dict() == expected.to_dict(), f"checkpoint at step {k} differs"
                out.update(checkpoint_ledger_ms=ledger_ms, checkpoint_db_ms=db_ms)
                query_ms: dict[str, list[float]] = {}
                query_rows: dict[str, int] = {}
                for name, sql in (queries or {}).items():
                    query_ms[name] = []
                    for _ in range(query_repeats):
                        started = time.perf_counter()
                        answer = run_sql(store.con, sql)
                        query_ms[name].append((time.perf_counter() - started) * 1000)
                    query_rows[name] = len(answer.rows)
                out.update(query_ms=query_ms, query_rows=query_rows)
        finally:
            await client.close()
    return out


# -- approaches to the per-event path, against each other ----------------------------------------------

# The events rows as DuckDB's JSON functions build them from the raw payloads (one parse a record,
# every path at once): the alternative to rows built in Python from decoded events.
_EVENTS_IN_SQL = (
    "INSERT INTO events BY NAME SELECT stream_seq, subject, s[1] AS id, s[2] AS run_id, s[3] AS agent, "
    "s[4]::BIGINT AS seq, s[5] AS type, s[6]::BIGINT AS schema_version, s[7] AS ts_text, "
    "TRY_CAST(s[7] AS TIMESTAMPTZ) AS ts, TRY_CAST(s[8] AS BIGINT) AS step, s[9] AS payload, "
    "s[10] AS prev_hash, s[11] AS hash, strlen(data) AS size FROM (SELECT stream_seq, subject, data, "
    "json_extract_string(data, ['$.id', '$.run_id', '$.agent', '$.seq', '$.type', '$.schema_version', '$.ts', "
    "'$.payload.step', '$.payload', '$.prev_hash', '$.hash']) AS s FROM staged)"
)


def approaches(events: int, rounds: int, batch: int = 20_000) -> dict[str, list[float]]:
    """CPU microseconds a record of each approach, one sample a round, approaches interleaved."""
    import duckdb
    import pyarrow as pa

    from runledger.projections import partition
    from runledger.projections.decoder import decode_record
    from runledger.projections.migrations import migrate
    from runledger.projections.rows import TableBuffer, add_event
    from runledger.record.events import decode_fast
    from runledger.record.records import RawRecord

    records = [RawRecord(i + 1, subject, data) for i, (subject, data, _) in enumerate(workload(events))]
    records += [RawRecord(len(records) + i + 1, s, d) for i, (s, d, _) in enumerate(long_run(1000))]
    batches = [records[i : i + batch] for i in range(0, len(records), batch)]
    decoded = [decode_record(r.data) for r in records]

    def project_with(decoder: Any) -> None:
        saved = partition.decode_record
        partition.decode_record = decoder
        try:
            projector = partition.PartitionProjector()
            for part in batches:
                projector.project(part)
        finally:
            partition.decode_record = saved

    with tempfile.TemporaryDirectory(prefix="runledger-bench-approaches-") as tmp:
        con = duckdb.connect(str(Path(tmp) / "approaches.duckdb"))
        migrate(con, "approaches.duckdb")

        def insert(table: Any, sql: str) -> None:
            con.register("staged", table)
            con.execute("BEGIN TRANSACTION")
            con.execute(sql)
            con.execute("ROLLBACK")  # the same empty table for every sample
            con.unregister("staged")

        def rows_in_python() -> None:
            for start in range(0, len(records), batch):
                buffer = TableBuffer("events")
                for rec, ev in zip(records[start : start + batch], decoded[start : start + batch], strict=True):
                    add_event(buffer, rec, ev)
                insert(buffer.to_arrow(), "INSERT INTO events BY NAME SELECT *, TRY_CAST(ts_text AS TIMESTAMPTZ) "
                       "AS ts FROM staged")  # fmt: skip

        def rows_in_duckdb() -> None:
            for part in batches:
                table = pa.table({
                    "stream_seq": pa.array([r.stream_seq for r in part], pa.int64()),
                    "subject": pa.array([r.subject for r in part], pa.string()),
                    "data": pa.array([r.data for r in part], pa.string()),
                })  # fmt: skip
                insert(table, _EVENTS_IN_SQL)

        cases = {
            "decode: ledger decode_fast (pydantic-core parse)": lambda: [decode_fast(r.data) for r in records],
            "decode: projector decoder (msgspec envelope)": lambda: [decode_record(r.data) for r in records],
            "partition batch path with decode_fast": lambda: project_with(decode_fast),
            "partition batch path with the projector decoder": lambda: project_with(decode_record),
            "events rows: Python rows + Arrow + DuckDB insert": rows_in_python,
            "events rows: DuckDB JSON functions over raw payloads": rows_in_duckdb,
        }
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(rounds):
            for name, case in cases.items():
                started = time.process_time()
                case()
                samples[name].append((time.process_time() - started) / len(records) * 1e6)
        con.close()
    return samples


def approach_rows(samples: dict[str, list[float]]) -> list[list[str]]:
    rows = [["approach", "median us/record (CPU)", "min", "max"]]
    for name, values in samples.items():
        rows.append([name, f"{statistics.median(values):.1f}", f"{min(values):.1f}", f"{max(values):.1f}"])
    return rows


def rows_of(out: dict[str, Any]) -> list[list[str]]:
    """The measurements as the module's own table (``python -m bench.project``)."""
    total, rounds = out["events"], out["rounds"]
    raw_rate = total / statistics.median(out["raw_s"])
    rebuild_rate = total / statistics.median(out["rebuild_s"])
    rows: list[list[str]] = [["measure", "value", "note"]]
    rows.append(["events published", f"{total:,}", f"{out['stream_bytes'] / total:.0f} B avg, "
                 f"{out['publish_s']:.0f} s to publish"])  # fmt: skip
    rows.append(["raw nats-py read", f"{raw_rate:,.0f} ev/s", "ordered push consumer, counting callback"])
    rows.append(["projector reader alone", f"{total / statistics.median(out['reader_s']):,.0f} ev/s",
                 "pull consumer parsed from the socket, no decode"])  # fmt: skip
    rows.append(["rebuild", f"{rebuild_rate:,.0f} ev/s",
                 f"median of {rounds}: {statistics.median(out['rebuild_s']):.1f} s incl. swap"])  # fmt: skip
    rows.append(["rebuild / raw read", f"{rebuild_rate / raw_rate:.2f}x", "goal: 1.0x or more"])
    rows.append(["DuckDB file", f"{out['db_bytes'] / 1e6:,.1f} MB", f"{out['db_bytes'] / total:,.0f} B an event"])
    rows.append([f"checkpoint --at-step ({out['long_steps']} steps)",
                 f"{statistics.median(out['checkpoint_ledger_ms']):.1f} ms",
                 "median, ledger path: read the run from NATS + fold"])  # fmt: skip
    rows.append(["checkpoint at step (projection)", f"{statistics.median(out['checkpoint_db_ms']):.1f} ms",
                 "median, read the run from DuckDB + fold; goal: < 50 ms"])  # fmt: skip
    for name, ms in out.get("query_ms", {}).items():
        rows.append([f"query {name}", f"{statistics.median(ms):.1f} ms", f"{out['query_rows'][name]} rows"])
    return rows


def doc_queries(path: Path = DOC_QUERIES) -> dict[str, str]:
    """``Q<n>`` -> the first sql block under its heading in docs/queries.md."""
    out = {}
    for section in re.split(r"^## ", path.read_text(), flags=re.M)[1:]:
        number = section.split(".", 1)[0]
        found = re.search(r"```sql\n(.*?)```", section, flags=re.S)
        if found:
            out[number] = found.group(1).strip()
    return out


# Why a rebuild misses the raw read on a 2-core machine (docs/tables.md, "Rebuild speed").
WHY_REBUILD = (
    "the raw read hands over an event every ~25 us; a rebuild spends ~140 us of CPU an event over its "
    "processes (decoding and checking 23, the fold and rows 40-67, DuckDB's commits 19-26; Arrow tables "
    "already go to DuckDB in bulk), so two cores give ~0.4x. 1.0x needs ~50 us an event in all: a compiled "
    "decoder and fold, a second definition of a checkpoint beside runledger.record.fold, which is not made."
)


def run_suite(opts: SuiteOptions) -> Section:
    events, rounds, long_steps, repeats = (3_000, 1, 100, 1) if opts.quick else (1_000_000, 1, 1000, 3)
    queries = doc_queries()
    queries["scan: count(*) FROM events"] = "SELECT count(*) FROM events"
    with tempfile.TemporaryDirectory(prefix="runledger-bench-project-") as tmp:
        out = asyncio.run(measure(events, rounds, long_steps, Path(tmp), queries=queries, query_repeats=repeats))
    total = out["events"]
    section = Section(part="project", title="projecting the log into DuckDB, and analyst queries", data=out)
    section.workload = (
        f"{total:,} events ({out['stream_bytes'] / total:.0f} B on average) of synthetic agent runs, about 10 events "
        "a run: run.started, two model calls with a ~300-byte history, a tool call, an effect claimed and committed "
        "on its key subject and mirrored in the run, a clock read, run.completed; every 10th run asks for an "
        "approval (half of those are resolved and resumed), every 7th fails in a tool; 5 agents. Plus one run of "
        f"{long_steps:,} steps. Events are built with the ledger's canonical JSON and hash chain and published raw "
        "with `Nats-Msg-Id` before anything is measured (fsync off: reads are measured, not writes). "
        f"{rounds} round(s) of: raw read (nats-py's ordered push consumer, a callback that only counts), the "
        "projector's own reader doing nothing with the messages, `rebuild` in process (read, decode, fold, Arrow, "
        "DuckDB, one transaction a batch, swap). Then `checkpoint --at-step K` of the long run at "
        f"{len(out['checkpoint_ledger_ms'])} random K, by the ledger path (`load_run` + `fold`) and the projection "
        f"path (`runledger.projections.queries.checkpoint_at`), alternating; then every query of docs/queries.md, "
        f"{repeats} "
        "time(s) each, on the rebuilt file (DuckDB, this process, a warm file)."
    )
    raw_rates = [total / s for s in out["raw_s"]]
    reader_rates = [total / s for s in out["reader_s"]]
    rebuild_rates = [total / s for s in out["rebuild_s"]]
    pairs = ratio_stats(list(zip(rebuild_rates, raw_rates, strict=True)))
    rate_rows = []
    for name, rates in (("raw nats-py read", raw_rates), ("projector reader alone", reader_rates),
                        ("rebuild (projector)", rebuild_rates)):  # fmt: skip
        s = summary(rates)
        ratio = "" if rates is raw_rates else ratio_cell(ratio_stats(list(zip(rates, raw_rates, strict=True))))
        rate_rows.append([name, num(s["p50"]), num(s["min"]), num(s["max"]), str(int(s["n"])), ratio])
    section.tables.append(Table("events per second over the whole stream",
                                ["reader", "p50 ev/s", "min", "max", "rounds", "/ raw read"], rate_rows))  # fmt: skip
    section.notes.append(
        f"Publishing the workload took {out['publish_s']:.0f} s; the DuckDB file is {out['db_bytes'] / 1e6:,.1f} MB "
        f"({out['db_bytes'] / total:,.0f} B an event); the projector used its `{out['reader_kind']}` reader."
    )
    led, dbm = summary(out["checkpoint_ledger_ms"]), summary(out["checkpoint_db_ms"])
    cp_ratio = ratio_stats(list(zip(out["checkpoint_db_ms"], out["checkpoint_ledger_ms"], strict=True)))
    section.tables.append(Table(
        f"checkpoint of the {long_steps:,}-step run at a step (ms)", ["path", *STAT_COLUMNS, "/ ledger path"],
        [["ledger: load_run + fold", *stat_cells(led), ""],
         ["projection: checkpoint_at", *stat_cells(dbm), ratio_cell(cp_ratio)]],
    ))  # fmt: skip
    qrows = []
    for name, ms in out["query_ms"].items():
        s = summary(ms)
        qrows.append([name, *stat_cells(s), str(out["query_rows"][name])])
    section.tables.append(Table(f"analyst queries on {total:,} events (ms)", ["query", *STAT_COLUMNS, "rows"], qrows))
    section.goals.append(
        Goal(
            "rebuild at 1.0x or more of the raw read rate",
            pairs["p50"] >= 1.0,
            f"rebuild / raw read = {ratio_cell(pairs)} ({num(summary(rebuild_rates)['p50'])} against "
            f"{num(summary(raw_rates)['p50'])} ev/s).",
            WHY_REBUILD,
        )
    )
    section.goals.append(
        Goal(
            "checkpoint at a step from the projection under 50 ms",
            dbm["p50"] < 50,
            f"p50 {dbm['p50']:.1f} ms (the ledger path: {led['p50']:.1f} ms).",
        )
    )
    slowest = max(out["query_ms"], key=lambda q: statistics.median(out["query_ms"][q]))
    section.notes.append(
        f"No goal is set for the analyst queries; the slowest, {slowest}, took "
        f"{statistics.median(out['query_ms'][slowest]):.0f} ms at p50 over {total:,} events."
    )
    from bench.plots import bars

    section.plots.append(
        bars(
            opts.plot_dir / "project-rates.png",
            f"events/s reading {total:,} events",
            ["raw read", "projector reader", "rebuild"],
            {"p50": [summary(r)["p50"] for r in (raw_rates, reader_rates, rebuild_rates)]},
            ylabel="events/s",
            errors={"p50": [(min(r), max(r)) for r in (raw_rates, reader_rates, rebuild_rates)]},
        )
    )
    names = list(out["query_ms"])
    section.plots.append(
        bars(
            opts.plot_dir / "project-queries.png",
            f"analyst queries on {total:,} events (p50, min-max)",
            [n.split(":")[0] for n in names],
            {"ms": [statistics.median(out["query_ms"][n]) for n in names]},
            ylabel="ms (log)",
            log=True,
            errors={"ms": [(min(out["query_ms"][n]), max(out["query_ms"][n])) for n in names]},
        )
    )
    return section


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--long-steps", type=int, default=1000)
    parser.add_argument("--queries", action="store_true", help="also time every query of docs/queries.md")
    parser.add_argument("--approaches", action="store_true",
                        help="per-event CPU of each decoding and row-building approach, no server")  # fmt: skip
    args = parser.parse_args(argv)
    if args.approaches:
        samples = approaches(args.events, args.rounds)
        print(table(approach_rows(samples)))
        return {"approaches": samples}
    with tempfile.TemporaryDirectory(prefix="runledger-bench-project-") as tmp:
        out = asyncio.run(
            measure(
                args.events, args.rounds, args.long_steps, Path(tmp), queries=doc_queries() if args.queries else None
            )
        )
    print(table(rows_of(out)))
    return out


if __name__ == "__main__":
    main()
