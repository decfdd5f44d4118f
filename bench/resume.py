"""Resume: time from ``resume_run`` to the first new live step, against loading a peer's state.

Workload: runs of 10, 100 and 1,000 recorded steps (alternating model calls with a 2 KiB
message and read-tool calls), then an approval that suspends the run. After the approval
is recorded, ``resume_run`` reads the run from the stream, folds it, checks the version
tuple, records ``run.resumed`` (fenced), replays every recorded step from the journal and
reaches the first live step; the clock stops when that step's tool function is entered.
"fold" is reading the run back from the stream and folding it (``load_run`` + ``fold``).
The baseline is a raw read of the same subject that decodes nothing.

The peers hold the same run (``bench.peers``): a LangGraph thread with one checkpoint per
step (N checkpoints, the latest carrying the whole message list), resumed by loading its
latest checkpoint (``SqliteSaver.get_tuple``); an eventsourcing aggregate of N events,
replayed by ``app.repository.get(id)`` (no snapshots, no cache). Every repeat measures
each system once, in an order that alternates, so ratios are computed repeat by repeat.

    python -m bench.resume [--sizes 10 100 1000] [--repeats 5] [--no-peers]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import server, summary, table
from bench.peers import EventSourcingPeer, EventSourcingRun, LangGraphPeer, LangGraphThread, Step
from bench.report import STAT_COLUMNS, Goal, Section, SuiteOptions, Table, ratio_cell, ratio_stats, stat_cells
from runledger import Run
from runledger.log.client import LedgerClient, connect
from runledger.log.reader import read_raw
from runledger.log.subjects import any_agent_run_subject
from runledger.ops.decisions import approve
from runledger.protect.runs import load_run
from runledger.record.fold import fold
from runledger.sdk.agent import AgentSpec
from runledger.sdk.lifecycle import resume_run, start_run
from runledger.sdk.models import ModelResponse, ScriptedModel

REPLY = ModelResponse(content="ok", input_tokens=512, output_tokens=4)
RESUME, FOLD, RAW, LANGGRAPH, EVENTSOURCING = (
    "runledger resume→first live", "runledger load+fold", "raw read", "LangGraph get_tuple", "eventsourcing get",
)  # fmt: skip


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


def build_peers(steps: int, work: Path) -> tuple[LangGraphThread, EventSourcingRun, LangGraphPeer, EventSourcingPeer]:
    """A LangGraph thread and an eventsourcing aggregate holding the same ``steps`` steps.

    The LangGraph thread is written with ``synchronous=OFF`` (only its reads are measured;
    1,000 growing checkpoints take long enough already) and set back to FULL afterwards.
    """
    lg = LangGraphPeer(work / f"langgraph-{steps}.sqlite")
    es = EventSourcingPeer(work / f"eventsourcing-{steps}.sqlite")
    lg.set_synchronous("OFF")
    thread = lg.thread(f"resume-{steps}")
    run = es.run()
    for i in range(steps):
        step = step_of(i)
        thread.record(thread.messages_for(step))
        run.record(step)
    lg.set_synchronous("FULL")
    return thread, run, lg, es


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


async def one_size(client: LedgerClient, steps: int, repeats: int, work: Path | None) -> dict[str, Any]:
    live_at: list[float] = []
    spec = make_spec(steps, live_at)
    samples: dict[str, list[float]] = {RESUME: [], FOLD: [], RAW: []}
    peers = build_peers(steps, work) if work is not None else None
    if peers is not None:
        samples[LANGGRAPH], samples[EVENTSOURCING] = [], []
        peers[0].load_latest(), peers[1].load()  # warm both (page cache, imports), as the stream is warm
    try:
        for r in range(repeats):
            run_id = f"resume-{steps}-{r}"
            first = await start_run(client, spec, run_id=run_id)
            await approve(client, run_id, first.pending[0], by="bench")

            def measure_peers() -> None:
                if peers is not None:
                    samples[LANGGRAPH].append(_timed(peers[0].load_latest))
                    samples[EVENTSOURCING].append(_timed(peers[1].load))

            if r % 2 == 1:
                measure_peers()
            t0 = time.perf_counter()
            raws = await read_raw(client, any_agent_run_subject(run_id))
            samples[RAW].append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            fold((await load_run(client, run_id)).records)
            samples[FOLD].append((time.perf_counter() - t0) * 1000)
            live_at.clear()
            t0 = time.perf_counter()
            result = await resume_run(client, spec, run_id)
            assert result.status == "completed" and live_at, result
            samples[RESUME].append((live_at[0] - t0) * 1000)
            assert len(raws) > steps
            if r % 2 == 0:
                measure_peers()
    finally:
        if peers is not None:
            peers[2].close()
            peers[3].close()
    return {"steps": steps, "samples": samples, **{name: summary(v) for name, v in samples.items()}}


async def measure(url: str, sizes: list[int], repeats: int, work: Path | None) -> list[dict[str, Any]]:
    client = await connect(url)
    try:
        return [await one_size(client, n, repeats, work) for n in sizes]
    finally:
        await client.close()


def paired(result: dict[str, Any], a: str, b: str) -> dict[str, float]:
    return ratio_stats(list(zip(result["samples"][a], result["samples"][b], strict=True)))


def run_suite(opts: SuiteOptions) -> Section:
    sizes, repeats = ([10, 30], 2) if opts.quick else ([10, 100, 1000], 5)
    with tempfile.TemporaryDirectory(prefix="runledger-bench-resume-") as tmp, server() as state:
        results = asyncio.run(measure(state.url, sizes, repeats, Path(tmp)))
    section = Section(part="resume", title="resuming a run",
                      data={"results": [{k: v for k, v in r.items() if k != "samples"} for r in results]})  # fmt: skip
    section.workload = (
        f"Runs of {', '.join(f'{n:,}' for n in sizes)} recorded steps, alternating a model call (a 2,048-byte user "
        "message and a short one, a short reply) and a read-tool call (tiny argument and result), then an "
        "approval that suspends the run; the approval is granted, then the run is resumed. runledger resume: "
        "from `resume_run` to the first live step's tool function (read the run from the stream, fold, check the "
        "version, record `run.resumed` fenced, replay every recorded step from the journal, opening sealed "
        "content step by step). load+fold: `load_run` + `fold` (what `runledger checkpoint` does). raw read: "
        "the run's subject read with nats-py, nothing decoded. LangGraph: a thread of the same N steps, one "
        "checkpoint per step (N checkpoints, the latest carrying the whole message list, 2 messages a step); "
        "`SqliteSaver.get_tuple` of the latest. eventsourcing: an aggregate of the same N events; "
        f"`app.repository.get(id)` replays all of them (no snapshots, no cache). {repeats} repeats; in each, "
        "every system is measured once (the peers first on odd repeats, last on even ones); a new runledger run "
        "is recorded for each repeat (a resume completes it), the peers' stores are built once per size."
    )
    section.notes.append(
        "The peers load state; runledger's resume also writes (`run.resumed`, fsync before the ack) and replays "
        "the agent function through every recorded step, so it does strictly more than either peer."
    )
    rows = []
    for r in results:
        for name in (RESUME, FOLD, RAW, LANGGRAPH, EVENTSOURCING):
            if name not in r:
                continue
            ratio = "" if name == RESUME else ratio_cell(paired(r, RESUME, name))
            rows.append([f"{r['steps']:,}", name, *stat_cells(r[name]), ratio])
    section.tables.append(Table("ms to resume / load", ["steps", "system", *STAT_COLUMNS, "resume / system"], rows))
    largest = results[-1]
    n = f"{largest['steps']:,}"
    for peer in (LANGGRAPH, EVENTSOURCING):
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
    section.goals.append(
        Goal(f"a {n}-step run resumes in under 100 ms", largest[RESUME]["p50"] < 100,
             f"p50 {largest[RESUME]['p50']:.1f} ms, of which reading the run raw takes {largest[RAW]['p50']:.1f} ms.")
    )  # fmt: skip
    from bench.plots import bars

    names = [x for x in (RESUME, FOLD, RAW, LANGGRAPH, EVENTSOURCING) if x in largest]
    section.plots.append(
        bars(
            opts.plot_dir / "resume.png",
            "p50 ms to resume or load, by run length (whiskers: min-max)",
            [f"{r['steps']:,} steps" for r in results],
            {x: [r[x]["p50"] for r in results] for x in names},
            ylabel="ms (log)",
            log=True,
            errors={x: [(r[x]["min"], r[x]["max"]) for r in results] for x in names},
        )
    )
    return section


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-peers", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="runledger-bench-resume-") as tmp, server() as state:
        results = asyncio.run(measure(state.url, args.sizes, args.repeats, None if args.no_peers else Path(tmp)))
    rows = [["steps", "system", "p50 ms", "p99", "min", "max", "resume / system"]]
    for r in results:
        for name in (RESUME, FOLD, RAW, LANGGRAPH, EVENTSOURCING):
            if name in r:
                s = r[name]
                ratio = "" if name == RESUME else ratio_cell(paired(r, RESUME, name))
                rows.append([str(r["steps"]), name, f"{s['p50']:.1f}", f"{s['p99']:.1f}", f"{s['min']:.1f}",
                             f"{s['max']:.1f}", ratio])  # fmt: skip
    print(table(rows))
    print("\ngoal: a 1,000-step run resumes in under 100 ms, and faster than loading either peer's state")
    return results


if __name__ == "__main__":
    main()
