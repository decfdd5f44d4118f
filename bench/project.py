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
  fastest nats-py reader, PITFALLS), until it has every message of the stream;
- the projector's own reader doing nothing with the messages (for transparency);
- rebuild: ``runledger project --rebuild`` in-process (read, decode, fold, Arrow, DuckDB,
  one transaction a batch, swap), events/s and the file size;
- ``checkpoint --at-step K`` of the 1,000-step run, median over K: the ledger's command
  path (``load_run`` + ``fold``) and the projection path (``projections.queries.checkpoint_at``).
Raw reads and rebuilds alternate (``--rounds``) so both see the same machine noise.

    python -m bench.project [--events 1000000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import itertools
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nats.js.api import ConsumerConfig, DeliverPolicy

from bench.common import server, table
from ledger.canonical import canonical_json, digest
from ledger.client import LedgerClient, connect
from ledger.events import GENESIS
from ledger.fold import fold
from ledger.ids import new_id
from ledger.reader import load_run
from ledger.streams import LEDGER_STREAM
from ledger.subjects import effect_msg_id, effect_subject, run_msg_id, run_subject

# -- the workload ---------------------------------------------------------------------------------------

VERSION = {"agent_version": "code:bench", "model": "bench-model-1", "prompt_hash": "p" * 64,
           "tool_schema_hashes": {"lookup_order": "h" * 16, "refund": "r" * 16}}  # fmt: skip
HISTORY = [
    {"role": "system", "content": "You are a support agent for an online shop. Classify each ticket and decide."},
    {"role": "user", "content": "TASK classify\nMy blender arrived broken, I want my money back. Order 8891."},
]
Message = tuple[str, bytes, str]  # subject, data, msg id


_ID_PREFIX = new_id()[:10]
_counter = itertools.count()
_EPOCH = int(time.time())


def _stamp(offset_us: int) -> str:
    seconds, micros = divmod(offset_us, 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(_EPOCH + seconds)) + f".{micros:06d}Z"


class ChainBuilder:
    """Builds the wire bytes of one subject's hash chain, as ``ledger.events.make_event`` does.

    Faster than ``make_event`` (no pydantic models, one canonical encoding: the hash member
    is spliced in after "agent", the first key of the canonical form); a unit test decodes
    its output with ``ledger.events.decode``.
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
        message = (self.subject, data, self.msg_id(self.seq))
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
    ledger_key = ChainBuilder(effect_subject(key), run_id, agent, lambda s: effect_msg_id(key, s))
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
    ``publish_async`` futures can hang, PITFALLS) in chunks; after each chunk the stream's
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
        await client.nc.flush()
        stored += len(batch)
        deadline = time.monotonic() + 20
        while (await client.js.stream_info(LEDGER_STREAM)).state.messages < stored:
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
    from projections.reader import PullReader

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


async def run_bench(events: int, rounds: int, long_steps: int, work: Path) -> list[list[str]]:
    from projections.projector import rebuild
    from projections.queries import checkpoint_at
    from projections.store import ProjectionStore

    rows: list[list[str]] = [["measure", "value", "note"]]
    with server(sync_always=False) as state:
        client = await connect(state.url)
        try:
            t0 = time.perf_counter()
            published = await publish_raw(client, workload(events))
            published += await publish_raw(client, iter(long_run(long_steps)))
            info = await client.js.stream_info(LEDGER_STREAM)
            total = int(info.state.messages)
            assert total == published, f"stream holds {total} of {published} published messages"
            rows.append(["events published", f"{total:,}", f"{info.state.bytes / total:.0f} B avg, "
                         f"{time.perf_counter() - t0:.0f} s to publish"])  # fmt: skip

            raw_s, rebuild_s, own_s = [], [], []
            db = work / "bench.duckdb"
            for _ in range(rounds):
                raw_s.append(await raw_read(client, total))
                own_s.append(await projector_reader_only(client, total))
                started = time.perf_counter()
                result = await rebuild(client, db)
                rebuild_s.append(time.perf_counter() - started)
                assert result.events + result.quarantined == total, result
            raw_rate = total / statistics.median(raw_s)
            rebuild_rate = total / statistics.median(rebuild_s)
            rows.append(["raw nats-py read", f"{raw_rate:,.0f} ev/s", "ordered push consumer, counting callback"])
            rows.append(["projector reader alone", f"{total / statistics.median(own_s):,.0f} ev/s",
                         "pull consumer parsed from the socket, no decode"])  # fmt: skip
            rows.append(["rebuild", f"{rebuild_rate:,.0f} ev/s",
                         f"median of {rounds}: {statistics.median(rebuild_s):.1f} s incl. swap"])  # fmt: skip
            rows.append(["rebuild / raw read", f"{rebuild_rate / raw_rate:.0%}", "goal: 70% or more"])
            rows.append(["DuckDB file", f"{db.stat().st_size / 1e6:,.1f} MB",
                         f"{db.stat().st_size / total:,.0f} B an event"])  # fmt: skip

            ks = random.Random(7).sample(range(long_steps), 21)
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
            rows.append([f"checkpoint --at-step ({long_steps} steps)", f"{statistics.median(ledger_ms):.1f} ms",
                         "median, ledger path: read the run from NATS + fold"])  # fmt: skip
            rows.append(["checkpoint at step (projection)", f"{statistics.median(db_ms):.1f} ms",
                         "median, read the run from DuckDB + fold; goal: < 50 ms"])  # fmt: skip
        finally:
            await client.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--long-steps", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="runledger-bench-project-") as tmp:
        rows = asyncio.run(run_bench(args.events, args.rounds, args.long_steps, Path(tmp)))
    print(table(rows))


if __name__ == "__main__":
    main()
