"""The benchmark report: what each part returns, and the Markdown page they make together.

Every part of the suite (``bench.record``, ``bench.resume``, ...) returns a ``Section``:
its workload in words, its tables, its goals (met or not, with the numbers), notes on
durability and fairness, and the plots it drew. ``render`` turns the sections into
``docs/benchmarks.md``; ``data`` keeps the raw numbers, which also go to a JSON file.

Numbers in a table are always paired: a measurement and its baseline were taken in the
same process, against the same server, interleaved, so the ratio holds even when the
absolute times are noisy (a shared 2-core machine).
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import statistics
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class SuiteOptions:
    """What every part is given. ``quick``: a smoke run (a handful of steps), numbers meaningless.

    ``deadline`` is a ``time.monotonic()`` value by which the whole suite should be done; a part
    that can trade repeats for time (rerun's cold containers) sizes itself to it and says so.
    """

    quick: bool
    plot_dir: Path
    deadline: float | None = None


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]


@dataclass
class Goal:
    text: str
    met: bool | None  # None: could not be judged (the part did not measure it)
    detail: str
    why: str = ""  # what stands between a missed goal and the machine, as measured (shown when missed)


@dataclass
class Section:
    part: str
    title: str
    workload: str = ""
    tables: list[Table] = field(default_factory=list)
    goals: list[Goal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    plots: list[Path] = field(default_factory=list)
    blocks: list[str] = field(default_factory=list)  # preformatted text (a part's own report), shown as is
    data: dict[str, Any] = field(default_factory=dict)
    status: str = "ran"  # "ran" | "not run" | "failed"
    reason: str = ""
    seconds: float = 0.0
    started: str = ""  # when the part ran (UTC), and the load average then: parts of a report may come
    load: str = ""  # from different runs (`python -m bench record` refreshes one part)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "plots": [str(p) for p in self.plots]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Section:
        data = dict(data)
        data["tables"] = [Table(**t) for t in data.get("tables", [])]
        data["goals"] = [Goal(**g) for g in data.get("goals", [])]
        data["plots"] = [Path(p) for p in data.get("plots", [])]
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def not_run(part: str, title: str, reason: str) -> Section:
    return Section(part=part, title=title, status="not run", reason=reason)


# -- numbers ---------------------------------------------------------------------------------------------


def ratio_stats(pairs: Sequence[tuple[float, float]]) -> dict[str, float]:
    """Ratios a/b computed pair by pair (each pair measured in the same round): median, min, max."""
    ratios = [a / b for a, b in pairs if b > 0]
    return {"p50": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "n": len(ratios)}


def num(value: float, digits: int = 2) -> str:
    """A number with ``digits`` significant-ish decimals: 0.412, 3.12, 41.2, 1,234."""
    if value != value:  # NaN
        return "-"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.{digits + 1}f}" if magnitude < 1 else f"{value:.{digits}f}"


def stat_cells(s: dict[str, float], scale: Callable[[float], float] = lambda v: v) -> list[str]:
    return [num(scale(s["p50"])), num(scale(s["p99"])), num(scale(s["min"])), num(scale(s["max"])), str(int(s["n"]))]


STAT_COLUMNS = ["p50", "p99", "min", "max", "n"]


def ratio_cell(r: dict[str, float]) -> str:
    """``1.23x (1.10-1.41)``: the median of the paired ratios and their range over repeats."""
    if r["n"] <= 1:
        return f"{r['p50']:.2f}x"
    return f"{r['p50']:.2f}x ({r['min']:.2f}-{r['max']:.2f})"


# -- the page --------------------------------------------------------------------------------------------


def load_average() -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


def _version(module: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, str]:
    """Facts about this machine and the software measured, for the report header."""
    import sqlite3

    from bench.postgres import server_version

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        memory = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
        mem = f"{int(memory) / 1024**2:.0f} GiB"
    except (OSError, IndexError, ValueError):
        mem = "unknown"
    try:
        from runledger.log.server import nats_server_binary

        nats = subprocess.run([nats_server_binary(), "--version"], capture_output=True, text=True, timeout=10)
        server = nats.stdout.strip() or nats.stderr.strip()
    except Exception as exc:  # the header must not sink the report; say what went wrong instead
        server = f"unknown ({exc})"
    packages = ["nats-py", "duckdb", "langgraph", "langgraph-checkpoint-sqlite", "langgraph-checkpoint-postgres",
                "psycopg", "dbos", "eventsourcing", "docker"]  # fmt: skip
    return {
        "cpu": f"{os.cpu_count()} cores, {cpu}",
        "memory": mem,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "nats-server": server,
        "sqlite": sqlite3.sqlite_version,
        "postgresql": server_version(),
        **{name: _version(name) for name in packages},
    }


def _md_table(table: Table) -> list[str]:
    def row(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    lines = [f"**{table.title}**", ""] if table.title else []
    lines.append(row(table.columns))
    lines.append("|" + "|".join("---" for _ in table.columns) + "|")
    lines += [row(r) for r in table.rows]
    return [*lines, ""]


def _goal_line(goal: Goal) -> str:
    mark = {True: "**met**", False: "**missed**", None: "not judged"}[goal.met]
    why = f" Why: {goal.why}" if goal.met is False and goal.why else ""
    return f"- {goal.text}: {mark}. {goal.detail}{why}".rstrip()


def render(sections: Sequence[Section], header: dict[str, Any], doc_dir: Path) -> str:
    """The Markdown report; plot paths are written relative to ``doc_dir`` (where the page lives)."""
    lines = ["# Benchmarks", ""]
    lines += [
        "Generated by `python -m bench all` (`deploy/dev.sh bench`); do not edit by hand. Each part runs in one",
        "process against servers it starts itself. Every comparison is paired: a measurement and its baseline run",
        "interleaved in the same process, and each ratio is computed pair by pair (median, then the range over",
        "repeats in brackets), so it holds even when the machine is busy. Times are milliseconds unless marked.",
        "",
    ]
    lines += ["| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in header.items()]
    lines.append("")
    lines += [
        "| part | status | goals met | seconds | ran at | load average then (1, 5, 15 min) |",
        "|---|---|---|---|---|---|",
    ]
    for s in sections:
        status = s.status if s.status == "ran" else f"{s.status}: {s.reason}"
        judged = [g for g in s.goals if g.met is not None]
        goals = f"{sum(1 for g in judged if g.met)} of {len(judged)}" if judged else "-"
        lines.append(f"| [{s.part}](#{s.part}) | {status} | {goals} | {s.seconds:.0f} | {s.started} | {s.load} |")
    lines.append("")
    for s in sections:
        lines += [f'<a id="{s.part}"></a>', "", f"## {s.part}: {s.title}", ""]
        if s.status != "ran":
            lines += [f"**{s.status}**: {s.reason}", ""]
            if not s.tables:
                continue
        if s.workload:
            lines += ["**Workload.** " + s.workload.strip(), ""]
        if s.goals:
            lines += [_goal_line(g) for g in s.goals]
            lines.append("")
        for table in s.tables:
            lines += _md_table(table)
        for block in s.blocks:
            lines += ["```text", block.rstrip(), "```", ""]
        for note in s.notes:
            lines += [f"- {note}"]
        if s.notes:
            lines.append("")
        for plot in s.plots:
            rel = os.path.relpath(plot, doc_dir) if plot.is_absolute() else str(plot)
            lines += [f"![{s.part}: {plot.stem}]({rel})", ""]
    return "\n".join(lines).rstrip() + "\n"


def now_utc() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
