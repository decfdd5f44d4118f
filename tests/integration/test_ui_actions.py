"""Operator actions of `runledger ui` in a real headless Chromium: a re-run's plan and an in-doubt effect.

The plan the page shows before a re-run is queued (each recorded step served from the record, run
live, stubbed or refused) must be the plan `runledger rerun --plan --json` prints for the same run,
mode and fork step: both are compared row by row, for plans that together use all four actions.
Resolving an in-doubt effect in the page must be recorded as `runledger effects resolve` records it
(`effect.resolved` on the key's subject, by the operator, with the name given), be refused without
the session's CSRF token, and let the page resume the run, which then completes without acting again.

The page is started as a user starts it (`runledger ui` in a subprocess, see `test_ui.ui_server`);
each page is saved into docs/ui/. Without chromium these tests skip locally and fail under CI=true.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runledger.log.client import LedgerClient
from runledger.log.reader import decode_records, read_raw
from runledger.log.subjects import CMD_STREAM, effect_filter
from runledger.protect.loading import load_run
from runledger.sandbox.rerun import RerunRequest
from runledger.sandbox.worker import RERUN_SUBJECT
from runledger.sdk.effects import read_key
from tests.agents import calls
from tests.integration import test_ui
from tests.integration.processes import runledger
from tests.integration.test_ui import (
    AGENT_REF,
    browser,
    css,
    http,
    record_demo,
    shot,
    ui_server,
    wait_for,
    wait_text,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
payments = test_ui.payments  # the payments service fixture

DOUBT_AGENT = "tests.agents:unreconciled_spec"
KEY = "charge:inv-1"


def in_doubt_run(url: str, env: dict[str, str], run_id: str = "doubt") -> None:
    """A run whose charge acted and whose process was SIGKILLed before recording it; resumed, it
    stops with the effect in doubt (the agent has no reconcile)."""
    crashed = runledger(url, "run", "--agent", DOUBT_AGENT, "--run-id", run_id,
                        env={**env, "RUNLEDGER_CRASH_AT": f"effect:{KEY}:acted"})  # fmt: skip
    assert crashed.returncode == -9, crashed.stdout + crashed.stderr
    stopped = runledger(url, "resume", run_id, "--agent", DOUBT_AGENT, env=env)
    assert "suspended (effect_in_doubt)" in stopped.stdout, stopped.stdout + stopped.stderr


def cli_plan(url: str, run_id: str, agent: str, *flags: str) -> dict[str, Any]:
    done = runledger(url, "rerun", run_id, "--agent", agent, *flags, "--plan", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    plan: dict[str, Any] = json.loads(done.stdout)
    return plan


def page_plan(driver: Any, base: str, run_id: str, fields: dict[str, str]) -> list[dict[str, Any]]:
    """Fill the run page's re-run form, ask for the plan, read its table."""
    driver.get(f"{base}runs/{run_id}")
    form = wait_for(driver, "#rerun form")
    for name, value in fields.items():
        field = form.find_element("css selector", f"[name={name}]")
        if field.tag_name == "select":
            from selenium.webdriver.support.ui import Select

            Select(field).select_by_visible_text(value)
        else:
            field.clear()
            field.send_keys(value)
    form.find_element("css selector", "button[type=submit]").click()
    wait_for(driver, "#plan-steps")
    rows = []
    for row in css(driver, "#plan-steps tbody tr[data-step]"):
        cells = row.find_elements("css selector", "td")
        rows.append({"step": int(row.get_attribute("data-step")), "action": row.get_attribute("data-action"),
                     "kind": cells[1].text, "name": cells[2].text, "recorded": cells[3].text,
                     "why": cells[5].text})  # fmt: skip
    return rows


def same_plan(page: list[dict[str, Any]], cli: dict[str, Any]) -> None:
    expected = [{k: s[k] for k in ("step", "action", "kind", "name", "recorded", "why")} for s in cli["steps"]]
    assert page == expected


async def test_the_page_shows_the_plan_the_cli_prints_then_queues_it(
    client: LedgerClient, nats_url: str, tmp_path: Path, payments: Any
) -> None:
    demo = await record_demo(client, tmp_path, payments)
    env = {"TEST_CALLS_LOG": str(tmp_path / "calls.log")}
    in_doubt_run(nats_url, env)
    t1001, t1004 = demo.runs["T-1001"], demo.runs["T-1004"]
    with ui_server(nats_url, tmp_path, "--agent", AGENT_REF, env={**demo.env, **env}) as base, browser() as driver:
        # A live re-run of T-1001 from its lookup, with only another tool allowed live: the lookup is
        # refused, the model runs live, the refund and the email come from the record (their keys
        # were committed by the parent), and nothing before the fork runs.
        fields = {"mode": "live", "at_step": "1", "agent": AGENT_REF, "live_tools": "no_such_tool"}
        page = page_plan(driver, base, t1001, fields)
        cli = cli_plan(nats_url, t1001, AGENT_REF, "--mode", "live", "--at-step", "1", "--live-tool", "no_such_tool")
        same_plan(page, cli)
        assert [s["action"] for s in page] == ["record", "refused", "live", "record", "record"]
        assert "--live-tool no_such_tool --plan" in driver.find_element("id", "plan-counts").text

        # A re-drive of T-1004 from its decision: the model live, the pending approval asked again.
        page = page_plan(driver, base, t1004, {"mode": "redrive", "at_step": "2", "agent": AGENT_REF})
        same_plan(page, cli_plan(nats_url, t1004, AGENT_REF, "--mode", "redrive", "--at-step", "2"))
        assert [s["action"] for s in page[2:]] == ["live", "live"]

        # The in-doubt run, live from step 0: the read tool runs, the charge (no outcome) is stubbed;
        # re-driven, the record cannot answer the charge: refused.
        page = page_plan(driver, base, "doubt", {"mode": "live", "at_step": "0", "agent": DOUBT_AGENT})
        same_plan(page, cli_plan(nats_url, "doubt", DOUBT_AGENT, "--mode", "live", "--at-step", "0"))
        assert [s["action"] for s in page] == ["live", "stub"]
        page = page_plan(driver, base, "doubt", {"mode": "redrive", "at_step": "1", "agent": DOUBT_AGENT})
        same_plan(page, cli_plan(nats_url, "doubt", DOUBT_AGENT, "--mode", "redrive", "--at-step", "1"))
        assert [s["action"] for s in page] == ["record", "refused"]

        # A live re-run of T-1001 from its decision, shown, then queued: the request queued is the one shown.
        page = page_plan(driver, base, t1001, {"mode": "live", "at_step": "2", "agent": AGENT_REF})
        assert [s["action"] for s in page] == ["record", "record", "live", "record", "record"]
        shot(driver, "rerun_plan")
        branch = driver.find_element("css selector", "#plan code").text
        wait_for(driver, "#queue").click()
        wait_text(driver, ".flash", branch)
        assert f"queued re-run {branch.removeprefix('br-')}" in driver.find_element("css selector", ".flash").text
        msg = await client.js.get_last_msg(CMD_STREAM, RERUN_SUBJECT)
        request = RerunRequest.model_validate_json(msg.data)
        assert request.branch_run_id == branch and request.parent_run_id == t1001
        assert (request.mode, request.fork_step, request.agent) == ("live", 2, AGENT_REF)


async def test_an_in_doubt_effect_resolved_in_the_page_is_recorded_as_the_cli_records_it(
    client: LedgerClient, nats_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "calls.log"
    env = {"TEST_CALLS_LOG": str(log)}
    in_doubt_run(nats_url, env)
    assert len(calls(log)) == 1
    with ui_server(nats_url, tmp_path, "--agent", DOUBT_AGENT, env=env) as base, browser() as driver:
        driver.get(f"{base}runs/doubt")
        row = wait_for(driver, "#effects tr.st-in_doubt")
        assert KEY in row.text and "in doubt" in row.text
        # Refused without the session's CSRF token: nothing is recorded.
        assert http(f"{base}effects/resolve", f"key={KEY}&outcome=committed&by=mallory".encode()) == 403
        assert (await read_key(client, KEY)).status == "claimed"

        form = row.find_element("css selector", "form")
        form.find_element("css selector", "input[value=committed]").click()
        form.find_element("css selector", "input[name=result]").send_keys('{"done": {"amount": 5}}')
        form.find_element("css selector", "input[name=by]").send_keys("ana-ui")
        form.find_element("css selector", "input[name=reason]").send_keys("the bank statement shows it")
        shot(driver, "resolve")
        form.find_element("css selector", "button[type=submit]").click()
        wait_text(driver, ".flash", f"effect {KEY} resolved as committed")

        # Recorded as `runledger effects resolve` records it: effect.resolved on the key's subject.
        state = await read_key(client, KEY)
        assert state.status == "committed" and state.result == {"done": {"amount": 5}}
        good, _ = decode_records(await read_raw(client, effect_filter(state.agent, KEY)))
        resolved = [r.event for r in good if r.event.type == "effect.resolved"]
        assert len(resolved) == 1
        assert resolved[0].payload["by"] == "ana-ui" and resolved[0].payload["outcome"] == "committed"
        assert resolved[0].payload["reason"] == "the bank statement shows it"
        assert resolved[0].payload["forced"] is False

        # The page resumed the run: it completes with the resolved result, and nothing acted again.
        wait_text(driver, "#run-status", "completed")
        records = (await load_run(client, "doubt")).records
        assert records[-1].event.type == "run.completed"
        assert records[-1].event.payload["output"]["charged"] == {"done": {"amount": 5}}
        assert len(calls(log)) == 1
        # Resolving it again is refused: it is no longer in doubt, and the page says so.
        assert not css(driver, "#effects tr.st-in_doubt form")
