"""A class of failure through the loop: tests/tripbot.py's failures grouped by `runledger failures`, the gate
and the matrix sweeping one class with `--class` in real sandboxes (and nothing of the other classes), the
fix's branch exported (`runledger export jsonl BRANCH`) and replayed clean in-process, and the page (a
headless Chromium) listing the classes and opening the matrix of one."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from runledger.cli import main
from runledger.log.client import connect
from runledger.sdk.lifecycle import start_run
from runledger.testing import Replayer
from tests import tripbot
from tests.integration.test_ui import browser, css, shot, ui_server, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.timeout(600)]
AGENT = "tests.tripbot:spec"
FIX = f"prompt={tripbot.FIXED_PROMPT}"
BRIEF = "prompt=Answer briefly."


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, object]:
    code = main(list(argv))
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_the_gate_and_the_matrix_take_a_class_and_the_page_opens_its_matrix(
    nats_url: str, sandbox_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("RUNLEDGER_HOME", str(tmp_path / "home"))

    async def record() -> dict[str, str]:
        causes = {}
        async with await connect(nats_url) as client:
            for n in range(30):  # three failures of each cause
                result = await start_run(client, tripbot.spec(), tripbot.trip(n), run_id=f"trip-{n:03d}")
                causes[result.run_id] = tripbot.cause(tripbot.trip(n))
        return {run_id: cause for run_id, cause in causes.items() if cause}

    failed = asyncio.run(record())
    tripbot.BOOKED.clear()  # the completed runs booked; the branches below must book nothing
    code, classes = _json(capsys, "failures", "--nats", nats_url, "--json")
    assert code == 0 and isinstance(classes, list) and len(classes) == 3
    class_of = {failed[c["example_runs"][0]]: c["class_id"] for c in classes}
    currency, long_stay = class_of["currency"], class_of["long stay"]
    runs_of = {cause: sorted(r for r, k in failed.items() if k == cause) for cause in class_of}

    # The gate over one class: its three failed runs, the fix at the decision: each improved, the gate open.
    code, gate = _json(capsys, "rerun", "--nats", nats_url, "--class", currency, "--agent", AGENT, "--mode",
                       "counterfactual", "--base-mode", "live", "--at-step", "2", "--set", FIX, "--json")  # fmt: skip
    assert isinstance(gate, dict) and code == 0, gate
    assert sorted(c["parent_run_id"] for c in gate["cases"]) == runs_of["currency"]
    assert {c["verdict"] for c in gate["cases"]} == {"improved"} and gate["gate"] == "open"
    assert currency in gate["where"]
    # The fix's branch, exported, replays clean in-process against the fixed code, its simulated booking included.
    branch = gate["cases"][0]["branch_run_id"]
    assert main(["export", "jsonl", branch, "--nats", nats_url, "--out", str(tmp_path / "fix.jsonl")]) == 0
    capsys.readouterr()
    (replayed,) = Replayer(tripbot.fixed_spec()).replay_paths(tmp_path / "fix.jsonl")
    assert replayed.ok and replayed.replayed == "completed" and replayed.steps == 5, str(replayed)

    # The matrix over another class, narrowed by --where: two runs x two candidates; the fix is the winner.
    keep = runs_of["long stay"][:2]
    code, matrix = _json(capsys, "rerun", "--nats", nats_url, "--class", long_stay, "--where",
                         f"run_id IN ('{keep[0]}', '{keep[1]}')", "--agent", AGENT, "--mode", "counterfactual",
                         "--base-mode", "live", "--at-step", "4", "--set", FIX, "--set", BRIEF, "--json")  # fmt: skip
    assert isinstance(matrix, dict) and code == 0, matrix
    assert sorted(matrix["runs"]) == keep
    cells = {c["label"]: {r: cell["result"] for r, cell in c["cells"].items()} for c in matrix["candidates"]}
    assert cells == {FIX: dict.fromkeys(keep, "fixed"), BRIEF: dict.fromkeys(keep, "still fails")}
    assert tripbot.BOOKED == []  # live base mode: every booking a branch asked for was simulated

    with ui_server(nats_url, tmp_path) as base, browser() as driver:
        deadline = time.monotonic() + 120  # the page's projection catches up with the stream
        while True:
            driver.get(f"{base}failures")
            wait_for(driver, "#failures, #failures-empty")
            rows = {r.get_attribute("data-class"): r for r in css(driver, "#failures tbody tr[data-class]")}
            if len(rows) == 3 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert sorted(rows) == sorted(class_of.values())
        assert {r.get_attribute("data-runs") for r in rows.values()} == {"3"}
        assert "tool 'quote'" in rows[class_of["nowhere"]].find_element("css selector", "td.error").text
        # Sealed in the projection, opened with the page's credentials (a local server's own) and masked.
        assert rows[currency].find_element("css selector", "td.message").text == (
            "unknown currency <str> for trip TR-<n> at <n>"
        )
        shot(driver, "failures")
        rows[currency].find_element("css selector", "a.open-matrix").click()
        deadline = time.monotonic() + 120
        while True:
            wait_for(driver, "#matrix, #matrix-empty")
            matrix_rows = css(driver, "#matrix tbody tr[data-run]")
            if len(matrix_rows) == 3 or time.monotonic() > deadline:
                break
            time.sleep(1)
            driver.refresh()
        assert f"class={currency}" in driver.current_url and currency in wait_for(driver, "#matrix-class").text
        page = {
            (row.get_attribute("data-run"), cell.get_attribute("data-candidate")): cell.get_attribute("data-result")
            for row in matrix_rows for cell in row.find_elements("css selector", "td.cell")
        }  # fmt: skip
        assert page == {(r, FIX): "fixed" for r in runs_of["currency"]}  # no long stay's branches in this class
        driver.get(f"{base}matrix?class={long_stay}")
        wait_for(driver, "#matrix")
        assert sorted(r.get_attribute("data-run") for r in css(driver, "#matrix tbody tr[data-run]")) == keep
