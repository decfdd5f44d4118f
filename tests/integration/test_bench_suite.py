"""The benchmark suite in its smoke mode: every part's table and plots are written, so the suite cannot rot.

Runs ``python -m bench all --quick`` in process (a handful of steps, real nats-server, real
sqlite peers, real DuckDB) without the Docker parts and without ``load`` (its own test
covers it); a failing part is reported as failed without sinking the others; a run of one
part keeps the other parts' sections.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench.__main__ as suite
from bench.report import Section, SuiteOptions

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RUN = ["record", "resume", "project", "protect"]
SKIPPED = ["rerun", "channel", "load"]
TABLES = {  # a heading of each part's table, and a cell its first row must have
    "record": ("ms per step", "| SDK | all |"),
    "resume": ("ms to resume / load", "| 10 | runledger resume→first live |"),
    "project": ("analyst queries on", "| Q1 |"),
    "protect": ("per policy", "| full, unsealed (no protection) |"),
}
PLOTS = {
    "record": ["record-cdf.png", "record-p50.png"],
    "resume": ["resume.png"],
    "project": ["project-rates.png", "project-queries.png"],
    "protect": ["protect.png"],
}


def section_text(report: str, part: str) -> str:
    start = report.index(f"## {part}:")
    end = report.find("\n## ", start + 1)
    return report[start : end if end >= 0 else None]


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
