"""Recording one step: the SDK against a raw nats-py ``js.publish`` of the same bytes.

Workload: one run of N steps, alternating a model call (request carrying a 2 KiB message
history delta, a short scripted reply) and a read-tool call (a 200-byte argument, a 200-byte
result). Each SDK step is timed from the call to its return (event built, hashed, published
with msg id and fence, acknowledged). The raw baseline publishes the very bytes the SDK
stored, to a fresh subject, with ``js.publish`` and no headers, one at a time. SDK and raw
steps are interleaved in blocks so both see the same machine noise. Both servers fsync
before acking (``sync_interval: always``) unless ``--no-fsync``; ``--compare-fsync`` also
measures the raw publish against a server with the default 2-minute sync interval, which
is what durability costs.

    python -m bench.record [--steps 2000] [--compare-fsync]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from bench.common import server, summary, table
from ledger.agent import AgentSpec
from ledger.client import LedgerClient, connect
from ledger.models import ModelResponse, ScriptedModel
from ledger.reader import read_raw
from ledger.run import Run
from ledger.runner import start_run
from ledger.subjects import run_subject

HISTORY = [{"role": "user", "content": "x" * 2048}]
ARGS = {"query": "y" * 200}
RESULT = {"rows": "z" * 200}
REPLY = ModelResponse(content="ok, next step", input_tokens=512, output_tokens=4)


async def sdk_steps(client: LedgerClient, steps: int, block: int, gate: asyncio.Queue[int]) -> list[float]:
    timings: list[float] = []

    async def agent(run: Run) -> None:
        for i in range(steps):
            if i % block == 0:
                await gate.get()  # let the raw publisher take its turn
            t0 = time.perf_counter()
            if i % 2 == 0:
                await run.model([*HISTORY, {"role": "user", "content": f"step {i}"}])
            else:
                await run.tool("read", {**ARGS, "i": i}, fn=lambda a: RESULT)
            timings.append((time.perf_counter() - t0) * 1000)

    spec = AgentSpec("bench", agent, ScriptedModel(lambda m: REPLY), agent_version="bench")
    await start_run(client, spec, run_id="bench-record")
    return timings


async def raw_publish(client: LedgerClient, payloads: list[bytes], subject: str) -> list[float]:
    timings = []
    for data in payloads:
        t0 = time.perf_counter()
        await client.js.publish(subject, data)
        timings.append((time.perf_counter() - t0) * 1000)
    return timings


async def measure(url: str, steps: int, block: int) -> tuple[list[float], list[float]]:
    client = await connect(url)
    try:
        # Warm up both paths (connections, stream lookups, page cache).
        await raw_publish(client, [b"warm"] * 200, "ledger.run.warm.up")
        gate: asyncio.Queue[int] = asyncio.Queue()
        gate.put_nowait(0)
        sdk_task = asyncio.create_task(sdk_steps(client, steps, block, gate))
        raw: list[float] = []
        # The raw baseline replays the bytes the SDK stored, block by block, interleaved.
        stored: list[bytes] = []
        done_blocks = 0
        while not sdk_task.done():
            await asyncio.sleep(0)
            if gate.empty() and len(stored) < steps:
                records = await read_raw(client, run_subject("bench", "bench-record"))
                new = [r.data for r in records[1 + len(stored) :]]
                stored.extend(new)
                if new:
                    raw += await raw_publish(client, new, f"ledger.run.raw.b{done_blocks}")
                    done_blocks += 1
                gate.put_nowait(0)
        sdk = await sdk_task
        records = await read_raw(client, run_subject("bench", "bench-record"))
        rest = [r.data for r in records[1 + len(stored) : 1 + steps]]
        raw += await raw_publish(client, rest, "ledger.run.raw.tail")
        return sdk, raw
    finally:
        await client.close()


async def raw_only(url: str, n: int) -> list[float]:
    client = await connect(url)
    try:
        data = b"x" * 2400
        await raw_publish(client, [data] * 100, "ledger.run.warm.x")
        return await raw_publish(client, [data] * n, "ledger.run.rawonly.x")
    finally:
        await client.close()


def fmt(s: dict[str, float]) -> list[str]:
    return [f"{s['p50']:.3f}", f"{s['p99']:.3f}", f"{s['min']:.3f}", f"{s['max']:.3f}", str(int(s["n"]))]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--block", type=int, default=100)
    parser.add_argument("--no-fsync", action="store_true")
    parser.add_argument("--compare-fsync", action="store_true")
    args = parser.parse_args(argv)
    with server(sync_always=not args.no_fsync) as state:
        sdk, raw = asyncio.run(measure(state.url, args.steps, args.block))
    s_sdk, s_raw = summary(sdk), summary(raw)
    rows = [["path", "p50 ms", "p99 ms", "min ms", "max ms", "n"]]
    rows += [["SDK step", *fmt(s_sdk)], ["raw js.publish", *fmt(s_raw)]]
    result: dict[str, Any] = {"sdk": s_sdk, "raw": s_raw, "ratio_p50": s_sdk["p50"] / s_raw["p50"]}
    if args.compare_fsync:
        with server(sync_always=False) as state:
            lazy = summary(asyncio.run(raw_only(state.url, args.steps)))
        with server(sync_always=True) as state:
            synced = summary(asyncio.run(raw_only(state.url, args.steps)))
        rows += [["raw, fsync each ack", *fmt(synced)], ["raw, fsync every 2 min", *fmt(lazy)]]
        result["fsync_cost_p50_ms"] = synced["p50"] - lazy["p50"]
    print(table(rows))
    print(f"\nSDK p50 / raw p50 = {result['ratio_p50']:.2f}x  (goal: <= 1.5x)")
    if "fsync_cost_p50_ms" in result:
        print(f"fsync before ack costs {result['fsync_cost_p50_ms']:.3f} ms at p50")
    return result


if __name__ == "__main__":
    main()
