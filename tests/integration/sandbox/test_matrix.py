"""The counterfactual matrix: three candidate changes over ten recorded failures, re-driven in real
sandboxes, as the CLI's table, its JSON and the page's table (a headless Chromium), which agree cell by cell.

The failures: five refunds that wait for an approval (suspended: the recorded model refunds a 950.00
laptop at once) and five tickets whose order does not exist (failed: the lookup raises). The candidates:
the stricter model (asks for a photo instead: it fixes the five waiting refunds and not the missing
orders) and two prompts (the scripted model decides as before: nothing is fixed). Which single change
fixes this class of failure: the model."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from runledger.cli import main
from runledger.examples.refund_agent.agent import TICKETS, spec
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import connect
from runledger.sdk.lifecycle import start_run
from tests.integration.test_ui import browser, css, shot, ui_server, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.timeout(900)]
AGENT = "runledger.examples.refund_agent.agent:spec"
CANDIDATES = [
    "model=runledger.examples.refund_agent.agent:strict_model",
    "prompt=You are a careful support agent. Refund only what the policy allows.",
    "prompt=Answer briefly.",
]


def test_three_candidates_over_ten_failures_in_the_cli_json_and_the_page(
    nats_url: str, sandbox_image: str, payments: PaymentsService, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("RUNLEDGER_HOME", str(tmp_path / "home"))
    waiting, missing = TICKETS[3], TICKETS[2]  # T-1004 waits for an approval, T-1003's order does not exist

    async def record() -> list[str]:
        ids = []
        async with await connect(nats_url) as client:
            for n in range(5):
                for ticket in (waiting, missing):
                    result = await start_run(client, spec(), {**ticket, "ticket": f"{ticket['ticket']}-{n}"},
                                             run_id=f"mx-{ticket['ticket']}-{n}")  # fmt: skip
                    assert result.status == ("suspended" if ticket is waiting else "failed"), result
                    ids.append(result.run_id)
        return ids

    failures = asyncio.run(record())
    argv = ["rerun", "--nats", nats_url, "--agent", AGENT, "--where", "run_id LIKE 'mx-%'",
            "--mode", "counterfactual", "--base-mode", "live", "--at-step", "0", "--pool", "2",
            *(arg for c in CANDIDATES for arg in ("--set", c))]  # fmt: skip

    code = main([*argv, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert sorted(report["runs"]) == sorted(failures)
    table = {c["label"]: {run: cell["result"] for run, cell in c["cells"].items()} for c in report["candidates"]}
    assert list(table) == CANDIDATES
    strict, careful, brief = (table[c] for c in CANDIDATES)
    held = {r: c for r, c in report["candidates"][0]["cells"].items() if "T-1004" in r}
    assert {r for r, v in strict.items() if v == "fixed"} == {r for r in failures if "T-1004" in r}, held
    assert {r for r, v in strict.items() if v == "still fails"} == {r for r in failures if "T-1003" in r}
    assert set(careful.values()) == set(brief.values()) == {"still fails"}
    tallies = {c["label"]: c["counts"] for c in report["candidates"]}
    assert tallies[CANDIDATES[0]]["fixed"] == 5 and tallies[CANDIDATES[1]]["still fails"] == 10
    assert all(c["tokens"] > 0 for c in report["candidates"])
    assert payments.calls() == []  # no branch refunded for real: live base mode simulates new effects

    # The CLI's table: a row per recorded run, a column per candidate, a tally line per candidate.
    code = main(argv)  # the same matrix again, as text: new branches, the same verdicts
    text = capsys.readouterr().out
    assert code == 0, text
    assert f"{CANDIDATES[0]}: fixed 5, still fails 5;" in text
    assert f"{CANDIDATES[2]}: still fails 10;" in text
    rows = [line for line in text.splitlines() if line.startswith("mx-")]
    assert len(rows) == 10 and all(len(line.split()) >= 4 for line in rows)

    # The page draws the same matrix from the projection: its latest branch per run and candidate.
    with ui_server(nats_url, tmp_path) as base, browser() as driver:
        # The page's projection starts empty and catches up with the stream (a busy machine takes a while):
        # reload, for at most two minutes, until every branch is in (the page says "no branches yet" before).
        deadline = time.monotonic() + 120
        while True:
            driver.get(f"{base}matrix")
            wait_for(driver, "#matrix, #matrix-empty")
            cells = css(driver, "#matrix tbody td.cell[data-result]")
            if len([c for c in cells if c.get_attribute("data-result")]) == 30 or time.monotonic() > deadline:
                break
            time.sleep(1)
        wait_for(driver, "#matrix")
        heads = [h.get_attribute("data-candidate") for h in css(driver, "#matrix thead th.candidate")]
        assert sorted(heads) == sorted(CANDIDATES)
        page = {
            (row.get_attribute("data-run"), cell.get_attribute("data-candidate")): cell.get_attribute("data-result")
            for row in css(driver, "#matrix tbody tr") for cell in row.find_elements("css selector", "td.cell")
        }  # fmt: skip
        assert page == {(run, cand): table[cand][run] for cand in CANDIDATES for run in failures}
        strict_tally = next(t for t in css(driver, "#matrix tfoot td.tally")
                            if t.get_attribute("data-candidate") == CANDIDATES[0])  # fmt: skip
        assert "fixed 5" in strict_tally.text and "still fails 5" in strict_tally.text
        shot(driver, "matrix")
        driver.get(f"{base}matrix?status=suspended")
        wait_for(driver, "#matrix")
        assert len(css(driver, "#matrix tbody tr")) == 5
