"""The output window's bookkeeping (runledger.log.window), with the flush to the server replaced by
a stand-in the test controls: when a flush starts, how much is unacknowledged, what waits, and
that a failed flush stops the writer. The server side is tests/integration/test_output_durability.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from runledger import AgentSpec, ScriptedModel
from runledger.errors import ConfigurationError, FencedError
from runledger.log.window import Window, WindowedWriter, _Pending
from runledger.record.events import ClockRead


class HeldWriter(WindowedWriter):
    """A WindowedWriter whose flushes wait until the test lets them land (or fail)."""

    def __init__(self, window: Window) -> None:
        nc: Any = SimpleNamespace(connected_server_version=SimpleNamespace(major=2, minor=15))
        super().__init__(nc, None, "ledger.run.a.r.a", run_id="r", agent="a", msg_id_prefix="r", window=window)  # type: ignore[arg-type]
        self.windows: list[list[str]] = []
        self.gate = asyncio.Event()
        self.fail_with: BaseException | None = None

    async def _flush(self, window: list[_Pending]) -> None:
        self.windows.append([p.msg_id for p in window])
        await self.gate.wait()
        if self.fail_with is not None:
            raise self.fail_with
        self._done(window)


async def clock(writer: WindowedWriter, i: int) -> None:
    await writer.append(ClockRead(step=i, value=f"t{i}"))


async def test_appends_return_at_once_and_a_flush_starts_at_half_the_window() -> None:
    writer = HeldWriter(Window(max_events=8, max_ms=60_000))
    for i in range(3):
        await clock(writer, i)
    assert writer.windows == [] and writer.unacknowledged == 3
    await clock(writer, 3)
    await asyncio.sleep(0)
    assert writer.windows == [["r:0", "r:1", "r:2", "r:3"]]  # half the window: flushed in the background
    writer.gate.set()
    await writer.commit()
    assert writer.unacknowledged == 0 and writer.acknowledged == 4


async def test_a_full_window_makes_the_next_append_wait_for_the_flush_in_flight() -> None:
    writer = HeldWriter(Window(max_events=4, max_ms=60_000))
    for i in range(4):
        await clock(writer, i)  # 2 in flight, 2 pending: full
    assert writer.unacknowledged == 4
    blocked = asyncio.ensure_future(clock(writer, 4))
    await asyncio.sleep(0.01)
    assert not blocked.done()  # a fifth unacknowledged event would exceed the window
    writer.gate.set()
    await asyncio.wait_for(blocked, 5)
    assert writer.unacknowledged <= 4
    await writer.commit()
    assert [m for w in writer.windows for m in w] == [f"r:{i}" for i in range(5)]  # in order, each once


async def test_the_timer_flushes_a_window_that_does_not_fill() -> None:
    writer = HeldWriter(Window(max_events=64, max_ms=20))
    writer.gate.set()
    await clock(writer, 0)
    assert writer.windows == []
    for _ in range(100):
        if writer.windows:
            break
        await asyncio.sleep(0.01)
    assert writer.windows == [["r:0"]]


async def test_a_failed_flush_stops_the_writer_for_good() -> None:
    writer = HeldWriter(Window(max_events=8, max_ms=60_000))
    for i in range(4):
        await clock(writer, i)
    writer.fail_with = FencedError("ledger.run.a.r.a", "r:0", 7, 9)
    writer.gate.set()
    with pytest.raises(FencedError):
        await writer.commit()
    with pytest.raises(FencedError):
        await clock(writer, 4)
    with pytest.raises(FencedError):
        await writer.commit()
    assert writer.windows == [["r:0", "r:1", "r:2", "r:3"]]  # nothing after the refused window was sent


async def test_commit_waits_for_every_event_appended_before_it() -> None:
    writer = HeldWriter(Window(max_events=64, max_ms=60_000))
    for i in range(5):
        await clock(writer, i)
    committing = asyncio.ensure_future(writer.commit())
    await asyncio.sleep(0.01)
    assert not committing.done() and writer.windows == [[f"r:{i}" for i in range(5)]]
    writer.gate.set()
    await asyncio.wait_for(committing, 5)
    assert writer.unacknowledged == 0


def test_the_chain_is_built_as_a_step_writer_builds_it() -> None:
    writer = HeldWriter(Window())

    async def two() -> tuple[Any, Any]:
        first = await writer.append(ClockRead(step=0, value="a"))
        second = await writer.append(ClockRead(step=1, value="b"))
        return first, second

    first, second = asyncio.run(two())
    assert (first.seq, second.seq) == (0, 1) and second.prev_hash == first.hash


@pytest.mark.parametrize(("events", "ms"), [(0, 50.0), (1001, 50.0), (8, 0.0), (8, -1.0)])
def test_a_window_out_of_bounds_is_refused(events: int, ms: float) -> None:
    with pytest.raises(ConfigurationError):
        Window(events, ms)
    with pytest.raises(ConfigurationError, match="output window"):
        AgentSpec("a", _agent, ScriptedModel([]), durability="output", window_events=events, window_ms=ms)


def test_an_unknown_durability_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="durability 'sometimes' is not one of step, output"):
        AgentSpec("a", _agent, ScriptedModel([]), durability="sometimes")  # type: ignore[arg-type]


async def _agent(run: Any) -> None:
    return None
