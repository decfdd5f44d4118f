"""Server time of the page: the run list with many runs projected, and a 1,000-step run's page.

    python -m bench.ui                  # 10,000 synthetic runs + one run of 1,000 steps
    python -m bench.ui --runs 2000 --requests 20

Publishes the synthetic runs of ``bench.project`` (plain events, as a third-party writer would),
starts ``runledger ui`` as a user does (a subprocess on a free port, its own projection file),
waits until the page has projected everything, then requests each page ``--requests`` times and
reads the handler's own time from the ``Server-Timing`` header (``app;dur=ms``): what the server
spends, without the client and the network. The 1,000-step run's page reads the run from the log
(every event, content opened where it can be) and lays out 1,000 bars.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import server, summary, table
from bench.project import Message, long_run, publish_raw, synthetic_run
from runledger.log.client import connect

ROOT = Path(__file__).resolve().parents[1]
TIMING = re.compile(r"app;dur=([0-9.]+)")


def runs(count: int) -> Iterator[Message]:
    for i in range(count):
        yield from synthetic_run(i)
    yield from long_run(1000)


def get(url: str) -> tuple[float, float, int]:
    """(server ms from Server-Timing, wall ms, bytes)."""
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as resp:
        body = resp.read()
        header = resp.headers.get("Server-Timing", "")
    wall = (time.perf_counter() - started) * 1000
    found = TIMING.search(header)
    return (float(found.group(1)) if found else float("nan")), wall, len(body)


def start_page(url: str, db: Path, home: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "runledger", "ui", "--port", "0", "--nats", url, "--db", str(db)],
        cwd=ROOT, env={**os.environ, "RUNLEDGER_HOME": str(home)}, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    stdout = proc.stdout
    threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()
    first = lines.get(timeout=120)
    return proc, first.split()[2]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with server(sync_always=False) as state, tempfile.TemporaryDirectory(prefix="runledger-bench-ui-") as tmp:

        async def publish() -> int:
            client = await connect(state.url)
            try:
                return await publish_raw(client, runs(args.runs))
            finally:
                await client.close()

        started = time.perf_counter()
        events = asyncio.run(publish())
        published_s = time.perf_counter() - started
        proc, base = start_page(state.url, Path(tmp) / "ui.duckdb", Path(tmp) / "home")
        try:
            started = time.perf_counter()
            total = 0
            while total < args.runs + 1:  # the list waits (bounded) for the projection on each request
                with urllib.request.urlopen(base, timeout=120) as resp:
                    found = re.search(r"<h1>Runs <span class=\"muted\">(\d+)</span>", resp.read().decode())
                total = int(found.group(1)) if found else 0
                if time.perf_counter() - started > 600:
                    raise RuntimeError(f"the page projected {total} of {args.runs + 1} runs in 10 minutes")
            projected_s = time.perf_counter() - started
            pages = {
                "run list, page 1 (newest 50)": base,
                "run list, sorted by cost": f"{base}?sort=cost",
                "run list, failed, agent-3": f"{base}?status=failed&agent=agent-3",
                "run list, page 100": f"{base}?page=100",
                "run page, 1,000 steps": f"{base}runs/run-long",
                "live part, 1,000 steps": f"{base}runs/run-long/live",
                "step page (of the 1,000)": f"{base}runs/run-long/steps/500",
                "run page, 5 steps": f"{base}runs/run-00000001",
            }
            results: dict[str, Any] = {}
            for name, url in pages.items():
                get(url)  # warm: templates compiled, connection cursors made
                samples = [get(url) for _ in range(args.requests)]
                results[name] = {
                    "server_ms": summary([s[0] for s in samples]),
                    "wall_ms": summary([s[1] for s in samples]),
                    "bytes": samples[-1][2],
                }
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return {"runs": args.runs + 1, "events": events, "publish_s": published_s, "project_s": projected_s,
            "requests": args.requests, "pages": results}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.ui", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10_000, help="synthetic runs besides the 1,000-step one")
    parser.add_argument("--requests", type=int, default=30, help="requests a page")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    out = measure(args)
    if args.json:
        print(json.dumps(out, indent=2))
        return out
    print(f"{out['runs']:,} runs, {out['events']:,} events; page caught up {out['project_s']:.1f}s after start; "
          f"{out['requests']} requests a page")  # fmt: skip
    rows = [["page", "server p50 ms", "server p99 ms", "wall p50 ms", "KiB"]]
    for name, r in out["pages"].items():
        rows.append([name, f"{r['server_ms']['p50']:.1f}", f"{r['server_ms']['p99']:.1f}",
                     f"{r['wall_ms']['p50']:.1f}", f"{r['bytes'] / 1024:.0f}"])  # fmt: skip
    print(table(rows))
    return out


if __name__ == "__main__":
    main()

