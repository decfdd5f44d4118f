"""The fix loop on the path a user takes, with a package agent of the test's own (tests/tripbot.py) written
outside the project, recorded, then edited in place; real nats-server, real sandboxes.

Four trips, two of them in a currency the scripted model does not map: the agent cannot unpack its
answer (``ValueError``, raised after the last model call). Then, as the user goes:

1. the matrix, forked at the decision by default (the last model call at or before the failing step),
   names the model that maps the currency: the one that fixes as many but breaks the other trips is not it;
2. a change that fixes nothing (a prompt the scripted model does not read) closes the gate, the JUnit
   failures carrying the exception;
3. a model change forked after the last model call is `not exercised`, in the plan and in the verdicts;
4. the agent edited in place re-runs as a counterfactual of the agent element, alone and as a gate whose
   check reads the booking's arguments; the booking service, not idempotent, is never called again;
5. `runs` and `export` leave the branches out unless asked, `runs --branches` lists each under its parent.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from runledger.cli import main
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import connect
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from runledger.sdk.agent import load_agent
from runledger.sdk.lifecycle import start_run
from tests import tripbot_package as tripbot
from tests.integration.test_ui import ui_server

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.timeout(600)]


def test_the_fix_loop_on_an_agent_edited_in_place(
    nats_url: str, sandbox_image: str, payments: PaymentsService, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    with tripbot.installed(tmp_path, payments.url, monkeypatch) as (package, name, ref):
        _loop(nats_url, payments, tmp_path, package, name, ref, capsys)


def _cli(capsys: pytest.CaptureFixture[str], nats_url: str, *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main([argv[0], "--nats", nats_url, *argv[1:]])
    return code, capsys.readouterr().out


def _loop(
    nats_url: str, payments: PaymentsService, tmp_path: Path, package: str, name: str, ref: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    async def record() -> dict[str, str]:
        statuses = {}
        async with await connect(nats_url) as client:
            for trip in tripbot.TRIPS:
                result = await start_run(client, load_agent(ref), trip, run_id=f"{tag}-{trip['trip']}")
                statuses[result.run_id] = result.status
        return statuses

    tag = name
    statuses = asyncio.run(record())
    failing = {f"{tag}-{t}" for t in tripbot.FAILING}
    assert statuses == {r: "failed" if r in failing else "completed" for r in statuses}, statuses
    assert len(payments.calls()) == 2  # the two trips that completed booked once each
    mapping, eager = f"model={package}.agent:mapping_model", f"model={package}.agent:eager_model"
    brief = "prompt=Answer briefly."
    sweep = ["rerun", "--agent", ref, "--mode", "counterfactual", "--base-mode", "live"]
    everything, failures = f"agent = '{name}'", f"agent = '{name}' AND status = 'failed'"

    # 1. The matrix with no --at-step forks each run at its decision (step 2, the price) and names the fix.
    code, out = _cli(capsys, nats_url, *sweep, "--where", everything, "--set", mapping, "--set", eager,
                     "--set", brief, "--json")  # fmt: skip
    report = json.loads(out)
    assert code == 0, report
    table = {c["label"]: {run: cell["result"] for run, cell in c["cells"].items()} for c in report["candidates"]}
    assert set(table[mapping].values()) == {"fixed", "pass"} and table[mapping] == {
        r: "fixed" if r in failing else "pass" for r in statuses}  # fmt: skip
    assert table[eager] == {r: "fixed" if r in failing else "regressed" for r in statuses}
    assert table[brief] == {r: "still fails" if r in failing else "pass" for r in statuses}
    assert report["best"]["candidates"] == [mapping], report["best"]
    assert {c["fork_step"] for c in report["candidates"][0]["cells"].values()} == {2}

    # 2. A change that fixes nothing closes the gate; the JUnit failures carry the exception.
    junit = tmp_path / "gate.xml"
    code, out = _cli(capsys, nats_url, *sweep, "--where", failures, "--set", brief, "--junit", str(junit))
    assert code == 1, out
    assert "closed by 2 still failing" in out and "ValueError: too many values to unpack" in out, out
    suite = ET.parse(junit).getroot()[0]
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("2", "2", "0")
    for case in suite.iter("testcase"):
        failure = case.find("failure")
        assert failure is not None and failure.get("type") == "still_failing"
        assert "ValueError: too many values to unpack (expected 2)" in (failure.get("message") or "")
        text = failure.text or ""
        assert f"recorded run {case.get('name')} failed at step 3 (exception): ValueError: too many values" in text

    # 3. Forked after the last model call, a model change is never exercised: the plan says so first.
    code, out = _cli(capsys, nats_url, "rerun", f"{tag}-TR-02", "--agent", ref, "--mode", "counterfactual",
                     "--set", mapping, "--at-step", "3", "--plan")  # fmt: skip
    assert code == 0 and "NOT EXERCISED: the record has no model call from step 3 on" in out, out
    code, out = _cli(capsys, nats_url, *sweep, "--where", failures, "--set", mapping, "--at-step", "3", "--json")
    late = json.loads(out)
    assert code == 1 and late["verdicts"]["not_exercised"] == 2 and late["verdicts"]["improved"] == 0, late
    assert all("no model call from the fork (step 3) on" in c["message"] for c in late["cases"])

    # 4. The user edits the agent in place: a re-run of the failure is a counterfactual of the agent element.
    recorded_version = load_agent(ref).version().agent_version
    tripbot.write(tmp_path / "code", package, name, fixed=True)
    fixed_version = load_agent(ref).version().agent_version
    code, out = _cli(capsys, nats_url, "rerun", f"{tag}-TR-02", "--agent", ref, "--mode", "live", "--local")
    assert code == 0, out
    assert f"agent code changed: {recorded_version} -> {fixed_version}" in out, out
    assert "(counterfactual from step 2, changed agent_version): completed" in out, out
    branch_id = next(w for w in out.split() if w.startswith("br-"))

    async def branch() -> dict[str, object]:
        async with await connect(nats_url) as client:
            return fold((await load_run(client, branch_id)).records).parent or {}

    forked = asyncio.run(branch())
    assert (forked["mode"], forked["changed"], forked["changed_to"]) == ("counterfactual", "agent_version",
                                                                         fixed_version)  # fmt: skip
    check = f"{package}.agent:books_what_it_priced"
    code, out = _cli(capsys, nats_url, "rerun", "--agent", ref, "--mode", "live", "--where", failures,
                     "--expect", check, "--json")  # fmt: skip
    gate = json.loads(out)
    assert code == 0 and gate["gate"] == "open" and gate["verdicts"]["improved"] == 2, gate
    assert {c["message"] for c in gate["cases"]} == {f"books 126 for {t}" for t in sorted(tripbot.FAILING)}
    assert all(c["change"].startswith("agent code changed: ") for c in gate["cases"])
    assert len(payments.calls()) == 2  # no branch booked: a live re-run simulates new effects

    # 5. The views: recorded runs unless the branches are asked for, each branch under its parent.
    code, out = _cli(capsys, nats_url, "runs", "--agent", name)
    rows = [line for line in out.splitlines() if line.startswith(tag)]
    assert code == 0 and sorted(r.split()[0] for r in rows) == sorted(statuses), out
    assert "br-" not in out and "branches of re-runs not listed: --branches" in out
    code, out = _cli(capsys, nats_url, "runs", "--agent", name, "--branches")
    lines = out.splitlines()
    under = lines[lines.index(next(x for x in lines if x.startswith(f"{tag}-TR-02"))) + 1]
    assert under.startswith("└ br-") and f"fork of {tag}-TR-02" in under, out
    exported = tmp_path / "recorded.jsonl"
    code, out = _cli(capsys, nats_url, "export", "jsonl", "--where", f"agent = '{name}'", "--out", str(exported))
    assert code == 0 and f"exported {len(statuses)} runs" in out, out
    code, out = _cli(capsys, nats_url, "export", "jsonl", "--where", f"agent = '{name}'", "--branches", "--out",
                     str(exported))  # fmt: skip
    assert code == 0 and f"exported {len(statuses)} runs" not in out, out

    # The page's matrix, from the projection: each run's latest branch per candidate (the model forked
    # after its last call: not exercised), and the answer the CLI gives (the edited code fixes both).
    answer = f'<p id="matrix-best">fixes the most with no regression: agent={ref}, 2 of 4 runs</p>'
    with ui_server(nats_url, tmp_path) as base:
        deadline, page = time.monotonic() + 120, ""
        while answer not in page and time.monotonic() < deadline:  # the projection catches up with the stream
            time.sleep(1)
            with urllib.request.urlopen(f"{base}matrix?agent={name}", timeout=10) as resp:
                page = resp.read().decode()
    assert answer in page, page[-3000:]
    cells = set(re.findall(r'data-result="([^"]*)" data-candidate="([^"]*)"', page))
    assert ("not exercised", mapping) in cells and ("regressed", eager) in cells, cells
