"""An effect function's check of its claim (``EffectContext.check`` / ``acheck``,
runledger.sdk.context) without a server: the lease by the local clock, the margin, the ledger's
answer through a probe, and from which threads and loops the ledger may be asked."""

from __future__ import annotations

import asyncio
import datetime as dt
import pickle
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from runledger import ClaimTakenOverError, ConfigurationError, EffectContext, LeaseExpiredError, StaleClaimError
from runledger.sdk.context import lease_clock, lease_ends


@dataclass
class FakeProbe:
    """A ledger whose key ends at ``last``; the loop it must be read on; how long a read takes."""

    loop: asyncio.AbstractEventLoop
    last: int
    delay_s: float = 0.0
    asked_on: list[asyncio.AbstractEventLoop] = field(default_factory=list)

    async def last_sequence(self, at_least: int) -> int:
        self.asked_on.append(asyncio.get_running_loop())
        await asyncio.sleep(self.delay_s)
        return self.last


def claim(probe: FakeProbe | None = None, lease_s: float = 10.0, left_s: float = 10.0) -> EffectContext:
    return EffectContext(
        key="pay:o1", run_id="r1", step=3, attempt=2, fencing_token=17, lease_s=lease_s,
        lease_ends=lease_clock() + left_s, _probe=probe,
    )  # fmt: skip


@pytest.fixture
def loop_thread() -> Iterator[asyncio.AbstractEventLoop]:
    """A run's event loop, running in a thread of its own (the test's thread is its worker thread)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def test_the_clock_check_passes_within_the_lease_and_refuses_after_it() -> None:
    claim(left_s=5).check()
    with pytest.raises(LeaseExpiredError) as caught:
        claim(lease_s=1.5, left_s=-2).check()
    error = caught.value
    assert isinstance(error, StaleClaimError)
    assert (error.key, error.run_id, error.step, error.attempt, error.fencing_token) == ("pay:o1", "r1", 3, 2, 17)
    assert error.lease_s == 1.5 and error.left_s < -1.9
    text = str(error)
    assert text.startswith("run r1 step 3: effect 'pay:o1' (attempt 2, fencing token 17) must not act")
    assert "ran out 2.0" in text and "without calling the service" in text and "lease_s=" in text


def test_a_margin_asks_for_lease_left_for_the_call() -> None:
    ctx = claim(left_s=1.0)
    ctx.check(margin_s=0.5)
    with pytest.raises(LeaseExpiredError, match="less than the 2s the call was given"):
        ctx.check(margin_s=2.0)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ConfigurationError):
            ctx.check(margin_s=bad)


def test_a_context_outside_a_claim_has_nothing_to_check() -> None:
    ctx = EffectContext(key="", run_id="r1", step=0, attempt=0, fencing_token=0)  # a key function's
    assert ctx.lease_left() is None
    ctx.check(ledger=True)
    asyncio.run(ctx.acheck(ledger=True))


def test_the_lease_ends_from_the_claims_ts_on_the_local_clock() -> None:
    def ts(seconds_ago: float) -> str:
        return (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds_ago)).isoformat().replace("+00:00", "Z")

    now = lease_clock()
    assert lease_ends(ts(0.4), 2.0) == pytest.approx(now + 1.6, abs=0.05)  # the claim was stamped 0.4 s ago
    assert lease_ends(ts(-60), 2.0) == pytest.approx(now + 2.0, abs=0.05)  # stamped "in the future": from now
    assert lease_ends(ts(60), 2.0) == pytest.approx(now, abs=0.05)  # older than its lease: already over
    assert lease_ends(None, 2.0) is None and lease_ends(ts(0), None) is None


def test_the_ledger_is_asked_on_the_runs_loop_from_a_worker_thread(loop_thread: asyncio.AbstractEventLoop) -> None:
    probe = FakeProbe(loop_thread, last=17)
    claim(probe).check(ledger=True)
    assert probe.asked_on == [loop_thread]
    probe.last = 18  # something was written after the claim
    with pytest.raises(ClaimTakenOverError, match="ends at stream sequence 18") as caught:
        claim(probe).check(ledger=True)
    assert caught.value.last_seq == 18
    claim(probe).check()  # without ledger=True the ledger is not asked
    assert len(probe.asked_on) == 2


def test_the_clock_is_read_again_after_a_slow_answer(loop_thread: asyncio.AbstractEventLoop) -> None:
    probe = FakeProbe(loop_thread, last=17, delay_s=0.3)
    with pytest.raises(LeaseExpiredError):
        claim(probe, left_s=0.2).check(ledger=True)


def test_on_the_runs_loop_the_blocking_check_refuses_and_acheck_awaits() -> None:
    async def main() -> None:
        probe = FakeProbe(asyncio.get_running_loop(), last=17)
        with pytest.raises(ConfigurationError, match="acheck"):
            claim(probe).check(ledger=True)  # a sync effect function runs here: it would block the loop
        claim(probe).check()
        await claim(probe).acheck(ledger=True)
        probe.last = 20
        with pytest.raises(ClaimTakenOverError):
            await claim(probe).acheck(ledger=True)

    asyncio.run(main())


def test_acheck_on_another_loop_reads_on_the_runs(loop_thread: asyncio.AbstractEventLoop) -> None:
    probe = FakeProbe(loop_thread, last=17)
    asyncio.run(claim(probe).acheck(ledger=True))  # a thread's own loop, not the run's
    assert probe.asked_on == [loop_thread]


def test_the_errors_survive_pickling() -> None:
    for error in (
        LeaseExpiredError("k", "r", 1, 2, 3, 1.5, -0.25, 0.0),
        ClaimTakenOverError("k", "r", 1, 2, 3, 9),
    ):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error) and copy.__dict__ == error.__dict__
