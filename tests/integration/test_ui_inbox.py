"""The approvals inbox of `runledger ui` in a real headless Chromium: every pending approval and every
effect in doubt across runs on one page, decided there (approve, deny, resolve) through the run page's
routes, so each decision is the CLI's (`runledger approve`, `runledger effects resolve`) and the log
holds it with the operator's name: checked in the log, not in the page. A post without the session's
CSRF token is refused and records nothing.

Without chromium and chromedriver these tests skip on a developer's machine and fail under CI=true.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runledger.examples.refund_agent.agent import TICKETS, spec
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import LedgerClient
from runledger.log.reader import decode_records, read_raw
from runledger.log.subjects import effect_filter
from runledger.protect.loading import load_run
from runledger.sdk.effects import read_key
from runledger.sdk.lifecycle import start_run
from tests.agents import calls
from tests.integration import test_ui
from tests.integration.test_ui import AGENT_REF, browser, css, http, shot, ui_server, wait_for, wait_text
from tests.integration.test_ui_actions import DOUBT_AGENT, KEY, in_doubt_run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
payments = test_ui.payments  # the payments service fixture


async def refund_run(client: LedgerClient, env: dict[str, str], run_id: str, ticket: dict[str, Any]) -> Any:
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        return await start_run(client, spec(), ticket, run_id=run_id)


async def asking(client: LedgerClient, env: dict[str, str], run_id: str, ticket: str) -> str:
    """A refund run that waits for an approval (T-1004's laptop); its request id."""
    result = await refund_run(client, env, run_id, {**TICKETS[3], "ticket": ticket})
    assert result.status == "suspended" and len(result.pending) == 1, result
    return str(result.pending[0])


def item(driver: Any, run_id: str, kind: str) -> Any:
    return wait_for(driver, f"section.inbox-run[data-run='{run_id}'] .inbox-item[data-kind='{kind}']")


def decide(driver: Any, run_id: str, button: str, by: str, reason: str) -> None:
    form = item(driver, run_id, "approval").find_element("css selector", "form.decide")
    form.find_element("css selector", "input.by").send_keys(by)
    form.find_element("css selector", "input.reason").send_keys(reason)
    form.find_element("css selector", f"button.{button}").click()


async def decisions(client: LedgerClient, run_id: str) -> list[dict[str, Any]]:
    return [r.event.payload for r in (await load_run(client, run_id)).records if r.event.type == "approval.resolved"]


async def test_the_inbox_lists_what_waits_across_runs_and_decides_it_as_the_cli_does(
    client: LedgerClient, nats_url: str, tmp_path: Path, payments: PaymentsService
) -> None:
    env = {"REFUND_PAYMENTS_URL": payments.url, "REFUND_OUTBOX": str(tmp_path / "outbox"),
           "TEST_CALLS_LOG": str(tmp_path / "calls.log")}  # fmt: skip
    approve_me = await asking(client, env, "ask-approve", "T-3001")
    deny_me = await asking(client, env, "ask-deny", "T-3002")
    in_doubt_run(nats_url, env, "ask-doubt")
    done = await refund_run(client, env, "ask-nothing", {**TICKETS[1], "ticket": "T-3003"})
    assert done.status == "completed"  # nothing to decide: not in the inbox

    args = ("--agent", AGENT_REF, "--agent", DOUBT_AGENT)
    with ui_server(nats_url, tmp_path, *args, env=env) as base, browser() as driver:
        driver.get(f"{base}inbox")
        wait_for(driver, "#inbox")
        listed = {s.get_attribute("data-run") for s in css(driver, "section.inbox-run")}
        assert listed == {"ask-approve", "ask-deny", "ask-doubt"}, listed
        assert "2 approvals pending · 1 effect in doubt · 3 runs" in driver.find_element("id", "inbox-counts").text
        assert approve_me in item(driver, "ask-approve", "approval").text
        assert KEY in item(driver, "ask-doubt", "effect").text
        shot(driver, "inbox")

        # Refused without the session's CSRF token: nothing recorded.
        assert http(f"{base}runs/ask-approve/approvals/{approve_me}", b"decision=approve&by=mallory&back=/inbox") == 403
        assert await decisions(client, "ask-approve") == []

        # Approve one, deny the other: back in the inbox each time, the decided item gone.
        decide(driver, "ask-approve", "approve", "ana-inbox", "photos checked")
        wait_text(driver, ".flash", f"approved {approve_me} as ana-inbox")
        assert driver.current_url.endswith("/inbox")
        decide(driver, "ask-deny", "deny", "bo-inbox", "duplicate ticket")
        wait_text(driver, ".flash", f"denied {deny_me} as bo-inbox")
        assert not css(driver, ".inbox-item[data-kind='approval']")
        [approved] = await decisions(client, "ask-approve")
        assert (approved["request_id"], approved["approved"], approved["by"], approved["reason"]) == (
            approve_me, True, "ana-inbox", "photos checked")  # fmt: skip
        [denied] = await decisions(client, "ask-deny")
        assert (denied["request_id"], denied["approved"], denied["by"], denied["reason"]) == (
            deny_me, False, "bo-inbox", "duplicate ticket")  # fmt: skip

        # Resolve the effect in doubt: it happened, with its result.
        form = item(driver, "ask-doubt", "effect").find_element("css selector", "form.resolve")
        form.find_element("css selector", "input.committed").click()
        form.find_element("css selector", "input.result").send_keys('{"done": {"amount": 5}}')
        form.find_element("css selector", "input.by").send_keys("cy-inbox")
        form.find_element("css selector", "input.reason").send_keys("the bank statement shows it")
        form.find_element("css selector", "button[type=submit]").click()
        wait_text(driver, ".flash", f"effect {KEY} resolved as committed")
        assert driver.current_url.endswith("/inbox")
        wait_for(driver, "#inbox-empty")
        state = await read_key(client, KEY)
        assert state.status == "committed" and state.result == {"done": {"amount": 5}}
        good, _ = decode_records(await read_raw(client, effect_filter(state.agent, KEY)))
        [resolved] = [r.event.payload for r in good if r.event.type == "effect.resolved"]
        assert (resolved["by"], resolved["outcome"], resolved["reason"]) == (
            "cy-inbox", "committed", "the bank statement shows it")  # fmt: skip

        # The page resumed each run after its decision, as after a decision on the run page.
        for run_id, status in (("ask-approve", "completed"), ("ask-deny", "failed"), ("ask-doubt", "completed")):
            driver.get(f"{base}runs/{run_id}")
            wait_text(driver, "#run-status", status)
        assert len(calls(tmp_path / "calls.log")) == 1  # the charge acted once, before the crash
