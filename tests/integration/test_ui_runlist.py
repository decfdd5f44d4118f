"""The run list for people who live in it, in a real headless Chromium against `runledger ui`: forks and
child runs grouped under the run they came from (depth first, a fork of a fork under its fork), each
group hideable in the page and all of them from the filter bar; a run whose process died shown
``stalled``, never ``running``, next to a run whose process is alive; and the list fitting a 1366 px
wide screen without a horizontal scroll bar when run ids and agent names are long.

Without chromium and chromedriver these tests skip on a developer's machine and fail under CI=true.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runledger.errors import LedgerError
from runledger.log.client import LedgerClient
from runledger.protect.loading import load_run
from runledger.record.events import RunForked
from runledger.sdk.lifecycle import start_run
from tests import ui_agents
from tests.agents import family_spec
from tests.conftest import eventually
from tests.integration.processes import runledger, start_agent
from tests.integration.test_ui import browser, css, shot, ui_server, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

WIDTH = 1366
LONG_AGENT = "fulfilment-and-refunds-escalation-agent-for-the-european-marketplaces-" + "x" * 24
LONG_RUN = "run-" + "0123456789abcdef" * 7  # 116 characters, no place to break but anywhere


@contextlib.contextmanager
def alive_run(url: str, tmp_path: Path, run_id: str) -> Iterator[None]:
    """A run whose process is alive and busy (a tool waiting for a file) until the block ends."""
    release = tmp_path / "release"
    proc = start_agent(url, "tests.ui_agents:waiter_spec", run_id, "{}", {"TEST_RELEASE": str(release)})
    try:
        yield
    finally:
        release.touch()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def rows(driver: Any) -> list[Any]:
    return css(driver, "table#runs tbody tr[data-run]")


async def test_branches_group_under_their_parent_stalled_is_not_running_and_the_list_fits_1366(
    client: LedgerClient, nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_CALLS_LOG", str(tmp_path / "calls.log"))
    # A run, its fork, a fork of that fork; a run with two child runs; a long-named run of its own.
    shop = ui_agents.named_spec("shop")
    root = (await start_run(client, shop, run_id="g-root")).run_id
    fork = RunForked(forked_from=root, fork_step=0, mode="redrive")
    first = (await start_run(client, shop, run_id="g-fork", fork=fork)).run_id
    again = RunForked(forked_from=first, fork_step=0, mode="redrive")
    second = (await start_run(client, shop, run_id="g-fork-of-fork", fork=again)).run_id
    family = await start_run(client, family_spec(), {"x": 1}, run_id="g-family")
    assert family.status == "completed", family
    await start_run(client, ui_agents.named_spec(LONG_AGENT), run_id=LONG_RUN)
    # Killed right after it recorded its start: "running" on the record, its process gone.
    crashed = runledger(nats_url, "run", "--agent", "tests.ui_agents:waiter_spec", "--run-id", "g-crashed",
                        env={"RUNLEDGER_CRASH_AT": "run:started"})  # fmt: skip
    assert crashed.returncode == -9, crashed.stdout + crashed.stderr

    with alive_run(nats_url, tmp_path, "g-alive"), ui_server(nats_url, tmp_path) as base, browser() as driver:
        await eventually(lambda: _recorded(client, "g-alive", "lookup"), timeout=60)  # now in its "wait" tool
        driver.set_window_size(WIDTH, 900)
        driver.get(base)
        wait_for(driver, "table#runs")

        # Grouping: each branch right under the run it came from, depth first.
        order = [r.get_attribute("data-run") for r in rows(driver)]
        at = order.index(root)
        assert order[at : at + 3] == [root, first, second], order
        by_id = {r.get_attribute("data-run"): r for r in rows(driver)}
        assert by_id[first].get_attribute("data-group") == root and by_id[first].get_attribute("data-parent") == root
        assert by_id[second].get_attribute("data-group") == root and by_id[second].get_attribute("data-parent") == first
        kids = [r for r in order if by_id[r].get_attribute("data-group") == "g-family"]
        assert len(kids) == 2 and order.index("g-family") + 1 == order.index(kids[0])
        assert by_id[root].get_attribute("data-group") is None  # a group's first run
        heading = driver.find_element("css selector", "h1").text
        assert "Runs 9" in heading and "4 on this page listed under the run they came from" in heading, heading

        # Stalled is not running: the crashed run's holder is gone, the alive one's is not.
        assert by_id["g-crashed"].find_element("css selector", ".pill").text == "stalled"
        assert by_id["g-alive"].find_element("css selector", ".pill").text == "running"

        # 1366 px wide: no horizontal scroll, whatever the length of the ids and names.
        assert LONG_AGENT in by_id[LONG_RUN].text
        inner, scroll = driver.execute_script("return [window.innerWidth, document.documentElement.scrollWidth]")
        assert inner >= WIDTH - 20, inner  # the viewport is the screen's width
        assert scroll <= WIDTH and scroll <= inner, (scroll, inner)
        shot(driver, "runs_grouped", width=WIDTH)

        # Hide a group in the page, show it again.
        toggle = by_id[root].find_element("css selector", "button.toggle")
        assert toggle.text == "▾ 2"
        toggle.click()
        assert not by_id[first].is_displayed() and not by_id[second].is_displayed()
        assert by_id["g-family"].is_displayed() and all(by_id[k].is_displayed() for k in kids)
        toggle.click()
        assert by_id[first].is_displayed() and by_id[second].is_displayed()

        # Hide every group from the filter bar: the branches are counted, not listed.
        driver.find_element("id", "branches-toggle").click()
        wait_for(driver, "table#runs")
        assert "branches=hide" in driver.current_url
        hidden = [r.get_attribute("data-run") for r in rows(driver)]
        assert root in hidden and first not in hidden and second not in hidden and not set(kids) & set(hidden)
        assert "Runs 5" in driver.find_element("css selector", "h1").text  # the branches are not counted
        assert "▸ 1" in driver.find_element("css selector", f"tr[data-run='{root}'] .toggle").text  # its fork
        assert "▸ 2" in driver.find_element("css selector", "tr[data-run='g-family'] .toggle").text  # two children


async def _recorded(client: LedgerClient, run_id: str, tool: str) -> bool:
    try:
        log = await load_run(client, run_id)
    except LedgerError:
        return False  # not recorded yet
    return any(r.event.payload.get("name") == tool for r in log.records)
