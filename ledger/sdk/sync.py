"""A sync facade for agent code that is not async.

``sync_agent(fn)`` turns ``fn(run: SyncRun) -> result`` into an agent function: ``fn`` runs
in a worker thread, and each SyncRun call is executed on the event loop that owns the
connection, so the guarantees (write-ahead, fencing, journal replay) are the async ones.
``run_sync`` / ``resume_sync`` drive a run from plain synchronous code.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from runledger.log.client import connect
from runledger.sdk.agent import AgentFn, AgentSpec
from runledger.sdk.lifecycle import RunResult, resume_run, start_run
from runledger.sdk.models import ModelResponse
from runledger.sdk.protocol import Run
from runledger.sdk.tools import EffectClass, Tool, ToolFn

T = TypeVar("T")


class SyncRun:
    """The blocking twin of ``Run``: methods have the same meaning and arguments, and it wraps any
    implementation of ``Run`` (a recorded run, the sandbox guest's, a re-run's)."""

    def __init__(self, run: Run, loop: asyncio.AbstractEventLoop) -> None:
        self._run = run
        self._loop = loop

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def async_run(self) -> Run:
        """The ``Run`` this wraps: its calls are coroutines of ``loop``. For code that runs an event loop
        of its own in this thread (a framework's blocking entry point, such as Pydantic AI's
        ``run_sync``) and awaits the run's calls from it on ``loop``, never blocking its own."""
        return self._run

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop that owns the connection, where ``async_run``'s calls run."""
        return self._loop

    @property
    def run_id(self) -> str:
        return self._run.run_id

    @property
    def input(self) -> Any:
        return self._run.input

    def model(self, messages: list[dict[str, Any]], **params: Any) -> ModelResponse:
        return self._call(self._run.model(messages, **params))

    def tool(
        self, tool: str | Tool, args: Any = None, *, fn: ToolFn | None = None, tool_call_id: str | None = None
    ) -> Any:
        return self._call(self._run.tool(tool, args, fn=fn, tool_call_id=tool_call_id))

    def effect(
        self,
        name: str,
        args: Any,
        *,
        key: str,
        fn: ToolFn,
        reconcile: Any = None,
        effect_class: EffectClass = "write",
        tool_call_id: str | None = None,
        lease_s: float | None = None,
    ) -> Any:
        return self._call(
            self._run.effect(
                name, args, key=key, fn=fn, reconcile=reconcile, effect_class=effect_class,
                tool_call_id=tool_call_id, lease_s=lease_s,
            )
        )  # fmt: skip

    def approval(self, action: str, args: Any = None) -> dict[str, Any]:
        return self._call(self._run.approval(action, args))

    def child(self, spec: AgentSpec, input: Any = None) -> Any:
        return self._call(self._run.child(spec, input))

    def now(self) -> dt.datetime:
        return self._call(self._run.now())

    def random(self) -> float:
        return self._call(self._run.random())

    def commit(self) -> None:
        self._call(self._run.commit())

    def as_recorded(self, value: Any) -> Any:
        """``value`` as the run's record gives it back (``RecordedRun.as_recorded``); unchanged on a
        run that records nothing here (the sandbox guest's, whose host records). Callable from any thread."""
        as_recorded = getattr(self._run, "as_recorded", None)
        return as_recorded(value) if as_recorded is not None else value


def sync_agent(fn: Callable[[SyncRun], Any]) -> AgentFn:
    """Wrap a blocking agent function so the runner can drive it."""

    @functools.wraps(fn)
    async def agent(run: Run) -> Any:
        return await asyncio.to_thread(fn, SyncRun(run, asyncio.get_running_loop()))

    return agent


def run_sync(url: str, spec: AgentSpec, input: Any = None, **kwargs: Any) -> RunResult:
    """Start a run and block until it ends (completed, failed or suspended)."""

    async def go() -> RunResult:
        async with await connect(url) as client:
            return await start_run(client, spec, input, **kwargs)

    return asyncio.run(go())


def resume_sync(url: str, spec: AgentSpec, run_id: str) -> RunResult:
    async def go() -> RunResult:
        async with await connect(url) as client:
            return await resume_run(client, spec, run_id)

    return asyncio.run(go())
