"""Host CPU accounting: what one piece of work costs this process, wherever in the process it runs.

A re-run's broker (``runledger.sandbox.broker``) holds each re-run to a budget of host CPU. The
figure must be the re-run's own: ``time.process_time`` around it would count every other re-run
of the worker, the NATS client's reader and Docker's threads. So a ``CpuMeter`` is charged with the
CPU time (``time.thread_time``, measured where the work runs) of

- every step of the coroutine run by ``metered(coro, meter)``: the code between two awaits, in the
  event loop's thread (parsing a request, checking it, redaction in the loop, canonical JSON,
  hashes, encryption, the client's encoding of a publish);
- every step of the tasks started while it runs (``asyncio.wait_for``'s inner task, an effect's
  claim): the meter is in their context (``METER``), and the loop's task factory (``metering``,
  installed by ``metered``) runs each such task's coroutine under the meter too;
- the work handed to a worker thread through ``in_thread`` (a large value's redaction, a sync
  tool, a model client's request), measured in that thread.

Not charged: what runs outside those (other tasks and threads, a subprocess a tool starts, the
kernel's work for the sockets). A task's steps are charged once: a coroutine under ``metered`` is
not wrapped again by the factory (it is not a new task), and a task the factory wrapped is not
inside another's steps. The factory is installed on the running loop once, in front of any factory
the loop had; a library that replaces it later stops the charging of new tasks (their parent's own
steps and threads are still charged).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, TypeVar

_T = TypeVar("_T")


class CpuMeter:
    """CPU seconds charged so far (``used``), from the event loop's thread and from worker threads."""

    __slots__ = ("_lock", "_used")

    def __init__(self) -> None:
        self._used = 0.0
        self._lock = threading.Lock()  # worker threads charge too

    @property
    def used(self) -> float:
        return self._used

    def charge(self, seconds: float) -> None:
        with self._lock:
            self._used += seconds


# The meter of the work the current task does, if it is metered (tasks and threads started from it
# inherit it: asyncio copies the context into both).
METER: contextvars.ContextVar[CpuMeter | None] = contextvars.ContextVar("runledger_cpu_meter", default=None)


class _Steps:
    """An awaitable that runs ``coro`` step by step, charging each step's thread CPU to ``meter``."""

    __slots__ = ("_coro", "_meter")

    def __init__(self, coro: Coroutine[Any, Any, Any], meter: CpuMeter) -> None:
        self._coro = coro
        self._meter = meter

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, charge, clock = self._coro, self._meter.charge, time.thread_time
        value: Any = None
        error: BaseException | None = None
        while True:
            start = clock()
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                charge(clock() - start)
                return stop.value
            except BaseException:
                charge(clock() - start)
                raise
            charge(clock() - start)
            try:
                value, error = (yield yielded), None
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # a cancellation thrown into the task: handed on to the coroutine
                value, error = None, exc


async def _task_steps(coro: Coroutine[Any, Any, _T], meter: CpuMeter) -> _T:
    result: _T = await _Steps(coro, meter)
    return result


def metering(loop: asyncio.AbstractEventLoop) -> None:
    """Install, once, the task factory that meters tasks created under a meter (see the module)."""
    current = loop.get_task_factory()
    if getattr(current, "runledger_metering", False):
        return

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future[Any]:
        meter = METER.get() if kwargs.get("context") is None else kwargs["context"].get(METER)
        if meter is not None and asyncio.iscoroutine(coro):
            coro = _task_steps(coro, meter)
        if current is None:
            return asyncio.Task(coro, loop=loop, **kwargs)
        return current(loop, coro, **kwargs)

    factory.runledger_metering = True  # type: ignore[attr-defined]
    loop.set_task_factory(factory)


async def metered(coro: Coroutine[Any, Any, _T], meter: CpuMeter) -> _T:
    """Run ``coro`` with its CPU, and that of the tasks and ``in_thread`` work it starts, charged to
    ``meter``."""
    metering(asyncio.get_running_loop())
    token = METER.set(meter)
    try:
        result: _T = await _Steps(coro, meter)
        return result
    finally:
        METER.reset(token)


def _charged(meter: CpuMeter, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    start = time.thread_time()
    try:
        return fn(*args, **kwargs)
    finally:
        meter.charge(time.thread_time() - start)


def in_thread(fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> Awaitable[_T]:
    """``asyncio.to_thread(fn, *args, **kwargs)``, its CPU in the thread charged to the current
    task's meter, if it has one."""
    meter = METER.get()
    if meter is None:
        return asyncio.to_thread(fn, *args, **kwargs)
    return asyncio.to_thread(_charged, meter, fn, *args, **kwargs)
