"""Resume: time from ``resume_run`` to the first new live step, against loading a peer's state.

Workload: runs of 10, 100 and 1,000 recorded steps (alternating model calls with a 2 KiB
message and read-tool calls), then an approval that suspends the run (and, from 256 events,
writes a journal snapshot). After the approval is recorded, ``resume_run`` reads the
snapshot and the events after it (runledger.sdk.snapshot), checks the version tuple,
records ``run.resumed`` (fenced), replays every recorded step from the journal and
reaches the first live step; the clock stops when that step's tool function is entered.
The same resume of a twin run reading every event (``from_snapshot=False``) is measured in
turn with it, in an order that alternates.
"fold" is reading the run back from the stream and folding it (``load_run`` + ``fold``).
"load" is what a resume reads before it writes and replays: ``load_journal`` (the snapshot and
the events after it, checked, folded into the checkpoint: every recorded output by step), the
work DBOS's ``list_workflow_steps`` does; it is measured on the suspended run just before it is
resumed. The baseline is a raw read of the same subject that decodes nothing.

The peers hold the same run (``bench.peers``): a LangGraph thread with one checkpoint per
step (N checkpoints, the latest carrying the whole message list), resumed by loading its
latest checkpoint (``SqliteSaver.get_tuple``); an eventsourcing aggregate of N events,
replayed by ``app.repository.get(id)`` (no snapshots, no cache). On a private PostgreSQL
(``bench.postgres``): the same LangGraph thread in a ``PostgresSaver`` (``get_tuple``), and a DBOS
workflow of N steps whose recorded outputs are read back with ``DBOS.list_workflow_steps`` (one
query; DBOS's own recovery re-executes the workflow and reads the steps one by one, so this favours
DBOS). Without PostgreSQL those two are reported as not measured. Every repeat measures each
system once, in an order that alternates, so ratios are computed repeat by repeat.

    python -m bench.resume [--sizes 10 100 1000] [--repeats 5] [--no-peers]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import server, summary, table
from bench.peers import (
    DBOSPeer,
    EventSourcingPeer,
    EventSourcingRun,
    LangGraphPeer,
    LangGraphPostgresPeer,
    LangGraphThread,
    Step,
)
from bench.postgres import Postgres, optional_postgres
from bench.report import STAT_COLUMNS, Goal, Section, SuiteOptions, Table, ratio_cell, ratio_stats, stat_cells
from runledger import Run
from runledger.log.client import LedgerClient, connect
from runledger.log.reader import read_raw
from runledger.log.subjects import any_agent_run_subject
from runledger.ops.decisions import approve
from runledger.protect.capture import client_opener
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from runledger.sdk.agent import AgentSpec
from runledger.sdk.lifecycle import resume_run, start_run
from runledger.sdk.models import ModelResponse, ScriptedModel
from runledger.sdk.snapshot import SNAPSHOT_MIN_EVENTS, load_journal

REPLY = ModelResponse(content="ok", input_tokens=512, output_tokens=4)
RESUME, FOLD, RAW, LANGGRAPH, EVENTSOURCING = (
    "runledger resume→first live", "runledger load+fold", "raw read", "LangGraph get_tuple", "eventsourcing get",
)  # fmt: skip
LANGGRAPH_PG, DBOS_LOAD = "LangGraph PostgresSaver get_tuple", "DBOS list_workflow_steps"
# The same resume reading every event of the run instead of its journal snapshot (runledger.sdk.snapshot).
RESUME_WHOLE = "runledger resume, whole run read"
# What the resume reads before it writes and replays: the snapshot and the tail, checked and folded.
LOAD = "runledger load (snapshot+tail)"
SYSTEMS = (RESUME, RESUME_WHOLE, LOAD, FOLD, RAW, LANGGRAPH, LANGGRAPH_PG, DBOS_LOAD, EVENTSOURCING)  # tables' order
PEERS = (LANGGRAPH, LANGGRAPH_PG, DBOS_LOAD, EVENTSOURCING)
POSTGRES_PEERS = (LANGGRAPH_PG, DBOS_LOAD)


def step_of(i: int) -> Step:
    """Step ``i`` of the workload, as the peers record it (the content the SDK records)."""
    if i % 2 == 0:
        reply = {"content": REPLY.content, "usage": {"input_tokens": 512, "output_tokens": 4}}
        return Step("model", "scripted", [{"role": "user", "content": "x" * 2048}, {"role": "user", "content": str(i)}],
                    reply)  # fmt: skip
    return Step("tool", "read", {"i": i}, {"ok": i})


def make_spec(steps: int, live_at: list[float]) -> AgentSpec:
    async def agent(run: Run) -> None:
        for i in range(steps):
            step = step_of(i)
            if step.kind == "model":
                await run.model(step.args)
            else:
                await run.tool("read", step.args, fn=lambda a: {"ok": a["i"]})
        await run.approval("continue", None)
        await run.tool("first-live", None, fn=lambda a: live_at.append(time.perf_counter()))

    return AgentSpec("bench-resume", agent, ScriptedModel(lambda m: REPLY), agent_version="bench")


@dataclass
class PostgresPeers:
    """The Postgres peers, open for a whole measurement (DBOS is one per process)."""

    lg: LangGraphPostgresPeer
    dbos: DBOSPeer

    @classmethod
    def open(cls, pg: Postgres) -> PostgresPeers:
        lg = LangGraphPostgresPeer(pg.create_database("langgraph"))
        try:
            return cls(lg, DBOSPeer(pg.url("dbos_bench")))
        except BaseException:
            lg.close()
            raise

    def close(self) -> None:
        try:
            self.dbos.close()
        finally:
            self.lg.close()


@dataclass
class Loaders:
    """Each peer's load of one run of ``steps`` steps, built by ``build_peers``; ``close()`` its stores."""

    steps: int
    load: dict[str, Callable[[], float]] = field(default_factory=dict)  # each returns the ms it took
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for close in self.closers:
            close()


def build_peers(steps: int, work: Path, pg: PostgresPeers | None = None) -> Loaders:
    """A LangGraph thread (sqlite, and with ``pg`` Postgres), an eventsourcing aggregate and (with ``pg``)
    a DBOS workflow holding the same ``steps`` steps.

    The LangGraph threads are written with sqlite's ``synchronous=OFF`` / Postgres's
    ``synchronous_commit=off`` (only their reads are measured; 1,000 growing checkpoints take long
    enough already) and set back to FULL / on afterwards.
    """
    out = Loaders(steps)
    lg = LangGraphPeer(work / f"langgraph-{steps}.sqlite")
    out.closers.append(lg.close)
    es = EventSourcingPeer(work / f"eventsourcing-{steps}.sqlite")
    out.closers.append(es.close)
    lg.set_synchronous("OFF")
    threads: list[LangGraphThread] = [lg.thread(f"resume-{steps}")]
    if pg is not None:
        pg.lg.set_synchronous_commit("off")
        threads.append(pg.lg.thread(f"resume-{steps}"))
    run: EventSourcingRun = es.run()
    for i in range(steps):
        step = step_of(i)
        for thread in threads:
            thread.record(thread.messages_for(step))
        run.record(step)
    lg.set_synchronous("FULL")
    lg_thread = threads[0]
    out.load[LANGGRAPH] = lambda: _timed(lg_thread.load_latest)
    out.load[EVENTSOURCING] = lambda: _timed(run.load)
    if pg is not None:
        pg.lg.set_synchronous_commit("on")
        pg_thread = threads[1]
        out.load[LANGGRAPH_PG] = lambda: _timed(pg_thread.load_latest)
        dbos, workflow_id = pg.dbos, pg.dbos.build([step_of(i) for i in range(steps)])
        out.load[DBOS_LOAD] = lambda: dbos.load(workflow_id, steps)
    return out


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


async def one_size(
    client: LedgerClient, steps: int, repeats: int, work: Path | None, pg: PostgresPeers | None = None
) -> dict[str, Any]:
    live_at: list[float] = []
    spec = make_spec(steps, live_at)
    samples: dict[str, list[float]] = {RESUME: [], RESUME_WHOLE: [], FOLD: [], RAW: []}
    snapshotted = steps >= SNAPSHOT_MIN_EVENTS  # a run this long suspends with a journal snapshot
    if snapshotted:
        samples[LOAD] = []
    peers = build_peers(steps, work, pg) if work is not None else None
    if peers is not None:
        for name, load in peers.load.items():
            samples[name] = []
            load()  # warm each (page cache, imports, connections), as the stream is warm
    try:
        for r in range(repeats):
            run_id, whole_id = f"resume-{steps}-{r}", f"resume-whole-{steps}-{r}"
            for rid in (run_id, whole_id):  # twins: one resumed from its snapshot, one read whole
                first = await start_run(client, spec, run_id=rid)
                await approve(client, rid, first.pending[0], by="bench")

            async def resume_ms(rid: str, from_snapshot: bool) -> float:
                live_at.clear()
                t0 = time.perf_counter()
                result = await resume_run(client, spec, rid, from_snapshot=from_snapshot)
                assert result.status == "completed" and live_at, result
                return (live_at[0] - t0) * 1000

            def measure_peers() -> None:
                if peers is not None:
                    for name, load in peers.load.items():
                        samples[name].append(load())

            if r % 2 == 1:
                measure_peers()
            t0 = time.perf_counter()
            raws = await read_raw(client, any_agent_run_subject(run_id))
            samples[RAW].append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            fold((await load_run(client, run_id)).records)
            samples[FOLD].append((time.perf_counter() - t0) * 1000)
            if snapshotted:
                t0 = time.perf_counter()
                loaded = await load_journal(client, run_id, spec.name, client_opener(client))
                samples[LOAD].append((time.perf_counter() - t0) * 1000)
                assert loaded is not None, f"run {run_id} has no usable journal snapshot"
            if r % 2 == 1:
                samples[RESUME_WHOLE].append(await resume_ms(whole_id, False))
            samples[RESUME].append(await resume_ms(run_id, True))
            if r % 2 == 0:
                samples[RESUME_WHOLE].append(await resume_ms(whole_id, False))
            assert len(raws) > steps
            if r % 2 == 0:
                measure_peers()
    finally:
        if peers is not None:
            peers.close()
    return {"steps": steps, "samples": samples, **{name: summary(v) for name, v in samples.items()}}


async def measure(
    url: str, sizes: list[int], repeats: int, work: Path | None, pg: Postgres | None = None
) -> list[dict[str, Any]]:
    """Each size in turn; the sqlite peers with ``work``, and the Postgres peers with ``work`` and ``pg``."""
    client = await connect(url)
    pg_peers = PostgresPeers.open(pg) if pg is not None and work is not None else None
    try:
        return [await one_size(client, n, repeats, work, pg_peers) for n in sizes]
    finally:
        await client.close()
        if pg_peers is not None:
            pg_peers.close()


def paired(result: dict[str, Any], a: str, b: str) -> dict[str, float]:
    return ratio_stats(list(zip(result["samples"][a], result["samples"][b], strict=True)))


def run_suite(opts: SuiteOptions) -> Section:
    sizes, repeats = ([10, 30], 2) if opts.quick else ([10, 100, 1000], 5)
    with (
        tempfile.TemporaryDirectory(prefix="runledger-bench-resume-") as tmp,
        server() as state,
        optional_postgres() as (pg, pg_reason),
    ):
        results = asyncio.run(measure(state.url, sizes, repeats, Path(tmp), pg))
    section = Section(part="resume", title="resuming a run",
                      data={"results": [{k: v for k, v in r.items() if k != "samples"} for r in results]})  # fmt: skip
    section.workload = (
        f"Runs of {', '.join(f'{n:,}' for n in sizes)} recorded steps, alternating a model call (a 2,048-byte user "
        "message and a short one, a short reply) and a read-tool call (tiny argument and result), then an "
        "approval that suspends the run (a run of 256 events or more writes a journal snapshot then); the "
        "approval is granted, then the run is resumed. runledger resume: from `resume_run` to the first live "
        "step's tool function (read the journal snapshot and the events after it, check them, check the version, "
        "record `run.resumed` fenced, replay every recorded step from the journal). whole run read: the same "
        "resume of a twin run recorded alongside (`from_snapshot=False`: read every event, fold, open sealed "
        "content step by step), the two resumed in turn, in an order that alternates. load+fold: `load_run` + "
        "`fold` (what `runledger checkpoint` does). load (snapshot+tail): `load_journal` on the suspended run just "
        "before its resume (the snapshot and the events after it read, checked and folded: every recorded output "
        "by step, what DBOS's `list_workflow_steps` returns; measured for runs long enough to be snapshotted). "
        "raw read: "
        "the run's subject read with nats-py, nothing decoded. LangGraph: a thread of the same N steps, one "
        "checkpoint per step (N checkpoints, the latest carrying the whole message list, 2 messages a step); "
        "`SqliteSaver.get_tuple` of the latest; the same thread in a `PostgresSaver` on a private PostgreSQL (a "
        "cluster the bench starts in a temp dir, `fsync=on`), `get_tuple` of the latest. DBOS: a workflow of "
        "the same N steps (one `@DBOS.step()` each, returning the reply or the tool's result) on the same "
        "PostgreSQL; `DBOS.list_workflow_steps` reads every recorded output back in one query (recovery reads "
        "them one step at a time as it re-executes the workflow, and goes through DBOS's queue: this favours "
        "DBOS). eventsourcing: an aggregate of the same N events; "
        f"`app.repository.get(id)` replays all of them (no snapshots, no cache). {repeats} repeats; in each, "
        "every system is measured once (the peers first on odd repeats, last on even ones); a new runledger run "
        "is recorded for each repeat (a resume completes it), the peers' stores are built once per size."
    )
    section.notes.append(
        "The peers load state; runledger's resume also writes (`run.resumed`, fsync before the ack) and replays "
        "the agent function through every recorded step, so it does strictly more than any peer."
    )
    largest = results[-1]
    if DBOS_LOAD in largest and LOAD in largest:
        load = paired(largest, LOAD, DBOS_LOAD)
        section.notes.append(
            f"Like for like with DBOS `list_workflow_steps` (every recorded output in one read, nothing replayed): "
            f"runledger's load of a {largest['steps']:,}-step run (snapshot and tail, checked and folded) / DBOS = "
            f"{ratio_cell(load)} (p50 {largest[LOAD]['p50']:.1f} ms against {largest[DBOS_LOAD]['p50']:.1f} ms)."
        )
    if pg is None:
        section.notes.append(f"LangGraph PostgresSaver and DBOS: not measured: {pg_reason}")
    rows = []
    for r in results:
        for name in SYSTEMS:
            if name not in r:
                continue
            ratio = "" if name == RESUME else ratio_cell(paired(r, RESUME, name))
            rows.append([f"{r['steps']:,}", name, *stat_cells(r[name]), ratio])
    section.tables.append(Table("ms to resume / load", ["steps", "system", *STAT_COLUMNS, "resume / system"], rows))
    n = f"{largest['steps']:,}"
    for peer in PEERS:
        if peer not in largest and peer in POSTGRES_PEERS:
            goal = f"runledger resumes a {n}-step run faster than {peer}"
            section.goals.append(Goal(goal, None, f"not measured: {pg_reason}"))
        if peer in largest:
            r = paired(largest, RESUME, peer)
            f = paired(largest, FOLD, peer)
            section.goals.append(
                Goal(
                    f"runledger resumes a {n}-step run faster than {peer}",
                    r["p50"] < 1.0,
                    f"resume→first live / {peer} = {ratio_cell(r)} (p50 {largest[RESUME]['p50']:.1f} ms against "
                    f"{largest[peer]['p50']:.1f} ms); load+fold alone / {peer} = {ratio_cell(f)}.",
                )
            )
    whole = paired(largest, RESUME, RESUME_WHOLE)
    section.goals.append(
        Goal(f"a {n}-step run resumes from its journal snapshot faster than from every event", whole["p50"] < 1.0,
             f"resume / whole-run resume = {ratio_cell(whole)} (p50 {largest[RESUME]['p50']:.1f} ms against "
             f"{largest[RESUME_WHOLE]['p50']:.1f} ms), twin runs resumed in turn in each repeat.")
    )  # fmt: skip
    section.goals.append(
        Goal(f"a {n}-step run resumes in under 100 ms", largest[RESUME]["p50"] < 100,
             f"p50 {largest[RESUME]['p50']:.1f} ms, of which reading the run raw takes {largest[RAW]['p50']:.1f} ms.")
    )  # fmt: skip
    from bench.plots import bars

    names = [x for x in SYSTEMS if x in largest]
    nan = float("nan")  # a row a size does not have (the snapshot load: only runs long enough to snapshot)

    def stat(r: dict[str, Any], x: str, key: str) -> float:
        return float(r[x][key]) if x in r else nan

    section.plots.append(
        bars(
            opts.plot_dir / "resume.png",
            "p50 ms to resume or load, by run length (whiskers: min-max)",
            [f"{r['steps']:,} steps" for r in results],
            {x: [stat(r, x, "p50") for r in results] for x in names},
            ylabel="ms (log)",
            log=True,
            errors={x: [(stat(r, x, "min"), stat(r, x, "max")) for r in results] for x in names},
        )
    )
    return section


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-peers", action="store_true")
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="runledger-bench-resume-") as tmp,
        server() as state,
        contextlib.nullcontext((None, "")) if args.no_peers else optional_postgres() as (pg, why),
    ):
        if why:
            print(f"LangGraph PostgresSaver and DBOS: not measured: {why}")
        results = asyncio.run(measure(state.url, args.sizes, args.repeats, None if args.no_peers else Path(tmp), pg))
    rows = [["steps", "system", "p50 ms", "p99", "min", "max", "resume / system"]]
    for r in results:
        for name in SYSTEMS:
            if name in r:
                s = r[name]
                ratio = "" if name == RESUME else ratio_cell(paired(r, RESUME, name))
                rows.append([str(r["steps"]), name, f"{s['p50']:.1f}", f"{s['p99']:.1f}", f"{s['min']:.1f}",
                             f"{s['max']:.1f}", ratio])  # fmt: skip
    print(table(rows))
    print("\ngoal: a 1,000-step run resumes in under 100 ms, and faster than loading any peer's state")
    return results


if __name__ == "__main__":
    main()
