"""A holder frozen inside its effect past the lease pays nothing twice when its effect function checks
its claim first, even at a service that ignores idempotency keys.

The payer agent (tests/integration/frozen_payer.py) runs in its own process; its effect function
works a little (``FROZEN_PREP_S``), then checks its claim (``ctx.check()``, or
``await ctx.acheck(ledger=True)``), then calls the payments service WITHOUT an idempotency key:
the service pays every call it gets. Each trial freezes the holder (SIGSTOP) at a random moment
inside the function, after the claim and before the check, keeps it frozen past its lease while
this process resumes the run (the resume waits out the lease, reconciles with the service, which
has no payment, and pays with a new attempt), then wakes it (SIGCONT). The witness is the service's
own log: one payment per trial. Without the check (the old behaviour) the woken holder pays a
second time; that test shows the trial can fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import connect
from runledger.log.reader import decode_records, read_raw
from runledger.log.subjects import effect_filter
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from runledger.sdk.lifecycle import resume_run
from tests.integration.frozen_payer import spec
from tests.integration.processes import start_agent

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
AGENT = "tests.integration.frozen_payer:spec"
LEASE = 1.5
PREP_S = 0.6  # the function's work before its check: the window the freeze is drawn in
TRIALS = 10


async def _resume(url: str, run_id: str, key: str) -> tuple[Any, list[str], Any]:
    async with await connect(url) as client:
        result = await resume_run(client, spec(), run_id)
        good, bad = decode_records(await read_raw(client, effect_filter(spec().name, key)))
        assert bad == []
        cp = fold((await load_run(client, run_id)).records)
        return result, [r.event.type for r in good], cp


def _trial(
    url: str, where: Path, monkeypatch: pytest.MonkeyPatch, rng: random.Random, i: int, check: str
) -> dict[str, Any]:
    """One frozen holder; what the service's log and the ledger say afterwards."""
    where.mkdir(parents=True)
    payments = PaymentsService(where / "payments.log").start()
    markers = where / "markers"
    markers.mkdir()
    order, run_id = f"order-{i}", f"frozen-check-{i}"
    key = f"pay:{order}"
    monkeypatch.setenv("FROZEN_PAYMENTS_URL", payments.url)  # the resume, in this process: no prep, checks
    monkeypatch.setenv("FROZEN_CHECK", "clock")
    holder = start_agent(url, AGENT, run_id, json.dumps({"order": order}), {
        "FROZEN_PAYMENTS_URL": payments.url, "FROZEN_CHECK": check, "FROZEN_MARKERS": str(markers),
        "FROZEN_PREP_S": str(PREP_S), "RUNLEDGER_EFFECT_LEASE_S": str(LEASE),
    })  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (markers / "entered").exists():
            assert holder.poll() is None, f"the holder ended before its effect: {holder.communicate()}"
            assert time.monotonic() < deadline, "the holder never reached its effect"
            time.sleep(0.002)
        delay = rng.uniform(0.0, PREP_S * 0.6)  # a random moment between the claim and the check
        time.sleep(delay)
        os.kill(holder.pid, signal.SIGSTOP)
        time.sleep(0.05)  # the stop is delivered: the markers are what the frozen process left
        assert not (markers / "checking").exists(), f"trial {i}: the freeze ({delay:.3f}s in) landed after the check"
        assert payments.calls() == []
        started = time.monotonic()
        result, events, cp = asyncio.run(_resume(url, run_id, key))
        resume_s = time.monotonic() - started
        assert result.status == "completed", result
        os.kill(holder.pid, signal.SIGCONT)
        out, err = holder.communicate(timeout=60)
    finally:
        if holder.poll() is None:
            os.kill(holder.pid, signal.SIGCONT)
            holder.kill()
            holder.communicate()
        payments.stop()
    paid = [c for c in payments.calls() if c["order"] == order]
    return {
        "delay": delay, "resume_s": resume_s, "paid": paid, "events": events, "cp": cp,
        "returncode": holder.returncode, "out": out, "err": err,
        "refused": sorted(p.name for p in markers.glob("refused-*")),
    }  # fmt: skip


def test_a_frozen_holder_that_checks_its_claim_pays_once_at_a_service_that_ignores_keys(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    trials = []
    for i in range(TRIALS):
        check = ("clock", "ledger")[i % 2]  # ctx.check() and await ctx.acheck(ledger=True) alike
        t = _trial(nats_url, tmp_path / f"trial-{i}", monkeypatch, rng, i, check)
        where = f"trial {i} (seed {seed}, frozen {t['delay']:.3f}s into the function, {check} check)"
        # The witness: the service paid once, the resume's attempt; the woken holder called nothing.
        assert len(t["paid"]) == 1, (where, t["paid"], t["err"])
        assert t["cp"].status == "completed" and t["cp"].output == {
            k: t["paid"][0][k] for k in ("refund_id", "order", "amount")
        }
        # The resume waited out the lease, found nothing paid, and paid with a second attempt.
        assert t["resume_s"] >= LEASE * 0.3, where
        assert t["events"] == ["effect.intended", "effect.resolved", "effect.intended", "effect.committed"], where
        # The woken holder's check refused to act; recording its failed attempt was fenced out.
        assert t["returncode"] == 4, (where, t["out"], t["err"])
        assert t["refused"] == ["refused-LeaseExpiredError"], (where, t["refused"], t["err"])
        assert "lost its claim" in t["err"] and "another writer owns ledger.effect." in t["err"], (where, t["err"])
        trials.append(t)
    print(f"seed {seed}; freezes (s into the function): {[round(t['delay'], 3) for t in trials]}; "
          f"payments per trial: {[len(t['paid']) for t in trials]}")  # fmt: skip


def test_without_the_check_the_woken_holder_pays_a_second_time(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old behaviour, which the trials above must not show: fencing stops the holder's ledger
    writes, not its call."""
    rng = random.Random()
    for i in range(2):
        t = _trial(nats_url, tmp_path / f"trial-{i}", monkeypatch, rng, i, "none")
        assert len(t["paid"]) == 2, t["paid"]  # the resume's payment, then the woken holder's
        assert t["refused"] == [] and t["returncode"] == 4 and "another writer owns ledger.effect." in t["err"], t[
            "err"
        ]
