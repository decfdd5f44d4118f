"""A failed run's page in a real headless Chromium against `runledger ui`: the timeline shows under each
bar what the step was given and what it gave back, marks the step the run failed at, and the run's
traceback, which carries markup from the failing tool's error, is shown as text: escaped and
preformatted, never run or parsed as HTML (no script runs, no element is injected), on the run page
and on the step's page.

Without chromium and chromedriver these tests skip on a developer's machine and fail under CI=true.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runledger.log.client import LedgerClient
from runledger.sdk.lifecycle import start_run
from tests.integration.test_ui import browser, css, shot, ui_server, wait_for
from tests.ui_agents import HOSTILE, breaker_spec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

INJECTED = "return [window.__pwned === undefined, document.querySelectorAll('main script, main img').length]"


async def test_inline_io_the_failing_step_and_a_traceback_with_markup_shown_as_text(
    client: LedgerClient, nats_url: str, tmp_path: Path
) -> None:
    result = await start_run(client, breaker_spec(), run_id="breaks")
    assert result.status == "failed", result
    with ui_server(nats_url, tmp_path) as base, browser() as driver:
        driver.get(f"{base}runs/breaks")
        wait_for(driver, "#timeline")

        # Inline inputs and outputs: what each step was given and gave back, under its bar.
        lines = {int(e.get_attribute("data-step")): e.text for e in css(driver, "#timeline .io-line")}
        assert '"order": "order-2"' in lines[0] and '"amount": 40' in lines[0], lines
        assert "amount 40" in lines[1] and "ValueError: cannot parse" in lines[1], lines

        # The failing step is marked, and the banner links to it.
        failing = driver.find_element("id", "failing-step")
        assert failing.get_attribute("data-step") == "1" and "failed here" in failing.text
        assert [r.get_attribute("data-step") for r in css(driver, "#timeline .row.failing")] == ["1"]
        assert "failed at step 1" in driver.find_element("id", "failing-link").text

        # The traceback is text: the markup is shown, not run, and injects nothing.
        tb = driver.find_element("id", "traceback")
        assert tb.tag_name == "pre" and "Traceback (most recent call last)" in tb.text
        assert HOSTILE in tb.text, tb.text
        assert driver.execute_script(INJECTED) == [True, 0]
        shot(driver, "failed")

        # The step's page: its error's traceback, as text too.
        driver.get(f"{base}runs/breaks/steps/1")
        wait_for(driver, "pre.traceback")
        assert HOSTILE in driver.find_element("css selector", "pre.traceback").text
        assert driver.execute_script(INJECTED) == [True, 0]
