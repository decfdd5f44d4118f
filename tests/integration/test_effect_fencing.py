"""At most once against a paused holder, not only a dead one.

The refund agent runs in its own process and is frozen (SIGSTOP) inside its refund effect, after
the claim: either before the payments service was called (``claimed``) or after it answered
(``acted``). Another process (this one) resumes the run: it waits out the claim's lease, settles the
claim (the tool's reconcile asks the service) and finishes the run, the refund made by a new attempt
if none was made. Then SIGCONT: the woken holder goes on where it was. Its call to the service
carries the same idempotency key, so the service refunds nothing twice; its ledger write is fenced
out, so it stops with FencedError and exits non-zero. The payments service's own log is counted.

The freeze points are the SDK's pause points right around the effect function's call
(``effect:<key>:claimed`` after the claim, ``effect:<key>:acted`` after the function returned):
as far as the ledger and the service can tell, the same as a freeze inside the function before or
after its call. A second test wakes the holder while the resume still waits for the lease.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import nats
import pytest

from runledger.examples.refund_agent.agent import TICKETS, spec
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import connect
from runledger.log.reader import decode_records, read_raw
from runledger.log.server import EmbeddedServer
from runledger.log.subjects import LEDGER_STREAM, effect_filter
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from runledger.sdk.lifecycle import resume_run

# _one_round waits up to 60 + 60 + 120 + 60 s.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]
ROOT = Path(__file__).resolve().parents[2]
AGENT = "runledger.examples.refund_agent.agent:spec"
T1001 = next(t for t in TICKETS if t["ticket"] == "T-1001")
KEY = "refund:order-8891"
LEASE = 1.5
ROUNDS = 10
# The server's stamp on a stored message comes a publish after the claim's own ``ts`` (from which the
# holder's lease runs, on the same host's clock): the lease measured between two stamps may be short by that.
CLOCK_TOLERANCE_S = 0.1


async def _stored(url: str, subject_filter: str) -> list[tuple[str, float]]:
    """(subject, when the server stored it) of each message on ``subject_filter``, read in this process
    with nats-py alone: the key's raw messages, not the events runledger decodes nor the times it writes."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        stored: list[tuple[str, float]] = []
        seq = 1
        while True:
            try:
                msg = await js.get_msg(LEDGER_STREAM, seq=seq, subject=subject_filter, next=True)
            except nats.js.errors.NotFoundError:
                return stored
            assert msg.seq is not None and msg.time is not None
            stored.append((msg.subject, msg.time.timestamp()))
            seq = msg.seq + 1
    finally:
        await nc.close()


async def _resume_and_read(url: str, run_id: str) -> tuple[Any, list[Any], Any, list[tuple[str, float]]]:
    async with await connect(url) as client:
        result = await resume_run(client, spec(), run_id)
        good, bad = decode_records(await read_raw(client, effect_filter(spec().name, KEY)))
        assert bad == []
        cp = fold((await load_run(client, run_id)).records)
    return result, [r.event for r in good], cp, await _stored(url, effect_filter(spec().name, KEY))


def _stats(payments: PaymentsService) -> dict[str, Any]:
    with urllib.request.urlopen(f"{payments.url}/stats", timeout=10) as resp:
        stats: dict[str, Any] = json.loads(resp.read())
        return stats


class _Waiting(logging.Handler):
    """Set when the resume reports that it waits for the claim's lease."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "holds its lease" in record.getMessage():
            self.seen.set()


def _one_round(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    i: int,
    frozen_at: str,
    *,
    wake: str = "after",
    lease: float = LEASE,
) -> dict[str, Any]:
    """Freeze the holder at ``frozen_at``, resume, and wake the holder ``after`` the resume settled
    the claim or ``during`` the resume's wait for the lease."""
    where = tmp_path / f"round-{i}"
    server = EmbeddedServer(home=where / "home")
    url = server.start(data_dir=where / "data").url
    payments = PaymentsService(where / "payments.log").start()
    barrier = where / "barrier"
    env = {
        **os.environ,
        "RUNLEDGER_NATS_URL": url,
        "REFUND_PAYMENTS_URL": payments.url,
        "REFUND_OUTBOX": str(where / "outbox"),
        "RUNLEDGER_EFFECT_LEASE_S": str(lease),
        # The holder stops at the pause point and waits there for a second arrival (the release below).
        "RUNLEDGER_PAUSE_AT": f"effect:{KEY}:{frozen_at}",
        "RUNLEDGER_PAUSE_DIR": str(barrier),
        "RUNLEDGER_PAUSE_COUNT": "2",
    }
    monkeypatch.setenv("REFUND_PAYMENTS_URL", payments.url)  # the resume, in this process
    monkeypatch.setenv("REFUND_OUTBOX", str(where / "outbox"))
    run_id = f"frozen-{i}"
    waiting = _Waiting()
    library = logging.getLogger("runledger")
    level = library.level
    library.addHandler(waiting)
    library.setLevel(logging.INFO)
    holder = subprocess.Popen(
        [sys.executable, "-m", "runledger", "run", "--agent", AGENT, "--input", json.dumps(T1001), "--run-id", run_id],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (barrier.exists() and any(barrier.iterdir())):
            assert holder.poll() is None, f"the holder ended before its effect: {holder.communicate()}"
            assert time.monotonic() < deadline, "the holder never reached its effect"
            time.sleep(0.01)
        os.kill(holder.pid, signal.SIGSTOP)  # inside the effect, after the claim
        assert len(payments.calls()) == (1 if frozen_at == "acted" else 0)

        def wake_up() -> None:
            (barrier / "release").touch()
            os.kill(holder.pid, signal.SIGCONT)

        started = time.monotonic()
        outcome: list[Any] = []
        resume = threading.Thread(target=lambda: outcome.append(asyncio.run(_resume_and_read(url, run_id))))
        resume.start()
        if wake == "during":
            assert waiting.seen.wait(60), "the resume never waited for the lease"
            wake_up()
        resume.join(120)
        resume_s = time.monotonic() - started
        assert outcome, "the resume failed (see the thread's traceback)"
        result, events, cp, stored = outcome[0]
        assert result.status == "completed", result
        if wake == "after":
            wake_up()
        out, err = holder.communicate(timeout=60)
        stats = _stats(payments)
    finally:
        library.removeHandler(waiting)
        library.setLevel(level)
        if holder.poll() is None:
            os.kill(holder.pid, signal.SIGCONT)
            holder.kill()
            holder.communicate()
        payments.stop()
        server.stop()

    # The world: one refund, whatever the order of the two attempts' calls.
    refunds = [c for c in payments.calls() if c["order"] == "order-8891"]
    assert len(refunds) == 1, refunds
    assert refunds[0]["idempotency_key"] == KEY
    assert cp.status == "completed" and cp.output["refund"]["refund_id"] == refunds[0]["refund_id"]
    # The holder stopped on a fence, exit 4 (Exit.ERROR), recording nothing after it.
    assert holder.returncode == 4, (out, err)
    claim = events[0]
    assert claim.type == "effect.intended" and claim.payload["lease_s"] == lease
    if wake == "during":
        # Woken inside its lease, the holder recorded its outcome on the key; the resume saw the key move
        # on, stopped waiting, and took the outcome from the record. The holder's next write, on the run
        # the resume now owns, was fenced.
        assert "another writer owns ledger.run." in err, err
        assert [e.type for e in events] == ["effect.intended", "effect.committed"]
        assert cp.steps[3].status == "committed" and resume_s < lease
        assert stats == {"refunds": 1, "replayed": 0, "stale_refused": 0}, stats
        return {"resume_s": resume_s}
    # Woken after the resume settled its claim: its write to the key was fenced.
    assert "another writer owns ledger.effect." in err, err
    # Frozen before its call: the holder's call came second and was answered from the first.
    assert stats == {"refunds": 1, "replayed": 1 if frozen_at == "claimed" else 0, "stale_refused": 0}, stats
    # The ledger: the claim was settled only after its whole lease, then (if nothing was paid) a second
    # attempt. The lease is measured between the server's stamps on the key's raw messages, not between the
    # times the system wrote into its own events.
    resolution = events[1]
    assert resolution.type == "effect.resolved" and resolution.payload["forced"] is False
    assert len(stored) == len(events), stored
    (_, claimed_at), (_, settled_at) = stored[:2]
    settled_after_s = settled_at - claimed_at
    assert settled_after_s >= lease - CLOCK_TOLERANCE_S, f"settled {settled_after_s:.3f}s after its claim"
    if frozen_at == "claimed":
        assert [e.type for e in events] == ["effect.intended", "effect.resolved", "effect.intended", "effect.committed"]
        assert resolution.payload["outcome"] == "not_committed"
    else:
        assert [e.type for e in events] == ["effect.intended", "effect.resolved"]
        assert resolution.payload["outcome"] == "committed"
    return {"resume_s": resume_s, "settled_after_s": settled_after_s}


def test_a_frozen_holder_woken_after_its_claim_was_taken_over_refunds_nothing_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = time.monotonic()
    rounds = [_one_round(tmp_path, monkeypatch, i, ("claimed", "acted")[i % 2]) for i in range(ROUNDS)]
    took = time.monotonic() - started
    print(f"{ROUNDS} rounds in {took:.1f}s; resumes (s): {[round(r['resume_s'], 2) for r in rounds]}; claims "
          f"settled after (s, server stamps): {[round(r['settled_after_s'], 3) for r in rounds]}")  # fmt: skip
    assert all(r["settled_after_s"] >= LEASE - CLOCK_TOLERANCE_S for r in rounds)  # every resume waited the lease


@pytest.mark.parametrize("frozen_at", ["claimed", "acted"])
def test_a_holder_woken_within_its_lease_finishes_the_effect_and_the_resume_takes_its_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, frozen_at: str
) -> None:
    _one_round(tmp_path, monkeypatch, 0, frozen_at, wake="during", lease=20.0)
