"""What content protection costs: the transform alone, and a recorded step end to end.

    python -m bench.protect [--steps 1000]

1. ``PayloadProtector.protect`` on a typical tool step (about 1 KB of arguments and output
   with one secret), per capture mode, with and without sealing; and redaction of a large
   document per MB.
2. Runs of tool steps on an embedded nats-server (fsync before every ack), the policies
   taking turns round by round: the time per recorded step, so the protection's share of a
   real step is visible.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

from bench.common import server, summary, table
from bench.report import Section, SuiteOptions, Table, num, ratio_cell, ratio_stats
from runledger import AgentSpec, Run, ScriptedModel
from runledger.log.client import connect
from runledger.protect.capture import DataPolicy, PayloadProtector
from runledger.protect.keystore import RunKeys
from runledger.protect.redaction import Redactor
from runledger.record.events import ToolCalled
from runledger.sdk.lifecycle import start_run

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


async def transform_costs(n: int = 2000) -> dict[str, dict[str, float]]:
    """µs per ``protect()`` of a typical tool step, per policy."""
    out = {}
    body = ToolCalled(step=0, name="http", args=ARGS, args_digest="d" * 64, output=OUTPUT)
    for label, policy in POLICIES.items():
        keys = RunKeys.generate("bench.run")
        protector = PayloadProtector(policy, keys if (policy.encrypt or policy.capture != "full") else None)
        times = []
        for _ in range(n):
            t = time.perf_counter()
            await protector.protect(body)
            times.append((time.perf_counter() - t) * 1e6)
        out[label] = summary(times)
    return out


def large_document_cost(mb: int = 20) -> float:
    """ms per MB to redact a large text document."""
    line = "Invoice 2026-11-29 order-8891 amount 10.50 EUR customer Ann Example; see https://example.com/x?id=9\n"
    doc = line * (mb * 1024 * 1024 // len(line))
    redactor = Redactor(os.urandom(32))
    t = time.perf_counter()
    redactor.redact_text(doc)
    return (time.perf_counter() - t) / mb * 1000


async def step_costs(steps: int, rounds: int = 5) -> dict[str, Any]:
    """ms per recorded tool step, per policy: ``rounds`` rounds of one run of ``steps // rounds`` steps per policy.

    The policies take turns inside each round, so the extra cost over "no protection" is paired round by round.
    """

    async def agent(run: Run) -> Any:
        for i in range(per_run):
            await run.tool("http", {**ARGS, "i": i}, fn=lambda a: OUTPUT)
        return per_run

    per_run = max(1, steps // rounds)
    per_step: dict[str, list[float]] = {label: [] for label in POLICIES}
    with server() as state:
        async with await connect(state.url) as client:
            warm = AgentSpec("bench", agent, ScriptedModel([]), agent_version="v1")
            await start_run(client, warm, None)
            for _ in range(rounds):
                for label, policy in POLICIES.items():
                    spec = AgentSpec("bench", agent, ScriptedModel([]), agent_version="v1", data_policy=policy)
                    t = time.perf_counter()
                    await start_run(client, spec, None)
                    per_step[label].append((time.perf_counter() - t) / per_run * 1000)
    return {"steps_per_run": per_run, "rounds": rounds, "ms_per_step": per_step}


def run_suite(opts: SuiteOptions) -> Section:
    n, mb, steps, rounds = (50, 1, 20, 2) if opts.quick else (2000, 20, 1000, 5)
    transform = asyncio.run(transform_costs(n))
    redaction_ms_per_mb = large_document_cost(mb)
    steps_out = asyncio.run(step_costs(steps, rounds))
    section = Section(
        part="protect",
        title="what content protection costs",
        data={"transform_us": transform, "redaction_ms_per_mb": redaction_ms_per_mb, **steps_out},
    )
    section.workload = (
        f"(1) `PayloadProtector.protect` of a typical tool step (about 1 KB of arguments and output holding one "
        f"API key), {n} times per data policy. (2) Redacting a {mb} MB text document. (3) Runs of "
        f"{steps_out['steps_per_run']} tool steps (the same ~1 KB step) on an embedded nats-server that fsyncs "
        f"before every ack, one run per policy in each of {rounds} rounds (the policies take turns), timed per "
        "recorded step (a run's time divided by its steps, run start and end included)."
    )
    base_label = next(iter(POLICIES))
    per_step = steps_out["ms_per_step"]
    rows = []
    for label in POLICIES:
        t = transform[label]
        step = summary(per_step[label])
        extra = [a - b for a, b in zip(per_step[label], per_step[base_label], strict=True)]
        ratio = ratio_stats(list(zip(per_step[label], per_step[base_label], strict=True)))
        rows.append([label, num(t["p50"]), num(t["p99"]), num(step["p50"]), num(step["min"]), num(step["max"]),
                     f"{statistics.median(extra):+.3f}", ratio_cell(ratio)])  # fmt: skip
    section.tables.append(Table(
        "per policy", ["policy", "protect() p50 µs", "p99 µs", "ms per recorded step p50", "min", "max",
                       "extra ms a step (paired)", "/ no protection"], rows))  # fmt: skip
    section.notes.append(f"Redaction of a large document: {redaction_ms_per_mb:.0f} ms per MB.")
    from bench.plots import bars

    labels = list(POLICIES)
    section.plots.append(
        bars(
            opts.plot_dir / "protect.png",
            "ms per recorded tool step, by data policy (min-max over rounds)",
            [x.split(" (")[0].replace(", ", ",\n") for x in labels],
            {"ms per step": [summary(per_step[x])["p50"] for x in labels]},
            ylabel="ms",
            errors={"ms per step": [(min(per_step[x]), max(per_step[x])) for x in labels]},
        )
    )
    return section


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()
    rows = [["policy", "protect() p50 µs", "p99 µs"]]
    for label, s in (await transform_costs()).items():
        rows.append([label, f"{s['p50']:.0f}", f"{s['p99']:.0f}"])
    print(table(rows))
    print()
    print(f"redaction of a 20 MB document: {large_document_cost():.0f} ms per MB")
    print()
    out = await step_costs(args.steps)
    base = statistics.median(next(iter(out["ms_per_step"].values())))
    rows = [["policy", "ms per recorded step", "vs no protection"]]
    for label, values in out["ms_per_step"].items():
        rows.append([label, f"{statistics.median(values):.2f}", f"{statistics.median(values) - base:+.2f} ms"])
    print(table(rows))


if __name__ == "__main__":
    asyncio.run(main())
