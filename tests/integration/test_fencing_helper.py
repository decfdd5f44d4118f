"""A holder frozen AFTER its check pays nothing twice at a service that keeps the highest fencing
token per key (runledger.sdk.fencing.FencingTokens), even though the service ignores idempotency keys.

The payer agent (tests/integration/frozen_payer.py, ``FROZEN_CHECK=token``) runs in a process of its
own: its effect function checks its claim (``ctx.check()``: the lease is fresh, so it passes), marks
``checked`` and holds there; each trial freezes it (SIGSTOP) right there, after the check and before
its call, keeps it frozen past its lease while this process resumes the run (the resume waits out the
lease, reconciles with the service, which has no payment, and pays with a new attempt: a new claim,
a larger token), then wakes it (SIGCONT). The woken holder calls the service with its old token, and
the service refuses it (409) without paying. The witness is the service's own log: one payment per
trial, and one refused stale token. The ten trials run side by side, each its own run, order and
key. Without the helper the same trial pays twice (the second test): a check cannot see a pause
between itself and the call.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from runledger import FencingTokens
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import connect
from runledger.log.reader import decode_records, read_raw
from runledger.log.subjects import effect_filter
from runledger.sdk.lifecycle import resume_run
from tests.integration.frozen_payer import spec
from tests.integration.processes import start_agent

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
AGENT = "tests.integration.frozen_payer:spec"
LEASE = 1.0
TRIALS = 10


def _freeze_after_the_check(
    url: str, where: Path, payments: PaymentsService, trials: int
) -> list[tuple[subprocess.Popen[str], Path]]:
    """Start ``trials`` holders, each frozen (SIGSTOP) where it holds after its check; their markers."""
    holders = []
    for i in range(trials):
        markers = where / f"trial-{i}"
        markers.mkdir(parents=True)
        env = {
            "FROZEN_PAYMENTS_URL": payments.url, "FROZEN_CHECK": "token", "FROZEN_MARKERS": str(markers),
            "FROZEN_GO": str(markers / "go"), "FROZEN_PREP_S": "0", "RUNLEDGER_EFFECT_LEASE_S": str(LEASE),
        }  # fmt: skip
        holders.append((start_agent(url, AGENT, f"fenced-{i}", json.dumps({"order": f"order-{i}"}), env), markers))
    deadline = time.monotonic() + 120
    for holder, markers in holders:
        while not (markers / "checked").exists():
            assert holder.poll() is None, f"a holder ended before its call: {holder.communicate()}"
            assert time.monotonic() < deadline, "a holder never reached its call"
            time.sleep(0.005)
        os.kill(holder.pid, signal.SIGSTOP)  # after its check, before its call
        (markers / "go").touch()  # it calls as soon as it wakes
    assert payments.calls() == []
    return holders


async def _resume_all(url: str, trials: int) -> list[tuple[Any, list[str]]]:
    """Resume every trial's run at once (each waits out its lease, reconciles, pays anew)."""
    async with await connect(url) as client:

        async def one(i: int) -> tuple[Any, list[str]]:
            result = await resume_run(client, spec(), f"fenced-{i}")
            good, _ = decode_records(await read_raw(client, effect_filter(spec().name, f"pay:order-{i}")))
            return result, [r.event.type for r in good]

        return await asyncio.gather(*(one(i) for i in range(trials)))


def _trials(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, payments: PaymentsService, trials: int) -> Any:
    monkeypatch.setenv("FROZEN_PAYMENTS_URL", payments.url)  # the resume, in this process: no hold
    monkeypatch.setenv("FROZEN_CHECK", "token")
    holders = _freeze_after_the_check(url, tmp_path, payments, trials)
    try:
        resumed = asyncio.run(_resume_all(url, trials))
        for holder, _ in holders:
            os.kill(holder.pid, signal.SIGCONT)
        woken = [holder.communicate(timeout=120) for holder, _ in holders]
    finally:
        for holder, _ in holders:
            if holder.poll() is None:
                os.kill(holder.pid, signal.SIGCONT)
                holder.kill()
                holder.communicate()
        payments.stop()
    return holders, resumed, woken


def test_a_holder_frozen_after_its_check_pays_nothing_twice_at_a_service_that_keeps_fencing_tokens(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = FencingTokens(tmp_path / "fencing.db")
    payments = PaymentsService(tmp_path / "payments.log", fencing=tokens, honour_keys=False).start()
    holders, resumed, woken = _trials(nats_url, tmp_path, monkeypatch, payments, TRIALS)
    paid = [[c for c in payments.calls() if c["order"] == f"order-{i}"] for i in range(TRIALS)]
    assert [len(p) for p in paid] == [1] * TRIALS, paid  # the witness: one payment per trial
    assert payments.stale_refused == TRIALS  # each woken holder's call, refused for its old token
    for i, ((holder, markers), (result, events), (out, err)) in enumerate(zip(holders, resumed, woken, strict=True)):
        where = f"trial {i}"
        assert result.status == "completed" and result.output["refund_id"] == paid[i][0]["refund_id"], where
        # The resume waited out the lease, found nothing paid, and paid with a second attempt (a larger token).
        assert events == ["effect.intended", "effect.resolved", "effect.intended", "effect.committed"], where
        assert (tokens.highest(f"pay:order-{i}") or 0) > 0
        # The woken holder's call was refused at the service; recording its failure was fenced out.
        assert sorted(p.name for p in markers.glob("refused-*")) == ["refused-StaleFencingTokenError"], (where, err)
        assert holder.returncode == 4 and "another writer owns ledger.effect." in err, (where, out, err)
    tokens.close()


def test_without_the_helper_the_woken_holder_pays_a_second_time(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same trial at a service that ignores the token (and the key): the check passed before the
    pause, so the woken holder pays again. What the helper closes."""
    payments = PaymentsService(tmp_path / "payments.log", honour_keys=False).start()
    _trials(nats_url, tmp_path, monkeypatch, payments, 2)
    assert [len([c for c in payments.calls() if c["order"] == f"order-{i}"]) for i in range(2)] == [2, 2]
    assert payments.stale_refused == 0
