"""Re-drive throughput: many recorded runs re-driven in sandboxes, warm pool against cold.

Workload: N recorded runs of the example refund agent (ticket T-1001: 2 model calls, a
read tool, 2 effects; 5 steps), each re-driven from step 1 (the model live, tools and
effects from the record) in its own hardened container. "warm": a pool keeps sandboxes
started and connected ahead of demand, with C re-drives in flight. "cold": a container
is created and started for each re-drive, same concurrency. Both in the same process
against the same server. Requires Docker and the sandbox image (`runledger sandbox build`).

    python -m bench.rerun [--runs 200] [--cold-runs 40] [--concurrency 2] [--pool 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import server, summary, table
from examples.refund_agent.agent import TICKETS, spec
from examples.refund_agent.payments import PaymentsService
from ledger.client import LedgerClient, connect
from ledger.runner import start_run
from sandbox.containers import SandboxPolicy, SandboxPool
from sandbox.image import build_image, docker_client
from sandbox.rerun import Rerunner, RerunRequest

AGENT = "examples.refund_agent.agent:spec"


async def redrive_all(client: LedgerClient, pool: SandboxPool, parents: list[str], concurrency: int) -> dict[str, Any]:
    rerunner = Rerunner(client, pool)
    queue: asyncio.Queue[str] = asyncio.Queue()
    for p in parents:
        queue.put_nowait(p)
    latencies: list[float] = []
    failures: list[str] = []

    async def worker() -> None:
        while not queue.empty():
            parent = queue.get_nowait()
            t0 = time.perf_counter()
            result = await rerunner.rerun(RerunRequest(parent_run_id=parent, agent=AGENT, mode="redrive", fork_step=1))
            latencies.append((time.perf_counter() - t0) * 1000)
            if result.status != "completed":
                failures.append(f"{parent}: {result.reason} {result.error}")

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    return {"runs": len(parents), "seconds": elapsed, "runs_per_s": len(parents) / elapsed,
            "latency": summary(latencies), "failures": failures, "warm_hits": pool.warm_hits,
            "cold_starts": pool.cold_starts}  # fmt: skip


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    docker = docker_client()
    image = build_image(log=lambda m: None)
    client = await connect(url)
    try:
        agent = spec()
        parents = []
        for i in range(max(args.runs, args.cold_runs)):
            result = await start_run(client, agent, TICKETS[0], run_id=f"bench-parent-{i}")
            parents.append(result.run_id)
        policy = SandboxPolicy(image=image, timeout_s=60)
        warm_pool = SandboxPool(docker, policy, size=args.pool)
        code_root = Path(__file__).resolve().parent.parent
        await warm_pool.prewarm(code_root, "examples")
        try:
            warm = await redrive_all(client, warm_pool, parents[: args.runs], args.concurrency)
        finally:
            await warm_pool.close()
        cold_pool = SandboxPool(docker, policy, size=0)
        try:
            cold = await redrive_all(client, cold_pool, parents[: args.cold_runs], args.concurrency)
        finally:
            await cold_pool.close()
        return {"warm": warm, "cold": cold}
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--cold-runs", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--pool", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        payments = PaymentsService(Path(tmp) / "payments.log").start()
        os.environ["REFUND_PAYMENTS_URL"] = payments.url
        os.environ["REFUND_OUTBOX"] = str(Path(tmp) / "outbox")
        try:
            with server() as state:
                results = asyncio.run(measure(state.url, args))
        finally:
            payments.stop()
    rows = [["pool", "runs", "total s", "runs/s", "p50 ms", "p99 ms", "warm hits", "cold starts", "failures"]]
    for name in ("warm", "cold"):
        r = results[name]
        rows.append([name, str(r["runs"]), f"{r['seconds']:.1f}", f"{r['runs_per_s']:.2f}",
                     f"{r['latency']['p50']:.0f}", f"{r['latency']['p99']:.0f}", str(r["warm_hits"]),
                     str(r["cold_starts"]), str(len(r["failures"]))])  # fmt: skip
    print(table(rows))
    ratio = results["warm"]["runs_per_s"] / results["cold"]["runs_per_s"]
    print(f"\nwarm / cold throughput = {ratio:.2f}x; {results['warm']['runs']} re-drives took "
          f"{results['warm']['seconds']:.1f} s (goal: 200 in under 60 s)")  # fmt: skip
    for name in ("warm", "cold"):
        for failure in results[name]["failures"][:5]:
            print(f"{name} failure: {failure}")
    return results


if __name__ == "__main__":
    main()
