"""The benchmark suite in its smoke mode: every part's table and plots are written, so the suite cannot rot.

Runs ``python -m bench all --quick`` in process (a handful of steps, real nats-server, real
sqlite peers, a real private PostgreSQL for the Postgres peers, real DuckDB) without the Docker
parts, without ``load`` (its own test covers it) and without ``ui``; a failing part is reported
as failed without sinking the others; a run of one part keeps the other parts' sections. Without
PostgreSQL the Postgres peers are reported as not measured, with the reason (under CI=true, where
.ci/run installs it, its absence fails).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import psycopg
import pytest

import bench.__main__ as suite
import bench.postgres
import bench.record
from bench.report import Section, SuiteOptions
from tests.conftest import IN_CI

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RUN = ["record", "resume", "project", "protect", "cli"]
SKIPPED = ["rerun", "channel", "load", "ui", "replay"]  # replay: tests/integration/test_replay_export.py
TABLES = {  # a heading of each part's table, and a cell its first row must have
    "record": ("ms per step", "| SDK | all |"),
    "resume": ("ms to resume / load", "| 10 | runledger resume→first live |"),
    "project": ("analyst queries on", "| Q1 |"),
    "protect": ("per policy", "| full, unsealed (no protection) |"),
    "cli": ("seconds per call", "| `python -c pass` |"),
}
PLOTS = {
    "record": ["record-cdf.png", "record-p50.png"],
    "resume": ["resume.png"],
    "project": ["project-rates.png", "project-queries.png"],
    "protect": ["protect.png"],
    "cli": [],
}


def section_text(report: str, part: str) -> str:
    start = report.index(f"## {part}:")
    end = report.find("\n## ", start + 1)
    return report[start : end if end >= 0 else None]


@pytest.mark.timeout(240)  # two private PostgreSQL clusters start (record, resume): ~10 s each on a busy machine
def test_quick_suite_writes_every_table_and_plot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert suite.main(["all", "--quick", "--skip", *SKIPPED, "--out", str(tmp_path)]) == 0

    report = (tmp_path / "benchmarks.md").read_text()
    assert "QUICK" in report and "uptime before" in report and "load average" in report
    for part in RUN:
        text = section_text(report, part)
        heading, cell = TABLES[part]
        assert f"**{heading}" in text, f"{part}: no table {heading!r}"
        assert cell in text, f"{part}: no row with {cell!r}"
        assert "**Workload.**" in text, f"{part} does not state its workload"
        for png in PLOTS[part]:
            path = tmp_path / "benchmarks" / png
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{png} is not a PNG"
            assert f"(benchmarks/{png})" in text, f"{part} does not show {png}"
    for part in ("record", "resume"):  # the peers were measured and the goals judged
        text = section_text(report, part)
        assert "LangGraph" in text and "eventsourcing" in text
        assert "**met**" in text or "**missed**" in text
    assert "synchronous=FULL" in section_text(report, "record")  # durability of the peers, as read from sqlite
    record = section_text(report, "record")
    assert "| LangGraph RunledgerSaver | all |" in record  # issue 15: the saver on runledger, same put
    assert "**LangGraph checkpoint put per step: RunledgerSaver / LangGraph's own saver" in record
    assert "| LangGraph SqliteSaver |" in record.split("RunledgerSaver / LangGraph's own saver")[1]
    pg_reason = bench.postgres.unavailable()
    assert not (IN_CI and pg_reason), f"CI installs postgresql (.ci/run): {pg_reason}"
    postgres_rows = {
        "record": ["| LangGraph PostgresSaver | all |", "| DBOS step | all |"],
        "resume": ["| LangGraph PostgresSaver get_tuple |", "| DBOS list_workflow_steps |"],
    }
    for part, rows in postgres_rows.items():
        text = section_text(report, part)
        if pg_reason:
            assert f"not measured: {pg_reason}" in text, part
            assert not any(row in text for row in rows), part
        else:
            assert all(row in text for row in rows), (part, rows)
            for peer in ("PostgresSaver", "DBOS"):  # their goals judged, met or missed
                assert re.search(rf"faster than [^\n:]*{peer}[^\n:]*: \*\*(met|missed)\*\*", text), (part, peer)
    if not pg_reason:  # durability of the Postgres peers, as read from the server
        assert "`fsync=on`" in record and "`synchronous_commit=on`" in record
    results = json.loads((tmp_path / "benchmarks" / "results.json").read_text())
    assert [s["part"] for s in results["sections"]] == RUN
    assert all(s["status"] == "ran" for s in results["sections"])

    # One part run alone: a failing one is reported, the exit status says so, the others' sections stay.
    def boom(opts: SuiteOptions) -> Section:
        raise RuntimeError("planted failure")

    monkeypatch.setattr(suite, "PARTS", [*suite.PARTS, suite.Part("boom", "bench.report", "a part that fails", boom)])
    assert suite.main(["boom", "--quick", "--out", str(tmp_path)]) == 1
    report = (tmp_path / "benchmarks.md").read_text()
    assert "failed: RuntimeError: planted failure" in report
    for part in RUN:
        assert TABLES[part][1] in section_text(report, part)


def test_every_registered_part_is_available() -> None:
    """Each part's module imports and has the suite's entry point (load: wired through an adapter)."""
    names = [p.name for p in suite.PARTS]
    assert names[:3] == ["record", "resume", "project"] and names[-1] == "rerun"  # rerun last: it fits the budget
    assert "load" in names
    for part in suite.PARTS:
        assert suite.available(part) == "", part.name


def test_private_postgres_is_durable_and_leaves_nothing() -> None:
    """bench.postgres: a cluster with fsync and synchronous commit on, reachable on its port, removed after."""
    if reason := bench.postgres.unavailable():
        assert not IN_CI, f"CI installs postgresql (.ci/run): {reason}"
        pytest.skip(reason)
    with bench.postgres.postgres() as pg:
        assert pg.settings()["fsync"] == "on" and pg.settings()["synchronous_commit"] == "on"
        url = pg.create_database("probe")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (v int)")
            conn.execute("INSERT INTO t VALUES (42)")
            assert conn.execute("SELECT v FROM t").fetchall() == [(42,)]
        with pytest.raises(ValueError, match="letters, digits"):
            pg.create_database("x; DROP DATABASE postgres")
        data = pg.data_dir
    assert not data.exists() and not data.parent.exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=2)


@pytest.mark.timeout(180)
def test_record_without_postgres_reports_the_postgres_peers_not_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No PostgreSQL binaries: record still runs, the other peers are measured, the Postgres ones are
    reported as not measured with the reason, and their goals are left unjudged."""
    monkeypatch.setattr(bench.postgres, "PG_ROOT", tmp_path / "no-postgresql")
    reason = bench.postgres.unavailable()
    assert "apt-get install -y postgresql" in reason
    section = bench.record.run_suite(SuiteOptions(quick=True, plot_dir=tmp_path))
    systems = {row[0] for row in section.tables[0].rows}
    assert {"SDK", "LangGraph SqliteSaver", "LangGraph RunledgerSaver", "eventsourcing SQLite"} <= systems
    assert not systems & {"LangGraph PostgresSaver", "DBOS step"}
    unjudged = {g.text: g.detail for g in section.goals if g.met is None}
    assert set(unjudged) == {
        "SDK step at least 2x faster than LangGraph PostgresSaver (p50)",
        "SDK step at least 2x faster than DBOS step (p50)",
    }
    assert all(detail == f"not measured: {reason}" for detail in unjudged.values())
    assert any(f"not measured: {reason}" in note for note in section.notes)
