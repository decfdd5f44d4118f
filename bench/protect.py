"""What content protection costs: the transform alone, and a recorded step end to end.

    python -m bench.protect [--steps 1000]

1. ``PayloadProtector.protect`` on a typical tool step (about 1 KB of arguments and output
   with one secret), per capture mode, with and without sealing; and redaction of a large
   document per MB.
2. A run of N tool steps on an embedded nats-server (fsync before every ack), per policy:
   the time per recorded step, so the protection's share of a real step is visible.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

from bench.common import server, summary, table
from ledger import AgentSpec, Run, ScriptedModel
from ledger.capture import DataPolicy, PayloadProtector
from ledger.client import connect
from ledger.events import ToolCalled
from ledger.keystore import RunKeys
from ledger.redaction import Redactor
from ledger.runner import start_run

POLICIES = {
    "full, unsealed (no protection)": DataPolicy(capture="full", encrypt=False),
    "redacted, unsealed": DataPolicy(capture="redacted", encrypt=False),
    "redacted, sealed (default)": DataPolicy(),
    "hash-only": DataPolicy(capture="hash-only", encrypt=False),
}

ARGS = {
    "url": "https://api.example.com/v1/orders/8891",
    "headers": {"Accept": "application/json", "X-Request-Id": "01JD3V6W8Y0Q9ZK4XH5M2N7P8R"},
    "body": {"customer": "Ann Example", "note": "refund requested, parcel arrived broken " * 4},
}
OUTPUT = {
    "status": 200,
    "order": {"id": "order-8891", "amount": 42.5, "items": [{"sku": f"SKU-{i}", "qty": i} for i in range(10)]},
    "debug": "upstream used key sk-proj-Abcdefghij0123456789KLMNOPqrstuv for this call",
    "text": "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 8,
}


async def transform_costs(n: int = 2000) -> list[list[str]]:
    rows = [["policy", "protect() p50 µs", "p99 µs"]]
    body = ToolCalled(step=0, name="http", args=ARGS, args_digest="d" * 64, output=OUTPUT)
    for label, policy in POLICIES.items():
        keys = RunKeys.generate("bench.run")
        protector = PayloadProtector(policy, keys if (policy.encrypt or policy.capture != "full") else None)
        times = []
        for _ in range(n):
            t = time.perf_counter()
            await protector.protect(body)
            times.append((time.perf_counter() - t) * 1e6)
        s = summary(times)
        rows.append([label, f"{s['p50']:.0f}", f"{s['p99']:.0f}"])
    return rows


def large_document_cost(mb: int = 20) -> str:
    line = "Invoice 2026-11-29 order-8891 amount 10.50 EUR customer Ann Example; see https://example.com/x?id=9\n"
    doc = line * (mb * 1024 * 1024 // len(line))
    redactor = Redactor(os.urandom(32))
    t = time.perf_counter()
    redactor.redact_text(doc)
    per_mb = (time.perf_counter() - t) / mb
    return f"redaction of a {mb} MB document: {per_mb * 1000:.0f} ms per MB"


async def step_costs(steps: int) -> list[list[str]]:
    async def agent(run: Run) -> Any:
        for i in range(steps):
            await run.tool("http", {**ARGS, "i": i}, fn=lambda a: OUTPUT)
        return steps

    rows = [["policy", "ms per recorded step", "vs no protection"]]
    base: float | None = None
    with server() as state:
        async with await connect(state.url) as client:
            for label, policy in POLICIES.items():
                spec = AgentSpec("bench", agent, ScriptedModel([]), agent_version="v1", data_policy=policy)
                t = time.perf_counter()
                await start_run(client, spec, None)
                per_step = (time.perf_counter() - t) / steps * 1000
                base = base if base is not None else per_step
                rows.append([label, f"{per_step:.2f}", f"{per_step - base:+.2f} ms"])
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()
    print(table(await transform_costs()))
    print()
    print(large_document_cost())
    print()
    print(table(await step_costs(args.steps)))


if __name__ == "__main__":
    asyncio.run(main())
