"""The in-process replayer: 200 exported runs of the example agent replayed in the test process.

Workload: N recorded runs of the example refund agent (its five tickets in turn: refunds, a
question, an unknown order that fails, a refund waiting for approval), recorded on an embedded
nats-server, exported with ``runledger export jsonl`` (``export_runs``), then replayed with no server:

- "pytest": ``python -m pytest --runledger-replay FILE --runledger-agent
  runledger.examples.refund_agent.agent:spec`` in a fresh process (one test per run), with only the
  runledger plugin loaded (``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 -p runledger.testing.pytest_plugin``):
  the wall-clock time a developer waits (interpreter start, imports, collection included) and pytest's
  own reported duration (collection and the tests); once more with every plugin this development
  environment installs loaded, for comparison;
- "in-process": ``Replayer(spec).replay_paths(FILE)`` in this process (read the file and replay every
  run), repeated;
- "changed decision": the same pytest command against the agent with its approval threshold at 40
  (``bench.replay:cautious_spec``): the runs whose refund now needs an approval fail, and the first
  failure names the step.

    python -m bench.replay [--runs 200] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.common import server, summary
from bench.report import STAT_COLUMNS, Goal, Section, SuiteOptions, Table, stat_cells
from runledger import AgentSpec, Run
from runledger.examples.refund_agent import agent as refund
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import connect
from runledger.sdk.lifecycle import start_run
from runledger.testing import Replayer
from runledger.testing.export import export_runs

ROOT = Path(__file__).resolve().parent.parent
AGENT = "runledger.examples.refund_agent.agent:spec"
CHANGED = "bench.replay:cautious_spec"
GOAL_S = 5.0


async def _cautious(run: Run) -> Any:
    saved, refund.APPROVAL_THRESHOLD = refund.APPROVAL_THRESHOLD, 40.0
    try:
        return await refund.handle_ticket(run)
    finally:
        refund.APPROVAL_THRESHOLD = saved


def cautious_spec() -> AgentSpec:
    """The example agent with an approval threshold of 40 (a changed decision)."""
    return replace(refund.spec(), fn=_cautious)


async def record(url: str, n: int, out: Path) -> int:
    """Record ``n`` runs of the example agent and export them to ``out``; returns the events written."""
    client = await connect(url)
    try:
        runs = []
        for i in range(n):
            ticket = refund.TICKETS[i % len(refund.TICKETS)]
            runs.append(
                (await start_run(client, refund.spec(), {**ticket, "ticket": f"{ticket['ticket']}-{i}"})).run_id
            )
        return (await export_runs(client, runs, out)).events
    finally:
        await client.close()


def pytest_replay(path: Path, agent: str, *, every_plugin: bool = False) -> tuple[float, float, str]:
    """(wall seconds, pytest's reported seconds, its summary line or, when it failed, its output) of
    one pytest run over ``path``: with only the runledger plugin, or with every installed one."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    plugins = [] if every_plugin else ["-p", "runledger.testing.pytest_plugin"]
    if not every_plugin:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugins, "--runledger-replay", str(path),
         "--runledger-agent", agent],
        cwd=path.parent, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    wall = time.perf_counter() - t0
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]
    reported = re.search(r"in ([0-9.]+)s", last)
    return wall, float(reported.group(1)) if reported else float("nan"), done.stdout if done.returncode else last


def measure(n: int, repeat: int, *, every_plugin: bool = True) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="runledger-replay-") as tmp_dir:
        tmp = Path(tmp_dir)
        path = tmp / "recorded.jsonl"
        payments = PaymentsService(tmp / "payments.log").start()
        saved = {k: os.environ.get(k) for k in ("REFUND_PAYMENTS_URL", "REFUND_OUTBOX")}
        os.environ["REFUND_PAYMENTS_URL"], os.environ["REFUND_OUTBOX"] = payments.url, str(tmp / "outbox")
        try:
            with server() as state:
                events = asyncio.run(record(state.url, n, path))
        finally:
            payments.stop()
            for key, value in saved.items():  # the agent finds its services there only while it records
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        in_process: list[float] = []
        pytest_wall: list[float] = []
        pytest_own: list[float] = []
        summary_line = ""
        for _ in range(repeat):  # the two ways take turns
            t0 = time.perf_counter()
            results = Replayer(refund.spec()).replay_paths(path)
            in_process.append(time.perf_counter() - t0)
            assert len(results) == n and all(r.ok for r in results), [str(r) for r in results if not r.ok][:3]
            wall, own, summary_line = pytest_replay(path, AGENT)
            pytest_wall.append(wall)
            pytest_own.append(own)
        every_wall, every_own, every_line = (
            pytest_replay(path, AGENT, every_plugin=True) if every_plugin else (float("nan"), float("nan"), "not run")
        )
        changed = Replayer(cautious_spec()).replay_paths(path)
        diverged = [r for r in changed if not r.ok]
        wall, own, output = pytest_replay(path, CHANGED)
        failed_line = next((line for line in output.splitlines() if line.startswith("FAILED")), "")
        return {
            "runs": n, "events": events, "bytes": path.stat().st_size, "in_process": in_process,
            "pytest_wall": pytest_wall, "pytest_own": pytest_own, "summary": summary_line,
            "every_plugin_wall": every_wall, "every_plugin_own": every_own, "every_plugin_summary": every_line,
            "changed_diverged": len(diverged), "changed_first": str(diverged[0].divergence) if diverged else "",
            "changed_pytest_wall": wall, "changed_pytest_failed": failed_line,
            "changed_pytest_summary": output.strip().splitlines()[-1] if output.strip() else "",
        }  # fmt: skip


def run_suite(opts: SuiteOptions) -> Section:
    n, repeat = (20, 1) if opts.quick else (200, 5)
    data = measure(n, repeat, every_plugin=not opts.quick)
    section = Section(part="replay", title=f"the in-process replayer: {n} exported runs replayed as pytest tests")
    section.workload = (
        f"{data['runs']} recorded runs of the example refund agent (its five tickets in turn: refunds, a question, "
        "an unknown order that fails, a refund waiting for approval), recorded on an embedded nats-server and "
        f"exported with `runledger export jsonl` ({data['events']:,} events, a {data['bytes'] / 1024:,.0f} KiB "
        "file), then replayed with no server. pytest: `python -m pytest --runledger-replay FILE --runledger-agent "
        "runledger.examples.refund_agent.agent:spec` in a new process, one test per run, with only the runledger "
        "plugin loaded (`PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 -p runledger.testing.pytest_plugin`): the wall-clock "
        "time a developer waits, and pytest's own reported duration (collection and the tests). In-process: "
        f"`Replayer(spec).replay_paths(FILE)` (read the file, replay every run). {repeat} rounds, the two taking "
        "turns. Changed decision: the same pytest command against the agent with its approval threshold at 40 "
        "(`bench.replay:cautious_spec`)."
    )
    rows = [
        ["pytest, runledger plugin only (wall)", *stat_cells(summary(data["pytest_wall"]))],
        ["pytest, runledger plugin only (its own duration)", *stat_cells(summary(data["pytest_own"]))],
        ["in-process Replayer", *stat_cells(summary(data["in_process"]))],
    ]
    section.tables.append(Table(f"seconds to replay {n} runs", ["how", *STAT_COLUMNS], rows))
    rows.append(["pytest, every installed plugin (wall)", *stat_cells(summary([data["every_plugin_wall"]]))])
    # Judged on the median: the machine is shared (2 cores), and one round in five can wait for another's work.
    wall = summary(data["pytest_wall"])
    section.goals.append(
        Goal(
            f"the pytest replayer replays {n} exported runs in under {GOAL_S:g} s",
            wall["p50"] < GOAL_S if n >= 200 else None,
            f"median of {repeat}: {wall['p50']:.2f} s wall for `pytest --runledger-replay` in a new process (slowest "
            f"{wall['max']:.2f} s; last: {data['summary']}); in-process "
            f"{summary(data['in_process'])['p50'] * 1000 / n:.2f} ms a run",
        )
    )
    section.goals.append(
        Goal(
            "a changed decision is named by its step",
            data["changed_diverged"] > 0 and "step 3" in data["changed_first"],
            f"threshold 40: {data['changed_diverged']} of {n} runs diverge; the first: {data['changed_first']}; "
            f"pytest: {data['changed_pytest_summary']}",
        )
    )
    section.notes.append(
        "The pytest wall time includes starting Python, importing pytest, runledger and the agent, and "
        "collecting the file; the replays themselves are the in-process line. With every plugin this development "
        f"environment installs autoloaded ({data['every_plugin_wall']:.1f} s wall, {data['every_plugin_summary']}), "
        "most of the time is other plugins' imports (langsmith's and hypothesis' pytest plugins, measured at "
        "~6 s and ~3 s with cProfile), not the replays."
    )
    section.data = data
    return section


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    data = measure(args.runs, args.repeat)
    for key in ("pytest_wall", "pytest_own", "in_process"):
        s = summary(data[key])
        print(f"{key:12} p50 {s['p50']:.3f} s  min {s['min']:.3f}  max {s['max']:.3f}  (n={int(s['n'])})")
    print(data["summary"])
    print(f"changed decision: {data['changed_diverged']} diverged; first: {data['changed_first']}")
    print(data["changed_pytest_failed"])


if __name__ == "__main__":
    main()
