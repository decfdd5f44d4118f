"""Recording one step: the SDK against a raw ``js.publish`` of the same bytes, and against peers.

Workload: R agent runs of S steps cycling model call, read-tool call,
effect (S/3 of each). The model call sends a 2 KiB message history delta (one user message of
2,048 bytes plus a short one) and gets a short scripted reply with token usage; the tool call
has a ~200-byte argument and a ~200-byte result; the effect (an idempotency key unique to the
run and step) has a ~100-byte argument and result. Each system does the same durable work per
step, and every step is timed from the call to its return:

- **SDK**: ``run.model`` / ``run.tool`` (an ``inline`` tool: no worker thread) / ``run.effect``
  with the default data policy (redacted, sealed): the event is built, hashed, published with msg
  id and fence and acked.
  An effect is four publishes and two round trips: the claim on the key (fenced: first claim wins;
  it carries the intent, and the run's fence is checked by a read in flight with it), then the
  outcome on the key; it returns once the key holds the outcome, and the intent and outcome on the
  run (the third and fourth publishes) are acknowledged before the run's next event (the key's
  subject is read only when the claim is refused).
- **raw js.publish**: the bytes the SDK stored for that step, published one message at a
  time with ``js.publish`` and no headers (1 message for a model or tool step, 4 for an
  effect step), to a fresh subject of the same stream.
- **LangGraph SqliteSaver** and **eventsourcing SQLite**: see ``bench.peers`` (one checkpoint
  ``put`` / one event saved per step; the LangGraph checkpoint carries the growing message list).
- **LangGraph PostgresSaver** and **DBOS step** on a private PostgreSQL (``bench.postgres``,
  ``fsync=on``, ``synchronous_commit=on``): the same ``put`` per step; one ``@DBOS.step()`` per step
  inside one ``@DBOS.workflow()`` per run. Without PostgreSQL they are reported as not measured.
- **LangGraph RunledgerSaver**: LangGraph's saver on runledger (``runledger.integrations.langgraph``)
  doing the same ``put`` (``aput``) as LangGraph's own two savers, on the same ledger server.

The systems are interleaved step by step: after each SDK step the others record the same
step, in an order rotated every step, so all see the same machine noise; ratios are computed
run by run. The raw publisher sends the bytes the SDK stored for the same step of the
previous run (same content and sizes; only ids, times, hashes and the seal differ).
The embedded nats-server fsyncs before acking (``sync_interval: always``) unless
``--no-fsync``; ``--compare-fsync`` also measures a raw publish against a server with the
default 2-minute sync interval, which is what durability costs.

**Parallel mix** (parallel tool calls of one model turn): R runs of T turns, each turn one model
call (the same 2 KiB history delta and reply) followed by 8 read-tool calls (~200-byte argument and
result each) issued together with ``asyncio.gather``. The run takes step numbers in call order and
its one writer appends the steps one at a time (each fenced on the one before). Timed: the turn
(model call start to the gather's end), the model call, the gather of the 8 tool calls (its start
to its end), and each tool step from the gather's start to its return. Baseline: raw
``js.publish`` of the 9 messages the SDK stored for the same turn of the previous run, the model's
message awaited, then the 8 tool messages either awaited one by one or all 8 in flight at once
(``asyncio.gather`` of ``js.publish``), timed the same way. Interleaved turn by turn (after each
SDK turn, the two raw variants in an order rotated every turn); ratios computed run by run.

    python -m bench.record [--rounds 20] [--steps 60] [--turns 10] [--mix both|sequential|parallel]
                           [--no-peers] [--compare-fsync]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import jetstream_sync, server, summary, table
from bench.peers import (
    MISSING,
    DBOSPeer,
    DBOSRun,
    EventSourcingPeer,
    LangGraphPeer,
    LangGraphPostgresPeer,
    LangGraphThread,
    RunledgerSaverPeer,
    Step,
)
from bench.postgres import Postgres, optional_postgres
from bench.report import (
    STAT_COLUMNS,
    Goal,
    Section,
    SuiteOptions,
    Table,
    ratio_cell,
    ratio_stats,
    stat_cells,
)
from runledger import Run
from runledger.log.client import LedgerClient, connect
from runledger.log.reader import read_raw
from runledger.log.subjects import effect_subject, run_subject
from runledger.sdk.agent import AgentSpec
from runledger.sdk.lifecycle import open_run, start_run
from runledger.sdk.models import ModelResponse, ScriptedModel
from runledger.sdk.run import RecordedRun
from runledger.sdk.tools import Tool

KINDS = ("model", "tool", "effect")
HISTORY = [{"role": "user", "content": "x" * 2048}]
ARGS = {"query": "y" * 200}
RESULT = {"rows": "z" * 200}
EFFECT_ARGS = {"order": "order-8891", "amount": 42.5, "note": "n" * 60}
EFFECT_RESULT = {"refund_id": "rf-8891", "amount": 42.5, "status": "done", "note": "m" * 40}
REPLY = ModelResponse(content="ok, next step", input_tokens=512, output_tokens=4)
AGENT = "bench"
# The read tool of both mixes: a sync function that returns at once, declared inline so it runs on the
# event loop (as the recorded lambda always did); a plain sync tool would add a worker-thread hop to
# every call (``Tool.call``), which is the tool's own cost, not the recording's.
READ = Tool("read", lambda args: RESULT, inline=True)
SDK, RAW, LANGGRAPH, EVENTSOURCING = "SDK", "raw js.publish", "LangGraph SqliteSaver", "eventsourcing SQLite"
LANGGRAPH_PG, DBOS_STEP, RL_SAVER = "LangGraph PostgresSaver", "DBOS step", "LangGraph RunledgerSaver"
# The same steps on a run in output durability (``AgentSpec(durability="output")``): acknowledged in
# windows, before each effect's claim; driven by the followers (``open_run``), timed like the others.
SDK_OUTPUT = "SDK, output durability"
SYSTEMS = (SDK, SDK_OUTPUT, RAW, RL_SAVER, LANGGRAPH, LANGGRAPH_PG, DBOS_STEP, EVENTSOURCING)  # the tables' order
OUTPUT_PEERS = (LANGGRAPH, EVENTSOURCING)  # an output-durability step must be 3x faster than each
PEERS = (LANGGRAPH, LANGGRAPH_PG, DBOS_STEP, EVENTSOURCING)  # the SDK's step must be 2x faster than each
POSTGRES_PEERS = (LANGGRAPH_PG, DBOS_STEP)


def kind_of(i: int) -> str:
    return KINDS[i % len(KINDS)]


def step_of(i: int, run_id: str) -> Step:
    """Step ``i`` of a run as the peers record it (the same content the SDK records)."""
    kind = kind_of(i)
    if kind == "model":
        reply = {"content": REPLY.content, "usage": {"input_tokens": 512, "output_tokens": 4}}
        return Step("model", "scripted", [*HISTORY, {"role": "user", "content": f"step {i}"}], reply)
    if kind == "tool":
        return Step("tool", "read", {**ARGS, "i": i}, RESULT)
    return Step("effect", "refund", {**EFFECT_ARGS, "i": i}, EFFECT_RESULT, key=f"refund:{run_id}:{i}")


async def sdk_run(
    client: LedgerClient, run_id: str, steps: int, after_step: Callable[[int], Awaitable[None]] | None = None
) -> list[float]:
    """One SDK run of ``steps`` steps; the time of each step in ms. ``after_step(i)`` runs between steps, untimed."""
    timings: list[float] = []

    async def agent(run: Run) -> None:
        for i in range(steps):
            step = step_of(i, run_id)
            t0 = time.perf_counter()
            if step.kind == "model":
                await run.model(step.args)
            elif step.kind == "tool":
                await run.tool(READ, step.args)
            else:
                assert step.key is not None
                await run.effect("refund", step.args, key=step.key, fn=lambda a: EFFECT_RESULT)
            timings.append((time.perf_counter() - t0) * 1000)
            if after_step is not None:
                await after_step(i)

    spec = AgentSpec(AGENT, agent, ScriptedModel(lambda m: REPLY), agent_version="bench")
    await start_run(client, spec, run_id=run_id)
    return timings


async def _stepped(run: Run) -> None:
    raise AssertionError("the output-durability run is driven step by step (Followers), never as a function")


async def output_step(run: RecordedRun, step: Step) -> float:
    """One step of the step mix on a run in output durability; its time in ms."""
    t0 = time.perf_counter()
    if step.kind == "model":
        await run.model(step.args)
    elif step.kind == "tool":
        await run.tool(READ, step.args)
    else:
        assert step.key is not None
        await run.effect("refund", step.args, key=step.key, fn=lambda a: EFFECT_RESULT)
    return (time.perf_counter() - t0) * 1000


async def stored_steps(client: LedgerClient, run_id: str, steps: int) -> list[list[bytes]]:
    """The bytes the SDK stored for each step, in publish order (run subject and key subjects)."""
    run_records = [r.data for r in await read_raw(client, run_subject(AGENT, run_id))]
    out: list[list[bytes]] = []
    pos = 1  # run.started
    for i in range(steps):
        step = step_of(i, run_id)
        if step.kind != "effect":
            out.append([run_records[pos]])
            pos += 1
            continue
        assert step.key is not None
        key_records = [r.data for r in await read_raw(client, effect_subject(AGENT, step.key))]
        intended, committed = run_records[pos], run_records[pos + 1]
        pos += 2
        out.append([intended, key_records[0], key_records[1], committed])
    for messages in out:  # the grouping above follows the SDK's write order; check it
        types = [json.loads(m)["type"] for m in messages]
        assert types[0] in ("model.called", "tool.called", "effect.intended"), types
    return out


async def raw_step(client: LedgerClient, messages: list[bytes], subject: str) -> float:
    t0 = time.perf_counter()
    for data in messages:
        await client.js.publish(subject, data)
    return (time.perf_counter() - t0) * 1000


def run_id_of(r: int | str) -> str:
    # Every run id has the same length, so the raw baseline's bytes (a previous run's) have the same size.
    return f"bench-record-{r:04d}" if isinstance(r, int) else f"bench-record-{r[:4]:>4}"


@dataclass
class Peers:
    """The peers one measurement records with (None: not measured)."""

    lg: LangGraphPeer | None = None
    es: EventSourcingPeer | None = None
    pg: LangGraphPostgresPeer | None = None
    dbos: DBOSPeer | None = None
    rl: RunledgerSaverPeer | None = None

    def close(self) -> None:
        for peer in (self.lg, self.es, self.pg, self.dbos):
            if peer is not None:
                peer.close()


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


class Followers:
    """Record each step again right after the SDK did: the raw publisher and the peers, each timed.

    ``start()`` (untimed) opens what a run needs before its first step: the DBOS workflow, the
    RunledgerSaver thread's run; ``finish()`` (untimed) ends the DBOS workflow."""

    def __init__(
        self, client: LedgerClient, round_: int, run_id: str, steps: int, baseline: list[list[bytes]], peers: Peers
    ) -> None:
        self.client, self.round, self.run_id, self.steps, self.baseline = client, round_, run_id, steps, baseline
        self.threads: dict[str, LangGraphThread] = {}
        for system, peer in ((LANGGRAPH, peers.lg), (LANGGRAPH_PG, peers.pg), (RL_SAVER, peers.rl)):
            if peer is not None:
                self.threads[system] = peer.thread(f"lg-{run_id}")
        self.es_run = peers.es.run() if peers.es is not None else None
        self.dbos = peers.dbos
        self.dbos_run: DBOSRun | None = None  # the round's DBOS workflow, started by start()
        self.output: RecordedRun | None = None  # the output-durability run, opened by start()
        self.timings: dict[str, list[float]] = {RAW: [], SDK_OUTPUT: [], **{system: [] for system in self.threads}}
        if self.es_run is not None:
            self.timings[EVENTSOURCING] = []
        if self.dbos is not None:
            self.timings[DBOS_STEP] = []

    async def start(self) -> None:
        spec = AgentSpec(AGENT, _stepped, ScriptedModel(lambda m: REPLY), agent_version="bench", durability="output")
        self.output = await open_run(self.client, spec, f"{self.run_id}-out")
        if self.dbos is not None:
            self.dbos_run = self.dbos.run()
        if RL_SAVER in self.threads:
            thread = self.threads[RL_SAVER]
            await thread.saver.run_for(thread.config)

    def finish(self) -> None:
        if self.dbos_run is not None:
            self.dbos_run.finish()

    async def commit(self) -> None:
        """End the output-durability run's last window (untimed)."""
        if self.output is not None:
            await self.output.commit()

    async def after_step(self, i: int) -> None:
        systems = list(self.timings)
        shift = (self.round * self.steps + i) % len(systems)
        step = step_of(i, self.run_id)
        for system in systems[shift:] + systems[:shift]:
            self.timings[system].append(await self._record(system, step, i))

    async def _record(self, system: str, step: Step, i: int) -> float:
        if system == RAW:
            return await raw_step(self.client, self.baseline[i], f"ledger.run.raw.r{self.round}")
        if system == SDK_OUTPUT and self.output is not None:
            return await output_step(self.output, step_of(i, self.output.run_id))
        if system in self.threads:
            thread = self.threads[system]
            new = thread.messages_for(step)  # what the LLM wrapper / ToolNode hand the graph: untimed
            t0 = time.perf_counter()
            if system == RL_SAVER:
                await thread.arecord(new)  # its sync twin must not run on the loop it records from
            else:
                thread.record(new)
            return (time.perf_counter() - t0) * 1000
        if system == DBOS_STEP and self.dbos_run is not None:
            return self.dbos_run.record(step)  # timed in the workflow's thread, around the step call
        if system == EVENTSOURCING and self.es_run is not None:
            es_run = self.es_run
            return _timed(lambda: es_run.record(step))
        raise AssertionError(f"no peer {system!r} in this measurement")


def open_peers(client: LedgerClient, work: Path, pg: Postgres | None) -> Peers:
    """The sqlite peers and the RunledgerSaver, and with ``pg`` the Postgres peers (closed by the caller)."""
    peers = Peers()
    try:
        peers.lg = LangGraphPeer(work / "langgraph.sqlite")
        peers.es = EventSourcingPeer(work / "eventsourcing.sqlite")
        peers.rl = RunledgerSaverPeer(client)
        if pg is not None:
            peers.pg = LangGraphPostgresPeer(pg.create_database("langgraph"))
            peers.dbos = DBOSPeer(pg.url("dbos_bench"))
    except BaseException:
        peers.close()
        raise
    return peers


async def measure(
    url: str, rounds: int, steps: int, peers: bool, work: Path, pg: Postgres | None = None
) -> dict[str, Any]:
    """``rounds`` runs, interleaved step by step. Returns per-system, per-round step timings and pragmas.

    After each SDK step (timed by the agent), the same step is recorded by the raw publisher
    and the peers, each timed, in an order rotated every step. The raw publisher sends the
    bytes the SDK stored for the same step of the previous run (the same content, so the same
    sizes: only ids, times, hashes and the seal differ; the first run uses a warm-up run's).
    With ``pg`` (a private PostgreSQL), LangGraph's PostgresSaver and DBOS steps are measured too.
    """
    client = await connect(url)
    timings: dict[str, list[list[float]]] = defaultdict(list)  # [system][round] = ms per step, in step order
    try:
        opened = open_peers(client, work, pg) if peers else Peers()
    except BaseException:
        await client.close()
        raise
    try:
        # Warm up every path (connections, stream lookups, sqlite files, imports, page cache); the
        # warm-up run's bytes are the raw baseline of the first run.
        warm_id = run_id_of("warm")
        await sdk_run(client, warm_id, steps)
        previous = await stored_steps(client, warm_id, steps)
        for messages in previous[:6]:
            await raw_step(client, messages, "ledger.run.raw.warm")
        warm = Followers(client, -1, warm_id, steps, previous, opened)
        await warm.start()
        for i in range(6):
            for system in warm.timings:
                if system != RAW:
                    await warm._record(system, step_of(i, warm_id), i)
        warm.finish()
        await warm.commit()
        for r in range(rounds):
            run_id = run_id_of(r)
            followers = Followers(client, r, run_id, steps, previous, opened)
            await followers.start()
            timings[SDK].append(await sdk_run(client, run_id, steps, followers.after_step))
            followers.finish()
            await followers.commit()
            for system, values in followers.timings.items():
                timings[system].append(values)
            previous = await stored_steps(client, run_id, steps)
        pragmas = (
            {LANGGRAPH: opened.lg.pragmas(), EVENTSOURCING: opened.es.pragmas()} if opened.lg and opened.es else {}
        )
        settings = opened.pg.settings() if opened.pg is not None else {}
        return {"timings": dict(timings), "pragmas": pragmas, "postgres": settings, "steps": steps, "rounds": rounds}
    finally:
        await client.close()
        opened.close()


def analyse(raw: dict[str, Any]) -> dict[str, Any]:
    """Per system and kind ("all", "model", "tool", "effect"): pooled stats, and SDK/system ratios per round."""
    timings: dict[str, list[list[float]]] = raw["timings"]
    steps = raw["steps"]
    kinds = ["all", *KINDS]
    out: dict[str, Any] = {"stats": {}, "ratios": {}, "steps": steps, "rounds": raw["rounds"]}
    for system, per_round in timings.items():
        out["stats"][system] = {k: summary([v for rnd in per_round for v in _pick(rnd, k)]) for k in kinds}
    out["ratios"] = _ratios_of(timings, SDK, tuple(system for system in timings if system != SDK), kinds)
    # Output durability against the peers (and the SDK's step durability, the raw publish), run by run.
    out["output"] = _ratios_of(timings, SDK_OUTPUT, (SDK, RAW, *OUTPUT_PEERS), kinds)
    # Issue 15: LangGraph's saver on runledger against LangGraph's own savers, the same put, run by run.
    out["savers"] = _ratios_of(timings, RL_SAVER, (LANGGRAPH, LANGGRAPH_PG), kinds)
    # Issue 31: an effect step against one raw publish (the raw tool step: one ~200-byte message), run by run.
    out["effect_vs_one_publish"] = {
        system: ratio_stats(
            [
                (summary(_pick(m, "effect"))["p50"], summary(_pick(r, "tool"))["p50"])
                for m, r in zip(timings[system], timings[RAW], strict=True)
            ]
        )
        for system in (SDK, SDK_OUTPUT)
        if system in timings and RAW in timings
    }
    return out


# Why issue 31's goals of this part are missed on a 2-core machine, from the profiles of that round.
WHY_STEP = (
    "the SDK's own CPU on top of the publish: 0.22-0.29 ms a model or tool step on a quiet machine, about half "
    "of it protecting the content (redaction and sealing under the default data policy; the raw baseline "
    "publishes bytes that are already redacted and sealed) and a third building the event (canonical JSON, "
    "hash chain, ids); the encoding was already cut (msgspec canonical JSON, each value encoded once)."
)
WHY_EFFECT = (
    "an effect writes two fsynced events before it returns (the key's claim, which carries the intent, with "
    "the run's fence checked by a direct get in flight with it; then the outcome on the key), and builds and "
    "seals four events (~0.5 ms of CPU); the run's intent and outcome are written after it returns."
)
WHY_OUTPUT = (
    "two thirds of the mix are model and tool steps, which in output durability wait for no ack, so the "
    "mix's p50 is their CPU (0.22-0.29 ms: content protection and event building), not a round trip; "
    "eventsourcing's 0.74 ms step would need 0.25 ms."
)


def effect_goal(result: dict[str, Any]) -> Goal:
    """An effect step in two round trips: its p50 at most 2.2x one raw publish's."""
    name = "effect step p50 at most 2.2x one raw js.publish (two round trips)"
    ratios = result.get("effect_vs_one_publish", {})
    if SDK not in ratios:
        return Goal(name, None, "not measured")
    output = ratios.get(SDK_OUTPUT)
    return Goal(
        name,
        ratios[SDK]["p50"] <= 2.2,
        f"SDK effect p50 / raw one-message p50 = {ratio_cell(ratios[SDK])}"
        + (f"; in output durability {ratio_cell(output)}" if output else "")
        + ". One raw publish: the raw tool step (one ~200-byte message, awaited).",
        WHY_EFFECT,
    )


def _pick(values: list[float], kind: str) -> list[float]:
    return values if kind == "all" else [v for i, v in enumerate(values) if kind_of(i) == kind]


def _ratios_of(
    timings: dict[str, list[list[float]]], mine: str, others: tuple[str, ...], kinds: list[str]
) -> dict[str, dict[str, Any]]:
    """``mine``'s p50 over each of ``others``' p50, run by run, per step kind (systems not measured left out)."""
    return {
        other: {
            k: ratio_stats(
                [
                    (summary(_pick(m, k))["p50"], summary(_pick(t, k))["p50"])
                    for m, t in zip(timings[mine], timings[other], strict=True)
                ]
            )
            for k in kinds
        }
        for other in others
        if mine in timings and other in timings
    }


def output_goals(result: dict[str, Any]) -> list[Goal]:
    """Output durability's step against LangGraph's SqliteSaver and eventsourcing (3x faster, p50)."""
    ratios = result.get("output", {})
    goals = []
    for peer in OUTPUT_PEERS:
        name = f"output-durability step at least 3x faster than {peer} (p50)"
        if peer not in ratios:
            goals.append(Goal(name, None, "not measured: the peers were not measured"))
            continue
        r = ratios[peer]
        against = ", ".join(f"{k} {1 / r[k]['p50']:.2f}x" for k in KINDS)
        vs_sdk = ratios.get(SDK, {}).get("all")
        goals.append(
            Goal(
                name,
                1 / r["all"]["p50"] >= 3.0,
                f"{peer} / output p50 = {1 / r['all']['p50']:.2f}x over the step mix (output / peer "
                f"{ratio_cell(r['all'])}); per kind: {against}"
                + (f"; output / step durability {ratio_cell(vs_sdk)}" if vs_sdk else "")
                + ". Model and tool steps wait for no ack (their window is committed before the next effect's "
                "claim, which that effect step pays).",
                WHY_OUTPUT,
            )
        )
    return goals


# -- the parallel mix: one model call, then 8 tool calls gathered ------------------------------------------

FANOUT = 8
RAW_SEQ, RAW_GATHER = "raw js.publish, one by one", "raw js.publish, 8 in flight"
# What is timed in a turn, and how the tables name it. "steps": one value per tool call.
MEASURES = {
    "turn": "turn: model + 8 tools",
    "model": "model call",
    "tools": "8 tool calls (first call to last return)",
    "steps": "tool step (from the gather's start)",
}


def par_run_id_of(r: int | str) -> str:
    # As run_id_of: one length for every run id, so the raw baseline's bytes have the same size.
    return f"bench-parall-{r:04d}" if isinstance(r, int) else f"bench-parall-{r[:4]:>4}"


def turn_messages(t: int) -> list[dict[str, Any]]:
    return [*HISTORY, {"role": "user", "content": f"turn {t:04d}"}]


def tool_args(t: int, j: int) -> dict[str, Any]:
    return {**ARGS, "turn": t, "call": j}


def _turn(t0: float, t1: float, t2: float, steps: list[float]) -> dict[str, Any]:
    """A turn's timings in ms: model call from ``t0`` to ``t1``, the tools from ``t1`` to ``t2``."""
    return {"turn": (t2 - t0) * 1000, "model": (t1 - t0) * 1000, "tools": (t2 - t1) * 1000, "steps": steps}


async def _since(t0: float, call: Awaitable[Any]) -> float:
    """Await ``call``; the ms from ``t0`` (the gather's start) to its return."""
    await call
    return (time.perf_counter() - t0) * 1000


async def sdk_parallel_run(
    client: LedgerClient, run_id: str, turns: int, after_turn: Callable[[int], Awaitable[None]] | None = None
) -> list[dict[str, Any]]:
    """One SDK run of ``turns`` turns (a model call, then 8 tool calls gathered); each turn's timings."""
    timings: list[dict[str, Any]] = []

    async def agent(run: Run) -> None:
        for t in range(turns):
            t0 = time.perf_counter()
            await run.model(turn_messages(t))
            t1 = time.perf_counter()
            calls = [run.tool(READ, tool_args(t, j)) for j in range(FANOUT)]
            steps = await asyncio.gather(*(_since(t1, call) for call in calls))
            timings.append(_turn(t0, t1, time.perf_counter(), list(steps)))
            if after_turn is not None:
                await after_turn(t)

    spec = AgentSpec(AGENT, agent, ScriptedModel(lambda m: REPLY), agent_version="bench")
    result = await start_run(client, spec, run_id=run_id)
    if result.status != "completed":
        raise RuntimeError(f"parallel-mix run {run_id} ended {result.status}: {result.error}")
    return timings


async def stored_turns(client: LedgerClient, run_id: str, turns: int) -> list[list[bytes]]:
    """The bytes the SDK stored for each turn, in append order: the model call, then the 8 tool calls."""
    records = [r.data for r in await read_raw(client, run_subject(AGENT, run_id))]
    size = 1 + FANOUT
    out = [records[1 + t * size : 1 + (t + 1) * size] for t in range(turns)]  # records[0]: run.started
    for messages in out:
        types = [json.loads(m)["type"] for m in messages]
        assert types == ["model.called", *["tool.called"] * FANOUT], types
    return out


async def raw_turn(client: LedgerClient, messages: list[bytes], subject: str, in_flight: bool) -> dict[str, Any]:
    """The turn's messages by raw ``js.publish``: the model's awaited, then the tools' one by one
    or all in flight at once; timed as the SDK's turn is."""
    t0 = time.perf_counter()
    await client.js.publish(subject, messages[0])
    t1 = time.perf_counter()
    if in_flight:
        steps = list(await asyncio.gather(*(_since(t1, client.js.publish(subject, m)) for m in messages[1:])))
    else:
        steps = []
        for data in messages[1:]:
            await client.js.publish(subject, data)
            steps.append((time.perf_counter() - t1) * 1000)
    return _turn(t0, t1, time.perf_counter(), steps)


def raw_turns_after(
    client: LedgerClient, round_: int, turns: int, baseline: list[list[bytes]], out: dict[str, list[dict[str, Any]]]
) -> Callable[[int], Awaitable[None]]:
    """What runs after each SDK turn: the same turn by both raw variants, in an order rotated every turn."""

    async def after_turn(t: int) -> None:
        systems = list(out)
        shift = (round_ * turns + t) % len(systems)
        for system in systems[shift:] + systems[:shift]:
            subject = f"ledger.run.raw.p{round_}"
            out[system].append(await raw_turn(client, baseline[t], subject, system == RAW_GATHER))

    return after_turn


async def measure_parallel(url: str, rounds: int, turns: int) -> dict[str, Any]:
    """``rounds`` runs of the parallel mix, interleaved turn by turn with the raw publishes of the
    bytes the SDK stored for the same turn of the previous run (the first run: a warm-up run's)."""
    client = await connect(url)
    timings: dict[str, list[list[dict[str, Any]]]] = defaultdict(list)  # [system][round] = turns
    try:
        warm_id = par_run_id_of("warm")
        await sdk_parallel_run(client, warm_id, turns)
        previous = await stored_turns(client, warm_id, turns)
        for messages in previous[:2]:
            for in_flight in (False, True):
                await raw_turn(client, messages, "ledger.run.raw.pwarm", in_flight)
        for r in range(rounds):
            raw_times: dict[str, list[dict[str, Any]]] = {RAW_SEQ: [], RAW_GATHER: []}
            after_turn = raw_turns_after(client, r, turns, previous, raw_times)
            run_id = par_run_id_of(r)
            timings[SDK].append(await sdk_parallel_run(client, run_id, turns, after_turn))
            for system, values in raw_times.items():
                timings[system].append(values)
            previous = await stored_turns(client, run_id, turns)
        return {"timings": dict(timings), "turns": turns, "rounds": rounds, "fanout": FANOUT}
    finally:
        await client.close()


def analyse_parallel(raw: dict[str, Any]) -> dict[str, Any]:
    """Per system and measure: pooled stats, and SDK/system ratios of the p50s run by run."""
    timings: dict[str, list[list[dict[str, Any]]]] = raw["timings"]

    def values(turns: list[dict[str, Any]], measure: str) -> list[float]:
        return [v for turn in turns for v in (turn[measure] if measure == "steps" else [turn[measure]])]

    out: dict[str, Any] = {"stats": {}, "ratios": {}, "turns": raw["turns"], "rounds": raw["rounds"]}
    for system, per_round in timings.items():
        out["stats"][system] = {m: summary([v for rnd in per_round for v in values(rnd, m)]) for m in MEASURES}
        if system == SDK:
            continue
        out["ratios"][system] = {
            m: ratio_stats(
                [
                    (summary(values(sdk, m))["p50"], summary(values(other, m))["p50"])
                    for sdk, other in zip(timings[SDK], per_round, strict=True)
                ]
            )
            for m in MEASURES
        }
    return out


def parallel_rows(result: dict[str, Any], cells: Callable[[dict[str, float]], list[str]]) -> list[list[str]]:
    rows = []
    for system in (SDK, RAW_SEQ, RAW_GATHER):
        for m, label in MEASURES.items():
            ratio = "" if system == SDK else ratio_cell(result["ratios"][system][m])
            rows.append([system, label, *cells(result["stats"][system][m]), ratio])
    return rows


def parallel_goal(result: dict[str, Any]) -> Goal:
    seq, gathered = result["ratios"][RAW_SEQ], result["ratios"][RAW_GATHER]
    return Goal(
        "SDK's 8 parallel tool calls (gather) p50 within 1.5x of raw js.publish of the same bytes, one by one",
        seq["tools"]["p50"] <= 1.5,
        f"SDK / raw one by one p50 = {ratio_cell(seq['tools'])} for the gather of 8 tool calls, "
        f"{ratio_cell(seq['turn'])} for the whole turn (model + 8 tools); against raw with 8 in flight: "
        f"{ratio_cell(gathered['tools'])} and {ratio_cell(gathered['turn'])} (the run's writer appends one "
        "at a time, each fenced on the one before).",
    )


def run_suite(opts: SuiteOptions) -> Section:
    rounds, steps, turns = (2, 6, 2) if opts.quick else (20, 60, 10)
    with (
        tempfile.TemporaryDirectory(prefix="runledger-bench-record-") as tmp,
        server() as state,
        optional_postgres() as (pg, pg_reason),
    ):
        raw = asyncio.run(measure(state.url, rounds, steps, True, Path(tmp), pg))
        parallel = analyse_parallel(asyncio.run(measure_parallel(state.url, rounds, turns)))
        sync = jetstream_sync(state)
    result = analyse(raw)
    stats, ratios = result["stats"], result["ratios"]
    section = Section(
        part="record",
        title="recording a step",
        data={**result, "pragmas": raw["pragmas"], "postgres": raw["postgres"], "parallel": parallel},
    )
    section.workload = (
        f"{rounds} agent runs of {steps} steps, cycling model call, read-tool call, effect (a third each). Model "
        "call: a 2 KiB message history delta (one 2,048-byte user message and a short one) and a short scripted "
        "reply with token usage. Tool call: ~200-byte argument, ~200-byte result. Effect: ~100-byte argument and "
        "result, a new idempotency key each time. Interleaved step by step: after each SDK step, the same step is "
        "recorded by each of the others, in an order rotated every step, and every step is timed from the call "
        "to its return. SDK: `run.model` / `run.tool` / `run.effect` with the default data policy (redacted, "
        "sealed). raw: `js.publish`, one message at a time, no headers, of the bytes the SDK stored for the same "
        "step of the previous run (same content and sizes; only ids, times, hashes and the seal differ): 1 message "
        "a model or tool step, 4 an effect step (the SDK's claim and outcome on the key, intent and outcome on the "
        "run; an effect returns once the key holds its outcome, and the run's two are acknowledged before the "
        "run's next event). LangGraph: `SqliteSaver.put` of the thread's checkpoint per step, carrying "
        "the whole message list so far (langchain-core messages: human + AI per model step, AI tool call + tool "
        "message per tool or effect step), as `MessagesState` does; building the messages is not timed, "
        "`put_writes` is left out (both favour LangGraph). eventsourcing: one event per step triggered on an "
        "`Aggregate`, `app.save(agg)` per step. LangGraph PostgresSaver: the same `put` on a private PostgreSQL "
        "(a cluster the bench starts in a temp dir). DBOS: one `@DBOS.step()` per step (it returns the reply or the "
        "tool's result, which DBOS records) inside one `@DBOS.workflow()` per run, on DBOS's system database in the "
        "same PostgreSQL; the step is timed in the workflow's thread around the step call, DBOS's launch and the "
        "workflow's start are not timed. LangGraph RunledgerSaver: LangGraph's saver on runledger "
        "(`runledger.integrations.langgraph`) doing the same `put` (`aput`) as LangGraph's own savers, on the same "
        "nats-server as the SDK (the thread's run is opened before the first step, untimed). Ratios are computed "
        "run by run (p50 of the SDK's steps in the run over p50 of the other's). "
        f"**Parallel mix**: {rounds} runs of {turns} turns, each turn one model call (the same 2 KiB delta and "
        f"reply) followed by {FANOUT} read-tool calls (~200-byte argument and result each) issued together with "
        "`asyncio.gather`, as an agent runs the parallel tool calls of one model turn (the run takes step numbers "
        "in call order; its one writer appends them one at a time). Timed: the turn (model call start to the "
        "gather's end), the model call, the gather of the tool calls, and each tool step from the gather's start "
        "to its return. raw: `js.publish` of the 9 messages the SDK stored for the same turn of the previous "
        f"run, the model's awaited, then the {FANOUT} tool messages either awaited one by one or all in flight "
        "at once (`asyncio.gather` of `js.publish`), timed the same way; interleaved turn by turn (the two raw "
        "variants after each SDK turn, in an order rotated every turn), ratios computed run by run."
    )
    pr = raw["pragmas"]
    section.notes.append(
        f"Durability. runledger: the embedded nats-server's `jetstream {{ {sync} }}` (fsync before every ack). "
        + "; ".join(
            f"{name}: sqlite `journal_mode={p['journal_mode']}`, `synchronous={p['synchronous']}`"
            for name, p in pr.items()
        )
        + " (read from the peers' own connections; FULL in WAL mode syncs the log at every commit)"
        + (
            "; PostgreSQL "
            + ", ".join(f"`{k}={v}`" for k, v in raw["postgres"].items())
            + " (read from the PostgresSaver's connection: a commit returns once its WAL is flushed)"
            if raw["postgres"]
            else f"; LangGraph PostgresSaver and DBOS step: not measured: {pg_reason}"
        )
        + ". So every system has the step on disk when the call returns. LangGraph, DBOS and eventsourcing "
        "record an effect's outcome after the fact (one write); runledger claims the key before acting (at most "
        "once across processes), which is why an effect step is four publishes in two round trips."
    )
    rows = []
    for system in SYSTEMS:
        if system not in stats:
            continue
        for k in ("all", *KINDS):
            ratio = "" if system == SDK else ratio_cell(ratios[system][k])
            rows.append([system, k, *stat_cells(stats[system][k]), ratio])
    columns = ["system", "step", *STAT_COLUMNS, "SDK / system p50"]
    section.tables.append(Table("ms per step (all rounds pooled)", columns, rows))
    if result["savers"]:
        section.tables.append(
            Table(
                "LangGraph checkpoint put per step: RunledgerSaver / LangGraph's own saver (p50, run by run)",
                ["saver", *("all", *KINDS)],
                [[other, *(ratio_cell(r[k]) for k in ("all", *KINDS))] for other, r in result["savers"].items()],
            )
        )
    section.tables.append(
        Table(
            f"ms per turn, parallel mix: 1 model call + {FANOUT} tool calls gathered (all rounds pooled)",
            ["system", "measure", *STAT_COLUMNS, "SDK / system p50"],
            parallel_rows(parallel, stat_cells),
        )
    )
    raw_ratio = ratios[RAW]["all"]["p50"]
    section.goals.append(
        Goal(
            "SDK step p50 within 1.10x of raw js.publish of the same bytes",
            raw_ratio <= 1.10,
            f"SDK / raw p50 = {ratio_cell(ratios[RAW]['all'])} over the step mix; per kind: "
            + ", ".join(f"{k} {ratios[RAW][k]['p50']:.2f}x" for k in KINDS)
            + ".",
            WHY_STEP,
        )
    )
    section.goals.append(effect_goal(result))
    section.goals.append(parallel_goal(parallel))
    section.goals.extend(output_goals(result))
    section.notes.append(
        "SDK, output durability: the same steps, interleaved with the others, on a second run opened with "
        '`AgentSpec(durability="output")` (default window: 64 events, 50 ms). A model or tool step returns once '
        "its event is built, hashed and in the window; the window is acknowledged (fenced single publishes "
        "below 8 events, else one atomic batch fenced on its first message) in the background and before each "
        "effect's claim, which that effect step waits for. A crash loses at most the window's model and tool "
        "steps (run again on resume, their model calls charged again), never an effect."
    )
    for peer in PEERS:
        if peer not in ratios:
            reason = pg_reason if peer in POSTGRES_PEERS else "the peers were not measured"
            section.goals.append(
                Goal(f"SDK step at least 2x faster than {peer} (p50)", None, f"not measured: {reason}")
            )
            continue
        r = ratios[peer]["all"]["p50"]
        speedup = 1 / r
        section.goals.append(
            Goal(
                f"SDK step at least 2x faster than {peer} (p50)",
                speedup >= 2.0,
                f"{peer} / SDK p50 = {speedup:.2f}x over the step mix (SDK / peer {ratio_cell(ratios[peer]['all'])}); "
                + "per kind: "
                + ", ".join(f"{k} {1 / ratios[peer][k]['p50']:.2f}x" for k in KINDS)
                + ".",
            )
        )
    from bench.plots import bars, latency_cdf

    series = {s: [v for rnd in raw["timings"][s] for v in rnd] for s in raw["timings"]}
    section.plots.append(latency_cdf(opts.plot_dir / "record-cdf.png", "ms per recorded step (step mix)", series))
    section.plots.append(
        bars(
            opts.plot_dir / "record-p50.png",
            "p50 ms per step, by step kind",
            list(KINDS),
            {s: [stats[s][k]["p50"] for k in KINDS] for s in stats},
            ylabel="ms (p50)",
        )
    )
    return section


# -- the module's own command line --------------------------------------------------------------------------


async def raw_only(url: str, n: int) -> list[float]:
    client = await connect(url)
    try:
        data = [b"x" * 2400]
        for _ in range(100):
            await raw_step(client, data, "ledger.run.warm.x")
        return [await raw_step(client, data, "ledger.run.rawonly.x") for _ in range(n)]
    finally:
        await client.close()


def fmt(s: dict[str, float]) -> list[str]:
    return [f"{s['p50']:.3f}", f"{s['p99']:.3f}", f"{s['min']:.3f}", f"{s['max']:.3f}", str(int(s["n"]))]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=60, help="steps per run (a multiple of 3 keeps the mix even)")
    parser.add_argument("--turns", type=int, default=10, help="turns per run of the parallel mix")
    parser.add_argument(
        "--mix", choices=("both", "sequential", "parallel"), default="both", help="which step mix to measure"
    )
    parser.add_argument("--no-peers", action="store_true", help="SDK and raw publish only (no LangGraph/eventsourcing)")
    parser.add_argument("--no-fsync", action="store_true")
    parser.add_argument("--compare-fsync", action="store_true")
    args = parser.parse_args(argv)
    peers = not args.no_peers
    with (
        tempfile.TemporaryDirectory(prefix="runledger-bench-record-") as tmp,
        server(sync_always=not args.no_fsync) as state,
        optional_postgres() if peers and args.mix != "parallel" else contextlib.nullcontext((None, "")) as (pg, why),
    ):
        if why:
            print(f"LangGraph PostgresSaver and DBOS step: not measured: {why}")
        raw: dict[str, Any] | None = None
        if args.mix != "parallel":
            try:
                raw = asyncio.run(measure(state.url, args.rounds, args.steps, peers, Path(tmp), pg))
            except RuntimeError as exc:
                if str(exc) != MISSING:
                    raise
                print(f"{exc}; measuring the SDK against the raw publish only")
                raw = asyncio.run(measure(state.url, args.rounds, args.steps, False, Path(tmp)))
        parallel = None
        if args.mix != "sequential":
            parallel = analyse_parallel(asyncio.run(measure_parallel(state.url, args.rounds, args.turns)))
    result: dict[str, Any] = analyse(raw) if raw is not None else {}
    header = ["system", "step", "p50 ms", "p99 ms", "min ms", "max ms", "n", "SDK / system p50"]
    rows = [header]
    for system, per_kind in result.get("stats", {}).items():
        for k, s in per_kind.items():
            ratio = "" if system == SDK else ratio_cell(result["ratios"][system][k])
            rows.append([system, k, *fmt(s), ratio])
    if args.compare_fsync:
        with server(sync_always=False) as state:
            lazy = summary(asyncio.run(raw_only(state.url, args.rounds * args.steps)))
        with server(sync_always=True) as state:
            synced = summary(asyncio.run(raw_only(state.url, args.rounds * args.steps)))
        rows += [
            ["raw, fsync each ack", "2.4 KB", *fmt(synced), ""],
            ["raw, fsync every 2 min", "2.4 KB", *fmt(lazy), ""],
        ]
        result["fsync_cost_p50_ms"] = synced["p50"] - lazy["p50"]
    if len(rows) > 1:
        print(f"sequential mix: {args.rounds} runs of {args.steps} steps (model call, read-tool call, effect)")
        print(table(rows))
    if raw is not None:
        print(f"\nSDK p50 / raw p50 = {result['ratios'][RAW]['all']['p50']:.2f}x  (goal: <= 1.10x)")
        for peer in PEERS:
            if peer in result["ratios"]:
                print(f"{peer} p50 / SDK p50 = {1 / result['ratios'][peer]['all']['p50']:.2f}x  (goal: >= 2x)")
    if "fsync_cost_p50_ms" in result:
        print(f"fsync before ack costs {result['fsync_cost_p50_ms']:.3f} ms at p50")
    if parallel is not None:
        result["parallel"] = parallel
        print(
            f"\nparallel mix: {args.rounds} runs of {args.turns} turns "
            f"(1 model call + {FANOUT} tool calls gathered), ms per turn"
        )
        print(table([["system", "measure", *header[2:]], *parallel_rows(parallel, fmt)]))
        goal = parallel_goal(parallel)
        print(f"\n{goal.text}: {'met' if goal.met else 'MISSED'}. {goal.detail}")
    return result


if __name__ == "__main__":
    main()
