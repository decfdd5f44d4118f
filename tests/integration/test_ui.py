"""`runledger ui` in a real headless Chromium (Debian's chromium and chromedriver, through Selenium).

The example refund agent records the demo's runs into the test's nats-server (one waits for an
approval; a counterfactual branch of another is forked at its decision); `runledger ui` serves them
from a subprocess, as a user starts it. The tests go through the run list, a run's timeline, a step
with its inputs and outputs, approving the pending approval in the page (the page resumes the run,
the log holds the decision with the approver's name), the fork diff, and a secure server where an
analyst reads (the inbox too) but cannot approve or resolve. ``test_ui_actions.py`` covers the re-run plan and
resolving an in-doubt effect. Each page is saved into docs/ui/ (the README shows them).

Without chromium and chromedriver these tests skip on a developer's machine and fail under CI=true.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from runledger.examples.refund_agent.agent import TICKETS, spec, strict_model
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import LedgerClient, connect
from runledger.log.server import EmbeddedServer, ServerState
from runledger.protect.loading import load_run
from runledger.protect.roles import secure
from runledger.record.events import RunForked
from runledger.sdk.lifecycle import start_run
from tests.conftest import eventually, unavailable
from tests.integration.processes import runledger

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "docs" / "ui"
AGENT_REF = "runledger.examples.refund_agent.agent:spec"
WAIT_S = 30


# -- the browser ------------------------------------------------------------------------------------------


def chrome() -> Any:
    """A headless Chromium driven through Debian's chromedriver; never a downloaded one."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if binary is None or driver is None:
        unavailable("chromium and chromedriver are needed: apt-get install -y chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1440,1000", "--hide-scrollbars", "--no-first-run", "--disable-extensions"):  # fmt: skip
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))


@contextlib.contextmanager
def browser() -> Iterator[Any]:
    driver = chrome()
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver: Any, css: str) -> Any:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S).until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, css)))


def wait_text(driver: Any, css: str, text: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, WAIT_S).until(expected_conditions.text_to_be_present_in_element((By.CSS_SELECTOR, css), text))


def shot(driver: Any, name: str, height: int | None = None, width: int = 1440) -> None:
    """Save the page as docs/ui/<name>.png, ``width`` wide and as tall as its content (up to 2400 px)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    for _ in range(2):  # a resized window can lay the page out taller: measure again
        full = height or int(driver.execute_script("return document.documentElement.scrollHeight"))
        driver.set_window_size(width, max(700, min(full + 140, 2400)))
    driver.save_screenshot(str(SHOTS / f"{name}.png"))


def css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


# -- the page, as a user starts it -----------------------------------------------------------------------------


@contextlib.contextmanager
def ui_server(url: str, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """``runledger ui --port 0 ...`` in a subprocess; yields the URL it prints."""
    log = open(tmp_path / "ui.log", "w")  # noqa: SIM115  (closed below, after the process)
    proc = subprocess.Popen(
        [sys.executable, "-m", "runledger", "ui", "--port", "0", "--nats", url, "--db", str(tmp_path / "ui.duckdb"),
         *args],
        cwd=ROOT, env={**os.environ, "RUNLEDGER_HOME": str(tmp_path / "ui-home"), **(env or {})},
        stdout=subprocess.PIPE, stderr=log, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    stdout = proc.stdout
    threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()
    try:
        try:
            first = lines.get(timeout=60)
        except queue.Empty:
            first = ""
        assert first.startswith("runledger ui: http://127.0.0.1:"), (first, (tmp_path / "ui.log").read_text())
        yield first.split()[2]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def http(url: str, data: bytes | None = None, headers: dict[str, str] | None = None) -> int:
    method = "POST" if data is not None else "GET"
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


# -- the demo's runs ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Demo:
    runs: dict[str, str]  # ticket -> run id; "branch" -> the counterfactual branch of T-1001
    pending: str  # the approval request T-1004 waits for
    env: dict[str, str]  # what the refund agent needs to be resumed by the page


@pytest.fixture
async def payments(tmp_path: Path) -> AsyncIterator[PaymentsService]:
    service = PaymentsService(tmp_path / "payments.log").start()
    try:
        yield service
    finally:
        service.stop()


async def record_demo(client: LedgerClient, tmp_path: Path, payments: PaymentsService) -> Demo:
    """The demo's tickets (T-1004's refund waits for an approval) and a counterfactual branch of
    T-1001 forked at its decision, with the stricter model (it asks for a photo, refunds nothing)."""
    env = {"REFUND_PAYMENTS_URL": payments.url, "REFUND_OUTBOX": str(tmp_path / "outbox")}
    runs: dict[str, str] = {}
    pending = ""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        agent = spec()
        for ticket in TICKETS:
            result = await start_run(client, agent, ticket, labels={"ticket": ticket["ticket"]})
            runs[ticket["ticket"]] = result.run_id
            if result.status == "suspended":
                pending = result.pending[0]
        strict = dataclasses.replace(agent, model=strict_model())
        fork = RunForked(forked_from=runs["T-1001"], fork_step=2, mode="counterfactual", changed="model",
                         changed_from=agent.model.name, changed_to=strict.model.name)  # fmt: skip
        runs["branch"] = (await start_run(client, strict, TICKETS[0], fork=fork)).run_id
    assert pending, "T-1004 asks for an approval"
    return Demo(runs, pending, env)


# -- the tests ---------------------------------------------------------------------------------------------------


async def test_runs_timeline_step_approval_and_diff_in_a_browser(
    client: LedgerClient, nats_url: str, tmp_path: Path, payments: PaymentsService
) -> None:
    demo = await record_demo(client, tmp_path, payments)
    waiting = demo.runs["T-1004"]
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"scripted-support-1": {"input": 3.0, "output": 15.0},
                                  "scripted-strict-1": [3.0, 15.0]}))  # fmt: skip
    args = ("--agent", AGENT_REF, "--prices", str(prices))
    with ui_server(nats_url, tmp_path, *args, env=demo.env) as base, browser() as driver:
        # The run list: every run of the demo, from the projection, with what needs an operator.
        driver.get(base)
        wait_for(driver, "table#runs")
        listed = {row.get_attribute("data-run"): row for row in css(driver, "table#runs tbody tr[data-run]")}
        assert set(demo.runs.values()) <= set(listed)
        assert "suspended" in listed[waiting].text and "1" in listed[waiting].text
        assert "failed" in listed[demo.runs["T-1003"]].text
        assert all("$0.00" in row.text for row in listed.values())  # priced: a few hundred tokens, under a cent
        assert f"fork of {demo.runs['T-1001']}" in listed[demo.runs["branch"]].text
        shot(driver, "runs")

        driver.get(f"{base}?status=failed")
        wait_for(driver, "table#runs")
        failed = [r.get_attribute("data-run") for r in css(driver, "table#runs tbody tr[data-run]")]
        assert failed == [demo.runs["T-1003"]]
        driver.get(f"{base}?q=blender")  # content: T-1001's ticket text and lookup; the branch's too
        wait_for(driver, "table#runs")
        found = {r.get_attribute("data-run") for r in css(driver, "table#runs tbody tr[data-run]")}
        assert found == {demo.runs["T-1001"], demo.runs["branch"]}

        # A run's timeline: one bar a step, coloured by kind, linked to the step.
        driver.get(f"{base}runs/{demo.runs['T-1001']}")
        wait_for(driver, "#timeline")
        log = await load_run(client, demo.runs["T-1001"])
        steps = {r.event.payload["step"] for r in log.records if isinstance(r.event.payload.get("step"), int)}
        bars = css(driver, "#timeline .row")
        assert [int(b.get_attribute("data-step")) for b in bars] == sorted(steps)
        assert css(driver, "#timeline .bar.kind-model") and css(driver, "#timeline .bar.kind-effect")
        assert "completed" in driver.find_element("id", "run-status").text
        shot(driver, "run")

        # A step: inputs and outputs in full, the model's messages as a conversation.
        driver.get(f"{base}runs/{demo.runs['T-1001']}/steps/0")
        wait_for(driver, "#conversation")
        talk = driver.find_element("id", "conversation").text
        assert "TASK classify" in talk and "blender arrived broken" in talk and '"intent": "refund"' in talk
        assert "input_tokens" in " ".join(e.text for e in css(driver, "pre.outputs"))
        shot(driver, "step")

        # The fork diff: the decision at the fork first, then the steps aligned from the fork.
        driver.get(f"{base}runs/{demo.runs['branch']}")
        wait_for(driver, "#diff-link").click()
        wait_for(driver, "#fork-decision")
        decision = driver.find_element("id", "fork-decision").text
        assert "photo" in decision and "We have refunded" in decision
        ops = [r.get_attribute("class") for r in css(driver, "#diff tbody tr[class^=op-]")]
        assert "op-changed" in ops and "op-removed" in ops  # the decision; the refund the branch never made
        shot(driver, "diff")

        # An approval decided in the page: refused without the session's CSRF token and from
        # another host name, then approved; the page resumes the run, live updates show it end.
        assert http(f"{base}runs/{waiting}/approvals/{demo.pending}", b"decision=approve&by=mallory") == 403
        assert http(base, headers={"Host": f"attacker.example:{base.rsplit(':', 1)[1].strip('/')}"}) == 400
        driver.get(f"{base}runs/{waiting}")
        form = wait_for(driver, f"div.approval[data-request='{demo.pending}'] form.decide")
        form.find_element("css selector", "input.by").send_keys("ana-ui")
        form.find_element("css selector", "input.reason").send_keys("photos checked")
        shot(driver, "approval")
        form.find_element("css selector", "button.approve").click()
        wait_text(driver, ".decided-by", "ana-ui")
        events = [r.event for r in (await load_run(client, waiting)).records]
        resolved = [e.payload for e in events if e.type == "approval.resolved"]
        assert len(resolved) == 1 and resolved[0]["by"] == "ana-ui" and resolved[0]["approved"] is True
        assert resolved[0]["reason"] == "photos checked" and resolved[0]["request_id"] == demo.pending

        # The page resumed the run (as `runledger resume` does); live updates show it end.
        wait_text(driver, "#run-status", "completed")
        shot(driver, "approved")
        last = (await load_run(client, waiting)).records[-1].event
        assert last.type == "run.completed"
        assert [c["order"] for c in payments.calls()].count("order-7777") == 1


@pytest.fixture
def secure_server(tmp_path: Path) -> Iterator[ServerState]:
    server = EmbeddedServer(home=tmp_path / "secure-home")
    state = server.start(data_dir=tmp_path / "secure-data", auth=secure(["refund-agent"]))
    try:
        yield state
    finally:
        server.stop()


async def test_an_analyst_signs_in_reads_and_cannot_approve(
    secure_server: ServerState, tmp_path: Path, payments: PaymentsService
) -> None:
    creds = Path(secure_server.creds_dir)
    admin = await connect(secure_server.url, user_credentials=str(creds / "admin.json"))
    try:
        demo = await record_demo(admin, tmp_path, payments)
        waiting = demo.runs["T-1004"]
        with ui_server(secure_server.url, tmp_path, "--creds", str(creds / "admin.json")) as base, browser() as driver:
            driver.get(base)
            wait_for(driver, "textarea#credentials")  # nobody reads anything before signing in
            assert "/signin" in driver.current_url
            driver.execute_script(
                "document.getElementById('credentials').value = arguments[0]", (creds / "analyst.json").read_text()
            )
            driver.find_element("id", "signin").click()
            wait_for(driver, "table#runs")
            assert "analyst" in driver.find_element("id", "viewer").text
            assert waiting in {r.get_attribute("data-run") for r in css(driver, "table#runs tbody tr[data-run]")}

            driver.get(f"{base}runs/{waiting}")
            wait_for(driver, "#approvals")
            assert not css(driver, "form.decide")
            assert "may read but not decide" in driver.find_element("id", "approvals").text
            assert not css(driver, "#rerun")
            shot(driver, "analyst")
            # The inbox lists what waits, without a form to decide it.
            driver.get(f"{base}inbox")
            wait_for(driver, f"section.inbox-run[data-run='{waiting}']")
            assert not css(driver, "#inbox form") and "may read but not decide" in driver.page_source
            # Even with the session's own token, the action is refused: the role may not act.
            token = driver.find_element("css selector", "input[name=csrf]").get_attribute("value")
            status = driver.execute_script(
                "return fetch(arguments[0], {method: 'POST', headers: {'Content-Type': "
                "'application/x-www-form-urlencoded'}, body: arguments[1]}).then(r => r.status)",
                f"/runs/{waiting}/approvals/{demo.pending}", f"csrf={token}&decision=approve&by=analyst",
            )  # fmt: skip
            assert status == 403
            status = driver.execute_script(
                "return fetch('/effects/resolve', {method: 'POST', headers: {'Content-Type': "
                "'application/x-www-form-urlencoded'}, body: arguments[0]}).then(r => r.status)",
                f"csrf={token}&key=refund:order-7777&outcome=not_committed&by=analyst&run_id={waiting}",
            )  # fmt: skip
            assert status == 403  # nor resolve an effect

            # Content: sealed for the analyst's login until an operator grants analysts content on the
            # running server; then the same page opens it, and seals it again once revoked.
            step = f"{base}runs/{demo.runs['T-1001']}/steps/0"
            home = {"RUNLEDGER_HOME": str(creds.parent)}

            def conversation() -> str:
                driver.get(step)
                wait_for(driver, "#step-status")
                return " ".join(e.text for e in css(driver, "section.event"))

            before = conversation()
            assert "«sealed: your credentials cannot open it" in before and "blender arrived broken" not in before
            granted = runledger(secure_server.url, "up", "--secure", "--grant-content", "analyst", env=home)
            assert granted.returncode == 0 and "granted to: analyst" in granted.stdout, granted.stderr
            opened = await eventually(lambda: "blender arrived broken" in conversation(), timeout=60)
            assert opened and "«sealed" not in conversation()
            revoked = runledger(secure_server.url, "up", "--secure", "--revoke-content", "analyst", env=home)
            assert revoked.returncode == 0, revoked.stderr
            assert await eventually(lambda: "blender arrived broken" not in conversation(), timeout=60)
        events = [r.event.type for r in (await load_run(admin, waiting)).records]
        assert "approval.resolved" not in events and events[-1] == "run.suspended"
        assert json.loads((creds / "analyst.json").read_text())["role"] == "analyst"
    finally:
        await admin.close()
