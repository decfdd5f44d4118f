"""Server time of the page: the run list with 100,000 runs projected, and a 1,000-step run's page.

    python -m bench.ui                  # 100,000 runs (1,000 projected, copied in bulk) + one of 1,000 steps
    python -m bench.ui --runs 10000 --seed 1000 --requests 20
    python -m bench ui                  # as a part of the suite (docs/benchmarks.md)

What is measured is the server's time for a page over a projection of that size, so the
projection is real where it matters and built fast where it does not:

1. ``--seed`` synthetic runs of ``bench.project`` (plain events, as a third-party writer would
   publish them) and one run of 1,000 steps are published to a fresh nats-server and projected
   by runledger's own ``Projector`` into the page's DuckDB file: every row as the projector writes it.
2. The seed's rows are copied in bulk inside DuckDB (``INSERT ... SELECT`` over ``range``) until
   the file holds ``--runs`` runs: ``runs``, ``steps``, ``events`` and ``checkpoints``, each copy
   with its own run ids (and event ids, subjects) and its start times moved back an hour per copy,
   so the newest runs, sorts and filters see 100,000 distinct runs (``effect_keys``, which the
   page does not read, keeps the seed's). Publishing and projecting 100,000 runs (about 900,000
   events) through NATS would take minutes more here and time the projector, which
   ``bench.project`` measures; the copies are never in the stream, which the page does not notice
   (the run list reads the projection; a run page reads the log, and the 1,000-step run is real).
3. ``runledger ui`` is started as a user starts it (a subprocess on a free port, on that file),
   and each page is requested ``--requests`` times; the handler's own time is read from the
   ``Server-Timing`` header (``app;dur=ms``): what the server spends, without the client and the
   network. The synthetic runs' model has a price (``--prices``), so every run has a cost. The
   1,000-step run's page reads the run from the log (every event, content opened where it can be)
   and lays out 1,000 bars.
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
from bench.project import VERSION, Message, long_run, publish_raw, synthetic_run
from bench.report import STAT_COLUMNS, Goal, Section, SuiteOptions, Table, stat_cells
from runledger.log.client import connect
from runledger.projections.projector import Projector
from runledger.projections.store import ProjectionStore

ROOT = Path(__file__).resolve().parents[1]
TIMING = re.compile(r"app;dur=([0-9.]+)")
LONG_RUN = "run-long"
LIST_GOAL_MS = 300.0
LONG_RUN_GOAL_MS = 500.0
LIST_PAGES = ("run list, page 1 (newest 50)", "run list, sorted by cost", "run list, failed, agent-3",
              "run list, page 100")  # fmt: skip
LONG_PAGE = "run page, 1,000 steps"


def seed_messages(count: int) -> Iterator[Message]:
    for i in range(count):
        yield from synthetic_run(i)
    yield from long_run(1000, LONG_RUN)


# Each copy k of a seed run gets the id "<run_id>~<k>"; its events, subject and times follow.
_COPIES = {
    "runs": "run_id || '~' || k AS run_id, replace(subject, run_id, run_id || '~' || k) AS subject, "
    "started_at - k * INTERVAL 1 HOUR AS started_at, ended_at - k * INTERVAL 1 HOUR AS ended_at",
    "steps": "run_id || '~' || k AS run_id, started_at - k * INTERVAL 1 HOUR AS started_at",
    "events": "run_id || '~' || k AS run_id, id || '~' || k AS id, replace(subject, run_id, run_id || '~' || k) "
    "AS subject, ts - k * INTERVAL 1 HOUR AS ts",
    "checkpoints": "run_id || '~' || k AS run_id",
}


def multiply(db: Path, runs: int) -> dict[str, int]:
    """Copy the projected seed runs (all but the long one) until ``runs`` runs are projected."""
    store = ProjectionStore(db)
    try:
        con = store.con
        seed = int(con.execute("SELECT count(*) FROM runs WHERE run_id <> ?", [LONG_RUN]).fetchone()[0])
        copies = max(0, -(-runs // seed) - 1)
        con.execute("BEGIN")
        for name, replaced in _COPIES.items():
            con.execute(
                f"INSERT INTO {name} SELECT t.* REPLACE ({replaced}) FROM {name} AS t, range(1, ?) AS c(k) "
                "WHERE t.run_id <> ?",
                [copies + 1, LONG_RUN],
            )
        # Exactly ``runs`` besides the long run: the last copy may be partial.
        con.execute("DELETE FROM runs WHERE run_id IN (SELECT run_id FROM runs WHERE run_id <> ? "
                    "ORDER BY started_at DESC, run_id OFFSET ?)", [LONG_RUN, runs])  # fmt: skip
        for name in ("steps", "events", "checkpoints"):
            con.execute(f"DELETE FROM {name} WHERE run_id NOT IN (SELECT run_id FROM runs)")
        con.execute("COMMIT")
        con.execute("CHECKPOINT")
        return {name: int(con.execute(f"SELECT count(*) FROM {name}").fetchone()[0]) for name in _COPIES}
    finally:
        store.close()


async def build(url: str, db: Path, seed: int, runs: int) -> dict[str, Any]:
    """Publish and project the seed, then copy it to ``runs`` runs. Returns counts and seconds."""
    client = await connect(url)
    try:
        started = time.perf_counter()
        events = await publish_raw(client, seed_messages(seed))
        published = time.perf_counter() - started
        started = time.perf_counter()
        store = await asyncio.to_thread(ProjectionStore, db)
        try:
            await Projector(client, store, workers=0).run()
        finally:
            await asyncio.to_thread(store.close)
        projected = time.perf_counter() - started
    finally:
        await client.close()
    started = time.perf_counter()
    rows = await asyncio.to_thread(multiply, db, runs)
    return {"events_published": events, "publish_s": published, "project_s": projected,
            "copy_s": time.perf_counter() - started, "rows": rows}  # fmt: skip


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
    prices = home.parent / "prices.json"  # the synthetic runs' model priced: the cost column and sort mean something
    prices.write_text(json.dumps({VERSION["model"]: {"input": 3.0, "output": 15.0}}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "runledger", "ui", "--port", "0", "--nats", url, "--db", str(db), "--prices",
         str(prices)],
        cwd=ROOT, env={**os.environ, "RUNLEDGER_HOME": str(home)}, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    stdout = proc.stdout
    threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()
    try:
        first = lines.get(timeout=120)
    except queue.Empty:
        proc.kill()
        raise RuntimeError("runledger ui did not start within 120 s") from None
    return proc, first.split()[2]


def listed(base: str) -> int:
    with urllib.request.urlopen(base, timeout=120) as resp:
        found = re.search(r"<h1>Runs <span class=\"muted\">([\d,]+)</span>", resp.read().decode())
    return int(found.group(1).replace(",", "")) if found else 0


def measure(runs: int, seed: int, requests: int) -> dict[str, Any]:
    with server(sync_always=False) as state, tempfile.TemporaryDirectory(prefix="runledger-bench-ui-") as tmp:
        db = Path(tmp) / "ui.duckdb"
        built = asyncio.run(build(state.url, db, seed, runs))
        proc, base = start_page(state.url, db, Path(tmp) / "home")
        try:
            total = listed(base)
            if total != runs + 1:
                raise RuntimeError(f"the page lists {total} runs, expected {runs + 1}")
            pages = {
                LIST_PAGES[0]: base,
                LIST_PAGES[1]: f"{base}?sort=cost",
                LIST_PAGES[2]: f"{base}?status=failed&agent=agent-3",
                LIST_PAGES[3]: f"{base}?page=100",
                LONG_PAGE: f"{base}runs/{LONG_RUN}",
                "live part, 1,000 steps": f"{base}runs/{LONG_RUN}/live",
                "step page (of the 1,000)": f"{base}runs/{LONG_RUN}/steps/500",
                "run page, 5 steps": f"{base}runs/run-00000001",
            }
            samples: dict[str, list[tuple[float, float, int]]] = {name: [] for name in pages}
            for url in pages.values():
                get(url)  # warm: templates compiled, connection cursors made
            # Interleaved: each round requests every page once, so a noisy moment hits them all.
            for _ in range(requests):
                for name, url in pages.items():
                    samples[name].append(get(url))
            results = {
                name: {
                    "server_ms": summary([s[0] for s in got]),
                    "wall_ms": summary([s[1] for s in got]),
                    "bytes": got[-1][2],
                }
                for name, got in samples.items()
            }
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return {"runs": runs + 1, "seed": seed, "requests": requests, **built, "pages": results}


def run_suite(opts: SuiteOptions) -> Section:
    runs, seed, requests = (1_000, 100, 3) if opts.quick else (100_000, 1_000, 20)
    out = measure(runs, seed, requests)
    section = Section(part="ui", title=f"the page's server time over {out['runs']:,} projected runs", data=out)
    section.workload = (
        f"{out['runs']:,} runs in the page's projection: {seed:,} synthetic runs of `bench.project` and one run of "
        f"1,000 steps published ({out['events_published']:,} events) and projected by runledger's projector, then "
        f"the synthetic runs' rows copied in bulk inside DuckDB to {runs:,} ({out['rows']['events']:,} event rows, "
        f"{out['rows']['steps']:,} step rows). `runledger ui` serves that file from a subprocess; each page is "
        f"requested {requests} times, interleaved with the others, and the handler's own time is read from its "
        "`Server-Timing` header (server time: no client, no network). A run page reads its run from the log."
    )
    rows = [[name, *stat_cells(r["server_ms"]), f"{r['wall_ms']['p50']:.1f}", f"{r['bytes'] / 1024:.0f}"]
            for name, r in out["pages"].items()]  # fmt: skip
    section.tables.append(Table("server ms a page", ["page", *STAT_COLUMNS, "wall p50 ms", "KiB"], rows))
    pages = out["pages"]
    worst = max(LIST_PAGES, key=lambda n: pages[n]["server_ms"]["p50"])
    section.goals.append(Goal(
        f"with {out['runs']:,} runs projected, the run list answers in under {LIST_GOAL_MS:.0f} ms",
        None if opts.quick else pages[worst]["server_ms"]["p50"] < LIST_GOAL_MS,
        "p50 " + ", ".join(f"{n.removeprefix('run list, ')} {pages[n]['server_ms']['p50']:.1f} ms" for n in LIST_PAGES)
        + f" (slowest: {worst}).",
    ))  # fmt: skip
    long = pages[LONG_PAGE]["server_ms"]
    section.goals.append(Goal(
        f"a 1,000-step run's page answers in under {LONG_RUN_GOAL_MS:.0f} ms",
        None if opts.quick else long["p50"] < LONG_RUN_GOAL_MS,
        f"p50 {long['p50']:.1f} ms, p99 {long['p99']:.1f} ms.",
    ))  # fmt: skip
    section.notes.append(
        f"Built in {out['publish_s'] + out['project_s'] + out['copy_s']:.0f} s: published {out['publish_s']:.1f} s, "
        f"projected {out['project_s']:.1f} s, copied {out['copy_s']:.1f} s."
    )
    return section


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.ui", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--runs", type=int, default=100_000, help="runs besides the 1,000-step one")
    parser.add_argument("--seed", type=int, default=1_000, help="runs published and projected (the rest are copies)")
    parser.add_argument("--requests", type=int, default=20, help="requests a page")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not 0 < args.seed <= args.runs:
        parser.error("--seed must be between 1 and --runs")
    out = measure(args.runs, args.seed, args.requests)
    if args.json:
        print(json.dumps(out, indent=2))
        return out
    print(f"{out['runs']:,} runs ({out['seed']:,} projected, the rest copied); {out['rows']['events']:,} event rows; "
          f"built in {out['publish_s']:.1f} + {out['project_s']:.1f} + {out['copy_s']:.1f} s; "
          f"{out['requests']} requests a page")  # fmt: skip
    rows = [["page", "server p50 ms", "server p99 ms", "wall p50 ms", "KiB"]]
    for name, r in out["pages"].items():
        rows.append([name, f"{r['server_ms']['p50']:.1f}", f"{r['server_ms']['p99']:.1f}",
                     f"{r['wall_ms']['p50']:.1f}", f"{r['bytes'] / 1024:.0f}"])  # fmt: skip
    print(table(rows))
    return out


if __name__ == "__main__":
    main()
