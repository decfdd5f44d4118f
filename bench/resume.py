"""Resume: time from ``resume_run`` to the first new live step, and folding a checkpoint.

Workload: runs of 10, 100 and 1,000 recorded steps (alternating model calls with a 2 KiB
message and read-tool calls), then an approval that suspends the run. After the approval
is recorded, ``resume_run`` reads the run from the stream, folds it, checks the version
tuple, records ``run.resumed`` (fenced), replays every recorded step from the journal and
reaches the first live step; the clock stops when that step's tool function is entered.
"fold" is reading the run back from the stream and folding it (``load_run`` + ``fold``).
The baseline is a raw read of the same subject that decodes nothing.

    python -m bench.resume [--sizes 10 100 1000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from bench.common import server, summary, table
from ledger.agent import AgentSpec
from ledger.client import LedgerClient, connect
from ledger.fold import fold
from ledger.models import ModelResponse, ScriptedModel
from ledger.operator import approve
from ledger.reader import load_run, read_raw
from ledger.run import Run
from ledger.runner import resume_run, start_run
from ledger.subjects import any_agent_run_subject

REPLY = ModelResponse(content="ok", input_tokens=512, output_tokens=4)


def make_spec(steps: int, live_at: list[float]) -> AgentSpec:
    async def agent(run: Run) -> None:
        for i in range(steps):
            if i % 2 == 0:
                await run.model([{"role": "user", "content": "x" * 2048}, {"role": "user", "content": str(i)}])
            else:
                await run.tool("read", {"i": i}, fn=lambda a: {"ok": a["i"]})
        await run.approval("continue", None)
        await run.tool("first-live", None, fn=lambda a: live_at.append(time.perf_counter()))

    return AgentSpec("bench-resume", agent, ScriptedModel(lambda m: REPLY), agent_version="bench")


async def one_size(client: LedgerClient, steps: int, repeats: int) -> dict[str, Any]:
    live_at: list[float] = []
    spec = make_spec(steps, live_at)
    resume_ms, fold_ms, raw_ms = [], [], []
    for r in range(repeats):
        run_id = f"resume-{steps}-{r}"
        first = await start_run(client, spec, run_id=run_id)
        await approve(client, run_id, first.pending[0], by="bench")
        t0 = time.perf_counter()
        raws = await read_raw(client, any_agent_run_subject(run_id))
        raw_ms.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        fold((await load_run(client, run_id)).records)
        fold_ms.append((time.perf_counter() - t0) * 1000)
        live_at.clear()
        t0 = time.perf_counter()
        result = await resume_run(client, spec, run_id)
        assert result.status == "completed" and live_at, result
        resume_ms.append((live_at[0] - t0) * 1000)
        assert len(raws) > steps
    return {"steps": steps, "resume": summary(resume_ms), "fold": summary(fold_ms), "raw_read": summary(raw_ms)}


async def measure(url: str, sizes: list[int], repeats: int) -> list[dict[str, Any]]:
    client = await connect(url)
    try:
        return [await one_size(client, n, repeats) for n in sizes]
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    with server() as state:
        results = asyncio.run(measure(state.url, args.sizes, args.repeats))
    rows = [["steps", "resume→first live p50 ms", "p99", "fold from stream p50 ms", "raw read p50 ms", "fold/raw"]]
    for r in results:
        rows.append([
            str(r["steps"]), f"{r['resume']['p50']:.1f}", f"{r['resume']['p99']:.1f}", f"{r['fold']['p50']:.1f}",
            f"{r['raw_read']['p50']:.1f}", f"{r['fold']['p50'] / r['raw_read']['p50']:.2f}x",
        ])  # fmt: skip
    print(table(rows))
    print("\ngoal: a 1,000-step run resumes in under 100 ms of runledger overhead")
    return results


if __name__ == "__main__":
    main()
