"""Host CPU accounting (runledger.cpu): a meter is charged with its work's CPU, wherever the work runs in
the process, and with nothing of its neighbours'.

Work is burned by CPU time (a loop until ``time.thread_time`` has advanced), not by the clock, so what a
meter should hold is known whatever the machine's load: each assertion compares CPU with CPU.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from runledger.cpu import METER, CpuMeter, in_thread, metered

BURN = 0.06  # CPU seconds one piece of work burns


def burn(seconds: float = BURN) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


async def burn_in_steps(seconds: float = BURN, steps: int = 6) -> None:
    """CPU in the event loop's thread, in steps with a yield between them (others run meanwhile)."""
    for _ in range(steps):
        burn(seconds / steps)
        await asyncio.sleep(0)


async def test_a_metered_coroutine_is_charged_its_own_steps_and_not_its_neighbours() -> None:
    meter = CpuMeter()
    neighbour = asyncio.create_task(burn_in_steps(3 * BURN))  # interleaved with the metered work
    await metered(burn_in_steps(), meter)
    await neighbour
    assert BURN <= meter.used < 2 * BURN, meter.used  # its neighbour's 3 x BURN would show


async def test_the_tasks_and_threads_a_metered_coroutine_starts_are_charged_to_it() -> None:
    async def work() -> list[Any]:
        spawned = asyncio.create_task(burn_in_steps())
        waited = await asyncio.wait_for(burn_in_steps(), timeout=60)  # an inner task on Python 3.11
        gathered = await asyncio.gather(burn_in_steps(), in_thread(burn))
        await spawned
        return [waited, *gathered]

    meter = CpuMeter()
    unmetered_thread = asyncio.create_task(asyncio.to_thread(burn, 3 * BURN))  # another's thread
    assert await metered(work(), meter) == [None, None, None]
    await unmetered_thread
    assert 4 * BURN <= meter.used < 5 * BURN, meter.used
    assert METER.get() is None  # the meter is the metered work's, not its caller's after it


async def test_a_task_started_outside_the_metered_work_is_not_charged_to_it() -> None:
    meter = CpuMeter()
    started = asyncio.Event()

    async def outside() -> None:
        started.set()
        await burn_in_steps(3 * BURN)

    task = asyncio.create_task(outside())  # created before, running during the metered work

    async def work() -> None:
        await started.wait()
        await burn_in_steps()
        await task  # awaiting a task does not make its steps the awaiter's

    await metered(work(), meter)
    assert BURN <= meter.used < 2 * BURN, meter.used


async def test_metered_work_returns_raises_and_is_cancelled_like_the_coroutine_itself() -> None:
    meter = CpuMeter()

    async def fails() -> None:
        await asyncio.sleep(0)
        raise KeyError("lost")

    with pytest.raises(KeyError, match="lost"):
        await metered(fails(), meter)

    cleaned: list[str] = []

    async def slow() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            cleaned.append("finally ran")

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(metered(slow(), meter), timeout=0.05)
    assert cleaned == ["finally ran"]

    async def catches_cancel() -> str:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            return "handled"
        return "not cancelled"

    task = asyncio.create_task(metered(catches_cancel(), meter))
    await asyncio.sleep(0.01)
    task.cancel()
    assert await task == "handled"


async def test_the_loops_own_task_factory_still_makes_every_task() -> None:
    loop = asyncio.get_running_loop()
    made: list[str] = []
    previous = loop.get_task_factory()

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future[Any]:
        made.append(getattr(coro, "__qualname__", "?"))
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)
    try:
        meter = CpuMeter()

        async def work() -> None:
            await asyncio.create_task(burn_in_steps())

        await metered(work(), meter)
        await asyncio.create_task(asyncio.sleep(0))  # outside the meter: as the factory made it
        assert len(made) == 2, made
        assert BURN <= meter.used < 2 * BURN, meter.used
    finally:
        loop.set_task_factory(previous)
