"""Verdicts that survive a non-deterministic model (``--samples``, runledger.sandbox.samples), on the
``tripbot`` package of tests/tripbot_package.py; real nats-server, real sandboxes.

One recorded failure (a trip in CHF, which the recorded model does not map). The candidate,
``sometimes_model``, maps CHF on 3 of every 5 pricing calls: ``--samples 5`` reports ``fixed 3/5`` for
the run, the unchanged baseline (the recorded model, re-driven 5 times) never completes, so the run is
not flaky; the gate closes at ``--min-fix-rate 0.8`` (and by default, every sample) and opens at 0.6.

The response cache (``--cache-responses``, runledger.sandbox.responses): two failures whose decision is
the same request; a model that counts its calls is called once for both, and a second identical sweep
with the same cache calls it not at all.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from runledger.cli import main
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import LedgerClient, connect
from runledger.sandbox.containers import SandboxPool
from runledger.sandbox.rerun import RerunRequest
from runledger.sandbox.responses import ResponseCache
from runledger.sandbox.sweep import sweep
from runledger.sdk.agent import ALLOW_CODE_ENV, load_agent
from runledger.sdk.lifecycle import start_run
from tests import tripbot_package as tripbot

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.timeout(600)]


def test_samples_report_a_fix_rate_and_the_gate_takes_a_threshold(
    nats_url: str, sandbox_image: str, payments: PaymentsService, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    with tripbot.installed(tmp_path, payments.url, monkeypatch) as (package, name, ref):
        _samples(nats_url, tmp_path, package, ref, name, capsys)


def _samples(
    nats_url: str, tmp_path: Path, package: str, ref: str, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def record() -> str:
        async with await connect(nats_url) as client:
            trip = next(t for t in tripbot.TRIPS if t["trip"] == "TR-02")
            result = await start_run(client, load_agent(ref), trip, run_id=f"{name}-TR-02")
            assert result.status == "failed", result
            return result.run_id

    run_id = asyncio.run(record())
    sweep = ["rerun", "--nats", nats_url, "--agent", ref, "--mode", "counterfactual", "--base-mode", "live",
             "--where", f"run_id = '{run_id}'", "--set", f"model={package}.agent:sometimes_model", "--samples", "5",
             "--concurrency", "2", "--pool", "2"]  # fmt: skip

    capsys.readouterr()
    junit = tmp_path / "gate.xml"
    code = main([*sweep, "--min-fix-rate", "0.8", "--junit", str(junit)])
    out = capsys.readouterr().out
    assert code == 1, out
    assert f"still_failing {run_id}" in out and "[fixed 3/5, baseline steady]" in out, out
    assert "fixed 3/5, below --min-fix-rate 0.8" in out and "gate: CLOSED" in out, out
    assert "1 runs x 5 samples (5 branches) re-driven: 3 completed" in out, out
    props = {p.get("name"): p.get("value") for p in ET.parse(junit).getroot().iter("property")}
    assert (props["samples"], props["fixes"], props["fix_rate"], props["flaky"]) == ("5", "3", "0.600", "false")

    code = main([*sweep, "--min-fix-rate", "0.6", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    (case,) = report["cases"]
    assert (case["verdict"], case["samples"], case["fixes"], case["fix_rate"]) == ("improved", 5, 3, 0.6), case
    assert (case["baseline_samples"], case["baseline_flips"], case["flaky"]) == (5, 0, False), case
    assert len(set(case["sample_branches"])) == 5 and report["min_fix_rate"] == 0.6


async def test_the_response_cache_answers_identical_requests_once_and_a_second_sweep_calls_no_model(
    client: LedgerClient, pool: SandboxPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    payments: PaymentsService,
) -> None:  # fmt: skip
    tag = os.urandom(3).hex()
    package, name = f"tripbot_{tag}", f"tripbot-{tag}"
    monkeypatch.setenv("TRIPBOT_BOOKINGS_URL", payments.url)
    monkeypatch.setenv(ALLOW_CODE_ENV, f".,{package}")
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    ref = tripbot.write(tmp_path / "code", package, name)
    try:
        # TR-02 and TR-04: the same stay in CHF, so the same request at the decision (step 2).
        runs = []
        for trip in (t for t in tripbot.TRIPS if t["trip"] in tripbot.FAILING):
            result = await start_run(client, load_agent(ref), trip, run_id=f"{name}-{trip['trip']}")
            runs.append(result.run_id)
        made = importlib.import_module(f"{package}.agent").CALLS_MADE
        cache = ResponseCache()
        template = RerunRequest(parent_run_id="-", agent=ref, mode="counterfactual", base_mode="live",
                                change={"model": f"{package}.agent:counting_model"})  # fmt: skip
        first = await sweep(client, pool, runs, template, concurrency=1, responses=cache)
        assert [c.verdict for c in first.gate.cases] == ["improved", "improved"], first.gate.render()
        assert (made[0], first.gate.model_calls, first.gate.cached_calls) == (1, 1, 1)
        assert "model calls: 1 made, 1 served from the cache" in first.gate.render()
        again = template.model_copy(update={"request_id": template.request_id + "-again"})
        second = await sweep(client, pool, runs, again, concurrency=1, responses=cache)
        assert [c.verdict for c in second.gate.cases] == ["improved", "improved"], second.gate.render()
        assert (made[0], second.gate.model_calls, second.gate.cached_calls) == (1, 1, 3)  # no new call
        junit = ET.fromstring(second.gate.junit())
        props = {p.get("name"): p.get("value") for p in junit.iter("property")}
        assert (props["model_calls"], props["cached_calls"]) == ("1", "3")
        assert second.gate.to_dict()["cached_calls"] == 3
    finally:
        tripbot.forget(package)
