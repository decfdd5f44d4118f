"""Load: many concurrent agents recording through the SDK, on one node or a 3-node cluster.

Workload, one run (20 steps; sizes drawn from a generator seeded by the run's number, so
every level sees the same mix):

- step 0 and step 19: ``run.now()``;
- 5 rounds of: a model call, two read-tool calls (``search``, ``fetch``); after rounds 2
  and 4 an effect (``update_ticket``, a write tool whose idempotency key is
  ``ticket:<run>:<n>``, ~150 B of arguments, ~60 B of result);
- step 18: a last model call (the answer).
- Model calls (6 a run) carry the conversation so far: a 400 B system prompt, then ~2 KiB
  more per call (the assistant's ~300 B reply and ~1.7 KiB of tool output), so requests are
  ~2, 4, 6, 8, 10, 12 KiB; replies come from a ``ScriptedModel`` (~300 B of text, token
  counts of about 4 characters a token).
- Read tools: arguments 200 B-2 KiB and results 200 B-2 KiB (uniform); they slice a fixed corpus
  and return, so they are declared ``inline`` (called on the event loop, no worker thread), as
  bench/record.py's read tool is: the SDK's recording is measured, not a thread hop per call.
- Think time between steps: ``--think-ms`` (default 0: the agents are as fast as the log).
- Defaults on: redaction (``capture=redacted``), sealing under a per-run key (one KV write
  a run), blobs above 64 KiB (none here). Every step is published with msg id and fence and
  the server fsyncs before acking.

What one run stores: 24 events on its run subject (run.started, 18 one-event steps, 2 x 2
for the effects, run.completed), 4 on the two effect-key subjects, 1 run key in the KV
bucket. Each effect also reads its key subject once (a direct get).

Measured, per target (``node``: one embedded nats-server; ``cluster``: a local 3-node
cluster, replicas 3) and per concurrency level (``--agents 1,10,50``), ``--rounds`` times
alternating:

- SDK: N agents (asyncio tasks sharing one connection per process, split over ``--procs``
  processes) start runs back to back for ``--duration`` seconds (runs in flight at the end
  are finished and counted, not cancelled) or ``--runs`` runs each. Steps/s counts the steps
  acknowledged inside the window, aggregated over agents; step latency is from the Run API
  call to its return (for an effect: claim, act, commit, mirror).
- raw: the same N tasks over the same processes, each awaiting ``js.publish`` of the 28
  messages a run stores (the bytes of a warm-up run, cycled), no headers, to a subject of
  its own in a stream ``LOADRAW`` configured like ``LEDGER`` (file storage, same replicas),
  for the same duration. This is what NATS and nats-py cost without runledger.

Then, once per target: bytes per step in the stream (``stream_info`` deltas), how fast
readers drain the whole stream (nats-py's ordered consumer; the projector's own reader) and
a DuckDB projection of it (events/s, bytes an event).

    python -m bench.load [--target node|cluster|both] [--nats URL] [--agents 1,10,50]
                         [--procs 2] [--duration 6] [--rounds 2] [--json out.json] [--plot out.png]

With ``--nats URL`` (a throwaway server please: runs of agent ``loadbench`` stay in its
immutable stream) the stream ``LOADRAW`` is created and deleted again.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import nats
from nats.js.api import StorageType, StreamConfig
from nats.js.errors import NotFoundError

from bench.common import pct, server, table
from bench.cpu import process_cpu
from runledger import Run
from runledger.log.client import LedgerClient, connect
from runledger.log.subjects import KEY_STREAM, LEDGER_STREAM
from runledger.sdk.agent import AgentSpec
from runledger.sdk.lifecycle import start_run
from runledger.sdk.models import ModelResponse, ScriptedModel
from runledger.sdk.tools import Tool

AGENT = "loadbench"
RAW_STREAM = "LOADRAW"
STEPS_PER_RUN = 20
ROUNDS_PER_RUN = 5
EFFECT_AFTER = (1, 3)  # after the 2nd and 4th round

_WORDS = [
    "order", "refund", "parcel", "customer", "ticket", "blender", "broken", "invoice", "address", "shipping",
    "delivery", "warehouse", "status", "payment", "card", "amount", "currency", "policy", "return", "window",
    "days", "label", "carrier", "tracking", "number", "reply", "thanks", "please", "check", "account",
]  # fmt: skip
# A fixed corpus to slice text from: building strings must not be what the benchmark measures.
_CORPUS = " ".join(random.Random(1).choice(_WORDS) for _ in range(40_000))
SYSTEM = {"role": "system", "content": _CORPUS[:400]}


def text(rng: random.Random, size: int) -> str:
    start = rng.randrange(0, len(_CORPUS) - size)
    return _CORPUS[start : start + size]


def _reply(messages: list[dict[str, Any]]) -> ModelResponse:
    rng = random.Random(len(messages))
    content = text(rng, 300)
    prompt_chars = sum(len(str(m.get("content", ""))) for m in messages)
    return ModelResponse(content=content, input_tokens=prompt_chars // 4, output_tokens=len(content) // 4)


def _search(args: dict[str, Any]) -> dict[str, Any]:
    return {"rows": text(random.Random(args["seed"]), args["result_size"])}


def _update(args: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, "ticket": args["ticket"], "version": args["n"]}


# -- the agent ------------------------------------------------------------------------------------------


@dataclass
class Collector:
    """Every acknowledged step of one process: (wall time of the ack, latency ms, kind)."""

    samples: list[tuple[float, float, str]] = field(default_factory=list)

    def add(self, kind: str, started: float) -> None:
        now = time.perf_counter()
        self.samples.append((time.time(), (now - started) * 1000, kind))


def make_spec(collector: Collector, think_ms: float = 0.0) -> AgentSpec:
    """The load agent: the step mix of the module docstring, each step timed into ``collector``."""
    search = Tool("search", _search, inline=True)
    fetch = Tool("fetch", _search, inline=True)
    update = Tool("update_ticket", _update, effect_class="write", key=lambda a: f"ticket:{a['ticket']}:{a['n']}")

    async def think() -> None:
        if think_ms > 0:
            await asyncio.sleep(think_ms / 1000)

    async def agent(run: Run) -> dict[str, Any]:
        rng = random.Random(run.input["seed"])
        history: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": text(rng, 1600)}]
        t0 = time.perf_counter()
        await run.now()
        collector.add("clock", t0)
        effects = 0
        for r in range(ROUNDS_PER_RUN):
            await think()
            t0 = time.perf_counter()
            reply = await run.model(history)
            collector.add("model", t0)
            outputs = []
            for tool in (search, fetch):
                await think()
                args = {"q": text(rng, rng.randint(200, 2048)), "seed": rng.randrange(1 << 30)}
                args["result_size"] = rng.randint(200, 2048)
                t0 = time.perf_counter()
                outputs.append(await run.tool(tool, args))
                collector.add("tool", t0)
            if r in EFFECT_AFTER:
                await think()
                effects += 1
                t0 = time.perf_counter()
                await run.tool(update, {"ticket": run.run_id, "n": effects, "note": text(rng, 100)})
                collector.add("effect", t0)
            # The conversation grows by ~2 KiB a model call: the reply and some of the tool output.
            history = [
                *history,
                {"role": "assistant", "content": reply.content},
                {"role": "tool", "content": "".join(o["rows"] for o in outputs)[:1700]},
            ]
        await think()
        t0 = time.perf_counter()
        answer = await run.model(history)
        collector.add("model", t0)
        t0 = time.perf_counter()
        await run.now()
        collector.add("clock", t0)
        return {"answer": answer.content[:80]}

    return AgentSpec(AGENT, agent, ScriptedModel(_reply, name="scripted-load"), tools=[search, fetch, update],
                     prompt=SYSTEM["content"], agent_version="bench-load")  # fmt: skip


# -- one process of a phase -----------------------------------------------------------------------------


@dataclass
class ProcJob:
    url: str
    mode: str  # "sdk" | "raw"
    agents: int
    proc: int
    tag: str
    duration: float
    runs: int | None  # runs per agent; None: for ``duration`` seconds
    think_ms: float = 0.0
    payloads: list[bytes] = field(default_factory=list)


@dataclass
class ProcResult:
    samples: list[tuple[float, float, str]]
    completed: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)
    cpu_s: float = 0.0  # CPU time of this load process during the phase


async def _sdk_agents(client: LedgerClient, job: ProcJob, start: float) -> ProcResult:
    collector = Collector()
    spec = make_spec(collector, job.think_ms)
    result = ProcResult(samples=collector.samples)
    deadline = start + job.duration

    async def one_agent(a: int) -> None:
        i = 0
        while (i < job.runs) if job.runs is not None else (time.time() < deadline):
            run_id = f"{job.tag}-p{job.proc}-a{a}-r{i}"
            seed = hash((job.proc, a, i)) & 0x7FFFFFFF
            i += 1
            result.run_ids.append(run_id)
            try:
                outcome = await start_run(client, spec, {"seed": seed}, run_id=run_id)
            except Exception as exc:  # counted and reported: a load test must see every failure
                result.failed += 1
                _note(result, f"{type(exc).__name__}: {exc}")
                continue
            if outcome.status == "completed":
                result.completed += 1
            else:
                result.failed += 1
                _note(result, f"{outcome.status}: {outcome.error}")

    await asyncio.gather(*(one_agent(a) for a in range(job.agents)))
    return result


async def _raw_agents(client: LedgerClient, job: ProcJob, start: float) -> ProcResult:
    result = ProcResult(samples=[])
    deadline = start + job.duration
    n = len(job.payloads)

    async def one_task(a: int) -> None:
        subject = f"loadraw.{job.tag}.p{job.proc}.a{a}"
        limit = None if job.runs is None else job.runs * n
        i = a  # each task starts at a different message of the cycle
        sent = 0
        while (sent < limit) if limit is not None else (time.time() < deadline):
            data = job.payloads[i % n]
            i += 1
            sent += 1
            t0 = time.perf_counter()
            try:
                await client.js.publish(subject, data, timeout=5.0)
            except (TimeoutError, nats.errors.Error) as exc:
                result.failed += 1
                _note(result, f"{type(exc).__name__}: {exc}")
                continue
            result.samples.append((time.time(), (time.perf_counter() - t0) * 1000, "raw"))
        result.completed += 1

    await asyncio.gather(*(one_task(a) for a in range(job.agents)))
    return result


def _note(result: ProcResult, message: str) -> None:
    if len(result.errors) < 5 and message not in result.errors:
        result.errors.append(message[:300])


async def _run_job(job: ProcJob, start_at: Any = None) -> tuple[float, ProcResult]:
    client = await connect(job.url)
    try:
        if start_at is None:
            start = time.time()
        else:  # (ready queue, go event, shared start time) of a multi-process phase
            ready, go, start_value = start_at
            ready.put(job.proc)
            await asyncio.to_thread(go.wait)
            start = start_value.value
        runner = _sdk_agents if job.mode == "sdk" else _raw_agents
        cpu = time.process_time()
        result = await runner(client, job, start)
        result.cpu_s = time.process_time() - cpu
        return start, result
    finally:
        await client.close()


def _child(job: ProcJob, ready: Any, go: Any, start_value: Any, out: Any) -> None:
    try:
        start, result = asyncio.run(_run_job(job, (ready, go, start_value)))
        out.put((job.proc, start, asdict(result)))
    except BaseException as exc:
        ready.put(job.proc)  # never leave the parent waiting for a process that died
        out.put((job.proc, 0.0, {"error": f"{type(exc).__name__}: {exc}"}))
        raise


# -- a phase: one mode at one level, over one or more processes ----------------------------------------


@dataclass
class PhaseResult:
    mode: str
    agents: int
    procs: int
    window_s: float  # the measurement window (duration, or start to last ack with --runs)
    total_s: float  # start to the last ack (includes finishing runs in flight)
    steps_in_window: int
    steps: int
    completed: int
    failed: int
    latencies: list[float]
    kinds: dict[str, list[float]]
    errors: list[str]
    run_ids: list[str]
    stream_msgs: int = 0
    stream_bytes: int = 0
    key_bytes: int = 0
    client_cpu_s: float = 0.0  # the load processes' CPU time
    server_cpu_s: float = 0.0  # the nats-server processes' CPU time (when their pids are known)

    @property
    def rate(self) -> float:
        return self.steps_in_window / self.window_s if self.window_s > 0 else 0.0


def split(agents: int, procs: int) -> list[int]:
    procs = max(1, min(procs, agents))
    return [agents // procs + (1 if i < agents % procs else 0) for i in range(procs)]


def run_phase(
    url: str,
    mode: str,
    agents: int,
    *,
    procs: int = 1,
    duration: float = 6.0,
    runs: int | None = None,
    think_ms: float = 0.0,
    payloads: list[bytes] | None = None,
    tag: str | None = None,
    server_pids: Sequence[int] = (),
) -> PhaseResult:
    """Run ``agents`` concurrent agents (``mode`` sdk) or raw publishers (``mode`` raw) once."""
    tag = tag or f"{mode}{agents}x{uuid.uuid4().hex[:6]}"
    shares = split(agents, procs)
    jobs = [ProcJob(url, mode, n, p, tag, duration, runs, think_ms, list(payloads or [])) for p, n in enumerate(shares)]
    before = asyncio.run(_stream_state(url))
    server_cpu = cpu_seconds(server_pids)
    outputs: list[tuple[int, float, dict[str, Any]]] = []
    if len(jobs) == 1:
        start, res = asyncio.run(_run_job(jobs[0]))
        outputs.append((0, start, asdict(res)))
    else:
        outputs = _run_processes(jobs)
    server_cpu = cpu_seconds(server_pids) - server_cpu
    after = asyncio.run(_stream_state(url))
    failures = [o[2]["error"] for o in outputs if "error" in o[2]]
    if failures:
        raise RuntimeError(f"a load process died: {failures[0]}")
    start = min(o[1] for o in outputs)
    samples = [tuple(s) for o in outputs for s in o[2]["samples"]]
    last = max((s[0] for s in samples), default=start)
    window = duration if runs is None else max(last - start, 1e-9)
    kinds: dict[str, list[float]] = {}
    for _, ms, kind in samples:
        kinds.setdefault(str(kind), []).append(float(ms))
    return PhaseResult(
        mode=mode,
        agents=agents,
        procs=len(jobs),
        window_s=window,
        total_s=max(last - start, 1e-9),
        steps_in_window=sum(1 for s in samples if runs is not None or s[0] <= start + duration),
        steps=len(samples),
        completed=sum(o[2]["completed"] for o in outputs),
        failed=sum(o[2]["failed"] for o in outputs),
        latencies=[float(s[1]) for s in samples],
        kinds=kinds,
        errors=[e for o in outputs for e in o[2]["errors"]][:5],
        run_ids=[r for o in outputs for r in o[2]["run_ids"]],
        stream_msgs=after[0] - before[0],
        stream_bytes=after[1] - before[1],
        key_bytes=after[2] - before[2],
        client_cpu_s=sum(o[2]["cpu_s"] for o in outputs),
        server_cpu_s=server_cpu,
    )


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU seconds of ``pids`` so far (Linux /proc; 0 for a pid that is gone)."""
    return sum(cpu for cpu in map(process_cpu, pids) if cpu is not None)


def _run_processes(jobs: list[ProcJob]) -> list[tuple[int, float, dict[str, Any]]]:
    ctx = mp.get_context("spawn")  # no fork of a process that may hold event loops and sockets
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    start_value = ctx.Value("d", 0.0)
    procs = [ctx.Process(target=_child, args=(job, ready, go, start_value, out), daemon=True) for job in jobs]
    for p in procs:
        p.start()
    try:
        for _ in jobs:
            ready.get(timeout=120)
        start_value.value = time.time()
        go.set()
        outputs = [out.get(timeout=600) for _ in jobs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return outputs


async def _stream_state(url: str) -> tuple[int, int, int]:
    async with await connect(url) as client:
        info = await client.js.stream_info(LEDGER_STREAM)
        try:
            keys = int((await client.js.stream_info(KEY_STREAM)).state.bytes)
        except NotFoundError:
            keys = 0
        return int(info.state.messages), int(info.state.bytes), keys


# -- a target: warm up, the levels, the capacity measurements -------------------------------------------


async def prepare(url: str) -> tuple[list[bytes], dict[str, Any]]:
    """One warm-up run; its stored messages become the raw baseline's payloads. Creates LOADRAW."""
    async with await connect(url) as client:
        ledger = await client.js.stream_info(LEDGER_STREAM)
        first = int(ledger.state.last_seq) + 1
        spec = make_spec(Collector())
        result = await start_run(client, spec, {"seed": 7}, run_id=f"warmup-{uuid.uuid4().hex[:8]}")
        assert result.status == "completed", result
        last = int((await client.js.stream_info(LEDGER_STREAM)).state.last_seq)
        payloads = [bytes((await client.js.get_msg(LEDGER_STREAM, seq)).data or b"") for seq in range(first, last + 1)]
        cfg = ledger.config
        with contextlib.suppress(NotFoundError):
            await client.js.delete_stream(RAW_STREAM)
        await client.js.add_stream(
            StreamConfig(
                name=RAW_STREAM,
                subjects=["loadraw.>"],
                storage=StorageType.FILE,
                num_replicas=cfg.num_replicas,
                duplicate_window=cfg.duplicate_window,
                allow_direct=True,
                max_msg_size=cfg.max_msg_size,
            )
        )
        ledger = await client.js.stream_info(LEDGER_STREAM)
        raw = await _colocate(client, RAW_STREAM, ledger.cluster.leader if ledger.cluster else None)
        placement = {
            "replicas": cfg.num_replicas,
            "ledger_leader": ledger.cluster.leader if ledger.cluster else None,
            "raw_leader": raw.cluster.leader if raw.cluster else None,
            "connected_to": (getattr(client.nc, "_server_info", None) or {}).get("server_name"),
        }
        return payloads, placement


async def _colocate(client: LedgerClient, stream: str, leader: str | None) -> Any:
    """Move ``stream``'s leader to ``leader`` (LEDGER's), so raw and SDK publishes take the same path.

    A publish goes to the stream leader through whichever node the client is connected to:
    with leaders on different nodes the raw baseline would pay an extra hop the SDK does not."""
    info = await client.js.stream_info(stream)
    for _ in range(10):
        if leader is None or info.cluster is None or info.cluster.leader == leader:
            return info
        request = json.dumps({"placement": {"preferred": leader}}).encode()
        with contextlib.suppress(TimeoutError, nats.errors.Error):
            await client.nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", request, timeout=5)
        for _ in range(50):
            await asyncio.sleep(0.1)
            with contextlib.suppress(TimeoutError, nats.errors.Error):
                info = await client.js.stream_info(stream)
                if info.cluster is not None and info.cluster.leader:
                    break
    return info


async def _drop_raw(url: str) -> None:
    async with await connect(url) as client:
        with contextlib.suppress(NotFoundError):
            await client.js.delete_stream(RAW_STREAM)


async def _readers(url: str, work: Path) -> dict[str, Any]:
    """How fast readers drain the whole LEDGER stream: what a projector catching up can do."""
    from bench.project import projector_reader_only, raw_read
    from runledger.projections.projector import project

    async with await connect(url) as client:
        info = await client.js.stream_info(LEDGER_STREAM)
        total = int(info.state.messages)
        out: dict[str, Any] = {"messages": total, "bytes": int(info.state.bytes)}
        out["ordered_consumer_msg_s"] = total / await raw_read(client, total)
        out["projector_reader_msg_s"] = total / await projector_reader_only(client, total)
        db = work / "load.duckdb"
        result = await project(client, db)
        out["projection_events_s"] = result.rate
        out["projection_events"] = result.events + result.quarantined
        out["duckdb_bytes"] = db.stat().st_size
        out["duckdb_bytes_per_event"] = db.stat().st_size / max(1, result.events + result.quarantined)
        return out


async def shard_probe(
    url: str, payloads: list[bytes], *, tasks: int = 50, shards: Sequence[int] = (1, 2, 4), duration: float = 5.0
) -> dict[int, float]:
    """Raw publish rate of ``tasks`` publishers spread over 1, 2, 4 streams (configured like LEDGER).

    Tells whether a stream, not the server, is the write limit: with ``sync_interval: always``
    each stream syncs its own file store, so a stream-per-shard layout may write more."""
    out: dict[int, float] = {}
    async with await connect(url) as client:
        cfg = (await client.js.stream_info(LEDGER_STREAM)).config
        for k in shards:
            names = [f"LOADSHARD{i}" for i in range(k)]
            for i, name in enumerate(names):
                with contextlib.suppress(NotFoundError):
                    await client.js.delete_stream(name)
                await client.js.add_stream(
                    StreamConfig(name=name, subjects=[f"loadshard{i}.>"], storage=StorageType.FILE,
                                 num_replicas=cfg.num_replicas, duplicate_window=cfg.duplicate_window)
                )  # fmt: skip
            acked = 0
            deadline = time.monotonic() + duration

            async def publisher(t: int, k: int = k, deadline: float = deadline) -> None:
                nonlocal acked
                i = t
                while time.monotonic() < deadline:
                    i += 1
                    with contextlib.suppress(TimeoutError, nats.errors.Error):
                        await client.js.publish(f"loadshard{t % k}.t{t}", payloads[i % len(payloads)], timeout=5.0)
                        acked += 1

            started = time.monotonic()
            await asyncio.gather(*(publisher(t) for t in range(tasks)))
            out[k] = acked / (time.monotonic() - started)
            for name in names:
                await client.js.delete_stream(name)
    return out


@contextlib.contextmanager
def target_url(target: str, *, sync_always: bool = True) -> Iterator[tuple[str, list[int]]]:
    """A fresh throwaway ``node`` (embedded nats-server) or ``cluster`` (3 local nodes), fsync before
    ack: its URL and its server pids."""
    if target == "node":
        with server(sync_always=sync_always) as state:
            yield state.url, [state.pid]
        return
    from runledger.log.cluster import LocalCluster

    with tempfile.TemporaryDirectory(prefix="runledger-bench-load-") as tmp:
        cluster = LocalCluster(home=Path(tmp) / "home")
        try:
            nodes = cluster.start(size=3, data_dir=Path(tmp) / "data", sync_always=sync_always)
            yield nodes.url, [n.pid for n in nodes.nodes]
        finally:
            cluster.stop()


def _summ(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": 0.0, "p99": 0.0, "max": 0.0, "n": 0}
    return {"p50": statistics.median(values), "p99": pct(values, 0.99), "max": max(values), "n": len(values)}


def measure_target(
    url: str,
    levels: list[int],
    *,
    procs: int,
    duration: float,
    runs: int | None,
    rounds: int,
    think_ms: float,
    capacity: bool,
    label: str,
    drop_raw: bool = True,
    server_pids: Sequence[int] = (),
) -> dict[str, Any]:
    """Every level on one server: SDK and raw phases alternating, ``rounds`` times each."""
    payloads, placement = asyncio.run(prepare(url))
    out: dict[str, Any] = {"target": label, "placement": placement, "levels": []}
    try:
        for agents in levels:
            sdk_phases: list[PhaseResult] = []
            raw_phases: list[PhaseResult] = []
            for _ in range(rounds):
                common: dict[str, Any] = {"procs": procs, "duration": duration, "runs": runs,
                                          "server_pids": server_pids}  # fmt: skip
                sdk_phases.append(run_phase(url, "sdk", agents, think_ms=think_ms, **common))
                raw_phases.append(run_phase(url, "raw", agents, payloads=payloads, **common))
                _progress(label, sdk_phases[-1], raw_phases[-1])
            out["levels"].append(_level(agents, sdk_phases, raw_phases))
        if capacity:
            with tempfile.TemporaryDirectory(prefix="runledger-bench-load-db-") as tmp:
                out["readers"] = asyncio.run(_readers(url, Path(tmp)))
            out["shards_raw_msg_s"] = asyncio.run(shard_probe(url, payloads, tasks=max(levels)))
    finally:
        if drop_raw:
            asyncio.run(_drop_raw(url))
    return out


def _level(agents: int, sdk: list[PhaseResult], raw: list[PhaseResult]) -> dict[str, Any]:
    steps = sum(p.steps for p in sdk)
    msgs = sum(p.stream_msgs for p in sdk)
    runs_done = sum(p.completed for p in sdk)
    kinds: dict[str, list[float]] = {}
    for p in sdk:
        for k, v in p.kinds.items():
            kinds.setdefault(k, []).extend(v)
    sdk_rate = statistics.median(p.rate for p in sdk)
    raw_rate = statistics.median(p.rate for p in raw)
    sdk_lat = _summ([x for p in sdk for x in p.latencies])
    raw_lat = _summ([x for p in raw for x in p.latencies])
    events_per_step = msgs / steps if steps else 0.0
    return {
        "agents": agents,
        "procs": sdk[0].procs,
        "rounds": len(sdk),
        "window_s": sdk[0].window_s,
        "steps_s": sdk_rate,
        "steps_s_rounds": [p.rate for p in sdk],
        "events_s": sdk_rate * events_per_step,
        "step_ms": sdk_lat,
        "step_ms_by_kind": {k: _summ(v) for k, v in sorted(kinds.items())},
        "steps": steps,
        "runs_completed": runs_done,
        "runs_failed": sum(p.failed for p in sdk),
        "errors": [e for p in sdk for e in p.errors][:5],
        "slow_steps_over_1s": sum(1 for p in sdk for x in p.latencies if x > 1000),
        "stream_msgs": msgs,
        "events_per_step": events_per_step,
        "stream_bytes_per_step": sum(p.stream_bytes for p in sdk) / steps if steps else 0.0,
        "stream_bytes_per_msg": sum(p.stream_bytes for p in sdk) / msgs if msgs else 0.0,
        "key_bytes_per_run": sum(p.key_bytes for p in sdk) / runs_done if runs_done else 0.0,
        "raw_msgs_s": raw_rate,
        "raw_msgs_s_rounds": [p.rate for p in raw],
        "raw_ms": raw_lat,
        "raw_failed": sum(p.failed for p in raw),
        "raw_errors": [e for p in raw for e in p.errors][:5],
        "events_s_over_raw": (sdk_rate * events_per_step) / raw_rate if raw_rate else 0.0,
        "step_p50_over_raw_p50": sdk_lat["p50"] / raw_lat["p50"] if raw_lat["p50"] else 0.0,
        # Where the time goes: CPU per step in the load processes and in the server(s).
        "client_cpu_ms_per_step": 1000 * sum(p.client_cpu_s for p in sdk) / steps if steps else 0.0,
        "server_cpu_ms_per_step": 1000 * sum(p.server_cpu_s for p in sdk) / steps if steps else 0.0,
        "client_cores": sum(p.client_cpu_s for p in sdk) / sum(p.total_s for p in sdk),
        "server_cores": sum(p.server_cpu_s for p in sdk) / sum(p.total_s for p in sdk),
        "raw_client_cpu_ms_per_msg": 1000 * sum(p.client_cpu_s for p in raw) / max(1, sum(p.steps for p in raw)),
        "raw_server_cpu_ms_per_msg": 1000 * sum(p.server_cpu_s for p in raw) / max(1, sum(p.steps for p in raw)),
    }


def _progress(label: str, sdk: PhaseResult, raw: PhaseResult) -> None:
    lat = _summ(sdk.latencies)
    print(
        f"  {label:8} {sdk.agents:3} agents x{sdk.procs}p: {sdk.rate:7.0f} steps/s p50 {lat['p50']:6.2f} ms "
        f"p99 {lat['p99']:7.2f} ms | raw {raw.rate:7.0f} msg/s | runs {sdk.completed} ok {sdk.failed} failed",
        file=sys.stderr,
        flush=True,
    )


# -- reports --------------------------------------------------------------------------------------------


def report(results: list[dict[str, Any]]) -> str:
    rows = [["target", "agents", "procs", "steps/s", "events/s", "step p50", "step p99", "step max",
             "runs ok/failed", "raw msg/s", "raw p50", "raw p99", "events/s ÷ raw"]]  # fmt: skip
    for res in results:
        for lv in res["levels"]:
            s, r = lv["step_ms"], lv["raw_ms"]
            rows.append([
                res["target"], str(lv["agents"]), str(lv["procs"]), f"{lv['steps_s']:,.0f}", f"{lv['events_s']:,.0f}",
                f"{s['p50']:.2f} ms", f"{s['p99']:.2f} ms", f"{s['max']:.0f} ms",
                f"{lv['runs_completed']}/{lv['runs_failed']}", f"{lv['raw_msgs_s']:,.0f}",
                f"{r['p50']:.2f} ms", f"{r['p99']:.2f} ms", f"{lv['events_s_over_raw']:.2f}",
            ])  # fmt: skip
    lines = [table(rows), ""]
    cpu = [["target", "agents", "SDK CPU ms/step", "server CPU ms/step", "SDK cores", "server cores",
            "raw client CPU ms/msg", "raw server CPU ms/msg"]]  # fmt: skip
    for res in results:
        for lv in res["levels"]:
            cpu.append([
                res["target"], str(lv["agents"]), f"{lv['client_cpu_ms_per_step']:.2f}",
                f"{lv['server_cpu_ms_per_step']:.2f}", f"{lv['client_cores']:.2f}", f"{lv['server_cores']:.2f}",
                f"{lv['raw_client_cpu_ms_per_msg']:.3f}", f"{lv['raw_server_cpu_ms_per_msg']:.3f}",
            ])  # fmt: skip
    lines.append(table(cpu))
    for res in results:
        lv = res["levels"][-1]
        lines.append(
            f"\n{res['target']}: {lv['events_per_step']:.2f} events a step, "
            f"{lv['stream_bytes_per_step']:,.0f} B a step in LEDGER ({lv['stream_bytes_per_msg']:,.0f} B a message), "
            f"{lv['key_bytes_per_run']:,.0f} B of run key a run; placement {res['placement']}"
        )
        if "readers" in res:
            rd = res["readers"]
            lines.append(
                f"{res['target']}: drain {rd['messages']:,} messages: ordered consumer "
                f"{rd['ordered_consumer_msg_s']:,.0f} msg/s, projector reader {rd['projector_reader_msg_s']:,.0f} "
                f"msg/s, DuckDB projection {rd['projection_events_s']:,.0f} ev/s, "
                f"{rd['duckdb_bytes_per_event']:,.0f} B an event"
            )
        if "shards_raw_msg_s" in res:
            shards = ", ".join(f"{k} stream(s) {v:,.0f}" for k, v in res["shards_raw_msg_s"].items())
            lines.append(
                f"{res['target']}: raw msg/s with {max(lv['agents'] for lv in res['levels'])} publishers over {shards}"
            )
        for lv in res["levels"]:
            if lv["errors"] or lv["raw_errors"]:
                lines.append(f"{res['target']} {lv['agents']} agents errors: {lv['errors'] + lv['raw_errors']}")
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """steps/s and p99 step latency against agents, one line per target (raw dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for res, color in zip(results, ("tab:blue", "tab:orange", "tab:green"), strict=False):
        agents = [lv["agents"] for lv in res["levels"]]
        ax1.plot(
            agents, [lv["steps_s"] for lv in res["levels"]], "o-", color=color, label=f"{res['target']}: SDK steps/s"
        )
        ax1.plot(
            agents, [lv["events_s"] for lv in res["levels"]], "s:", color=color, label=f"{res['target']}: SDK events/s"
        )
        ax1.plot(agents, [lv["raw_msgs_s"] for lv in res["levels"]], "^--", color=color, alpha=0.6,
                 label=f"{res['target']}: raw js.publish msg/s")  # fmt: skip
        ax2.plot(
            agents,
            [lv["step_ms"]["p99"] for lv in res["levels"]],
            "o-",
            color=color,
            label=f"{res['target']}: SDK step p99",
        )
        ax2.plot(
            agents,
            [lv["step_ms"]["p50"] for lv in res["levels"]],
            "s:",
            color=color,
            label=f"{res['target']}: SDK step p50",
        )
        ax2.plot(agents, [lv["raw_ms"]["p99"] for lv in res["levels"]], "^--", color=color, alpha=0.6,
                 label=f"{res['target']}: raw publish p99")  # fmt: skip
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_xlabel("concurrent agents")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    ax1.set_ylabel("per second (aggregate)")
    ax1.set_title("throughput")
    ax2.set_yscale("log")
    ax2.set_ylabel("ms")
    ax2.set_title("latency")
    procs = sorted({lv["procs"] for res in results for lv in res["levels"]})
    fig.suptitle(f"runledger load: 20-step runs, fsync before ack, {'/'.join(map(str, procs))} load process(es)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- entry points ---------------------------------------------------------------------------------------


def run_load(
    *,
    targets: list[str] | None = None,
    url: str | None = None,
    levels: list[int] | None = None,
    procs: int = 2,
    duration: float = 6.0,
    runs: int | None = None,
    rounds: int = 2,
    think_ms: float = 0.0,
    capacity: bool = True,
    fsync: bool = True,
) -> list[dict[str, Any]]:
    """Measure each target (``node``, ``cluster``) or the server at ``url``; one result dict each."""
    levels = levels or [1, 10, 50]
    kw: dict[str, Any] = {"procs": procs, "duration": duration, "runs": runs, "rounds": rounds,
                          "think_ms": think_ms, "capacity": capacity}  # fmt: skip
    results = []
    if url is not None:
        results.append({**measure_target(url, levels, label="server", **kw), "load": os.getloadavg()})
    for target in targets or []:
        with target_url(target, sync_always=fsync) as (target_nats, pids):
            label = target if fsync else f"{target}, no fsync"
            result = measure_target(target_nats, levels, label=label, server_pids=pids, **kw)
            results.append({**result, "load": os.getloadavg()})
    return results


def run_suite(quick: bool = False) -> dict[str, Any]:
    """The ``load`` part of ``python -m bench all``: node and cluster, 1/10/50 agents (quick: node, 1/10)."""
    if quick:
        results = run_load(targets=["node"], levels=[1, 10], procs=1, duration=2.0, rounds=1, capacity=False)
    else:
        results = run_load(targets=["node", "cluster"], levels=[1, 10, 50], procs=2, duration=6.0, rounds=2)
    print(report(results))
    return {"results": results}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", choices=["node", "cluster", "both"], default="node")
    parser.add_argument("--nats", help="measure this server instead of starting one (a throwaway one please)")
    parser.add_argument("--agents", default="1,10,50", help="concurrency levels, comma separated")
    parser.add_argument("--procs", type=int, default=2, help="load processes (agents are split over them)")
    parser.add_argument("--duration", type=float, default=6.0, help="seconds a phase")
    parser.add_argument("--runs", type=int, help="runs per agent instead of a duration")
    parser.add_argument("--rounds", type=int, default=2, help="SDK/raw phase pairs a level")
    parser.add_argument("--think-ms", type=float, default=0.0)
    parser.add_argument("--no-fsync", action="store_true", help="servers with the default sync_interval (2 min)")
    parser.add_argument("--no-capacity", action="store_true", help="skip the reader and DuckDB measurements")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--plot", type=Path, help="write a PNG here (matplotlib)")
    args = parser.parse_args(argv)
    targets = [] if args.nats else (["node", "cluster"] if args.target == "both" else [args.target])
    print(f"load before: {os.getloadavg()}", file=sys.stderr)
    results = run_load(
        targets=targets,
        url=args.nats,
        levels=[int(x) for x in args.agents.split(",") if x.strip()],
        procs=args.procs,
        duration=args.duration,
        runs=args.runs,
        rounds=args.rounds,
        think_ms=args.think_ms,
        capacity=not args.no_capacity,
        fsync=not args.no_fsync,
    )
    print(report(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1, default=str))
    if args.plot:
        plot(results, args.plot)
    return results


if __name__ == "__main__":
    main()
