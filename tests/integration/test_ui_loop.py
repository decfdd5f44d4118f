"""The page joins the fix loop (a real headless Chromium against `runledger ui`): a step's "fork here"
opens the re-run form at that step as a counterfactual, and its plan; a run whose process died (stalled)
offers Resume, which continues it under the agent the page was given until it completes, where a
finished run offers nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runledger.examples.refund_agent.agent import TICKETS
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import LedgerClient
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from tests.integration import test_ui
from tests.integration.processes import runledger
from tests.integration.test_ui import AGENT_REF, browser, css, ui_server, wait_for, wait_text

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
payments = test_ui.payments  # the payments service fixture


async def test_fork_here_opens_the_counterfactual_plan_and_a_stalled_run_resumes_from_the_page(
    client: LedgerClient, nats_url: str, tmp_path: Path, payments: PaymentsService
) -> None:
    env = {"REFUND_PAYMENTS_URL": payments.url, "REFUND_OUTBOX": str(tmp_path / "outbox")}
    ticket = json.dumps(TICKETS[0])
    done = runledger(nats_url, "run", "--agent", AGENT_REF, "--run-id", "loop-done", "--input", ticket, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    # Killed right after it recorded its start: left "running" by a process that is gone.
    crashed = runledger(nats_url, "run", "--agent", AGENT_REF, "--run-id", "loop-crashed", "--input",
                        json.dumps({**TICKETS[1], "ticket": "T-2002"}),
                        env={**env, "RUNLEDGER_CRASH_AT": "run:started"})  # fmt: skip
    assert crashed.returncode == -9, crashed.stdout + crashed.stderr

    with ui_server(nats_url, tmp_path, "--agent", AGENT_REF, env=env) as base, browser() as driver:
        # Fork here: from step 2's page to the re-run form at step 2, a counterfactual, then its plan.
        driver.get(f"{base}runs/loop-done/steps/2")
        wait_for(driver, "#fork-here").click()
        form = wait_for(driver, "#rerun form")
        assert form.find_element("css selector", "input[name=at_step]").get_attribute("value") == "2"
        mode = form.find_element("css selector", "select[name=mode]")
        assert mode.find_element("css selector", "option:checked").text == "counterfactual"
        from selenium.webdriver.support.ui import Select

        Select(form.find_element("css selector", "select[name=set_what]")).select_by_visible_text("model")
        form.find_element("css selector", "input[name=set_value]").send_keys(
            "runledger.examples.refund_agent.agent:strict_model"
        )
        form.find_element("css selector", "button[type=submit]").click()
        wait_for(driver, "#plan-steps")
        actions = {int(r.get_attribute("data-step")): r.get_attribute("data-action")
                   for r in css(driver, "#plan-steps tbody tr[data-step]")}  # fmt: skip
        assert actions[0] == actions[1] == "record" and actions[2] == "live", actions

        # A finished run offers no Resume; the crashed one, stalled, does, and the page resumes it.
        driver.get(f"{base}runs/loop-done")
        wait_for(driver, "#run-status")
        assert css(driver, "form#resume") == []
        driver.get(f"{base}runs/loop-crashed")
        wait_text(driver, "#run-status", "stalled")
        resume = wait_for(driver, "form#resume")
        assert "the process that ran it is gone" in resume.text
        resume.find_element("css selector", "button[type=submit]").click()
        wait_text(driver, "#run-status", "completed")
    cp = fold((await load_run(client, "loop-crashed")).records)
    assert cp.status == "completed" and cp.attempts == 2
