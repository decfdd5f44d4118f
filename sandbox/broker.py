"""The broker: the host side of the channel, answering one sandboxed agent for one re-run.

Each request from the guest becomes a call on the branch's host-side Run, which answers
from the record, from a stub, or by calling the real model or tool with the host's
credentials. Errors the agent is meant to see (a tool that failed, a denied approval)
go back over the channel; anything that ends the run (divergence, a budget, a
suspension, a broken protocol) propagates to the runner, which records it and kills the
container.

The guest proposes, the host decides. Every message is validated before use
(runledger.sandbox.channel: size, depth and values in one pass before the parse, encoding,
fields and their types: what the host spends on one request is bounded by its values); an effect
request names no key (the branch computes it from the tool's key function); model
parameters go through the branch's allowlist; every value and error text sent back is
scrubbed of the secrets the re-run resolved; every read and every write has a deadline
(``SandboxPolicy.io_timeout_s`` for a write, the re-run's wall-clock limit for all); the
re-run's caps on events, bytes and blobs are checked before each request, and its host CPU
(``runledger.cpu``: this broker's own steps, the tasks and worker threads it starts) before each
request and after each step, against a budget per request and one per re-run. A guest that
breaks any of it fails its branch (``SandboxViolationError``, reason ``sandbox``), never the
host process.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from runledger.cpu import CpuMeter, metered
from runledger.errors import ApprovalDeniedError, ChildFailedError, EffectFailedError, ToolFailedError
from runledger.sandbox.channel import MAX_VALUES, check_request, encode, read_message
from runledger.sandbox.containers import SandboxPolicy
from runledger.sandbox.errors import AgentFailedError, ChannelError, SandboxViolationError

# Errors an agent may catch and handle: forwarded to the guest instead of ending the run.
FORWARDED = (ToolFailedError, EffectFailedError, ApprovalDeniedError, ChildFailedError)
WALL_CLOCK = "the re-run exceeded its wall-clock limit"


class Broker:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        start: dict[str, Any],
        *,
        deadline: float,
        policy: SandboxPolicy | None = None,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.start = start
        self.deadline = deadline
        self.policy = policy or SandboxPolicy()
        self.requests = 0
        self.meter = CpuMeter()  # the host CPU spent for this guest (runledger.cpu)

    async def _read(self) -> dict[str, Any] | None:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise SandboxViolationError(WALL_CLOCK)
        try:
            return await asyncio.wait_for(read_message(self.reader, MAX_VALUES), timeout=remaining)
        except TimeoutError as exc:
            raise SandboxViolationError(WALL_CLOCK) from exc
        except ChannelError as exc:
            raise SandboxViolationError(f"malformed channel message: {exc}") from exc
        except (ConnectionError, OSError) as exc:
            return None if isinstance(exc, ConnectionResetError) else _raise(exc)

    async def _send(self, message: dict[str, Any]) -> None:
        """Write one reply, waiting for the guest to take it at most ``io_timeout_s`` (and never past
        the wall-clock deadline): a guest that sends requests and never reads the replies fills the
        socket's buffers, and an unbounded ``drain()`` would hold the worker's task forever."""
        remaining = self.deadline - time.monotonic()
        limit = min(self.policy.io_timeout_s, remaining)
        self.writer.write(encode(message))
        try:
            await asyncio.wait_for(self.writer.drain(), timeout=max(limit, 0.0))
        except TimeoutError as exc:
            if limit >= remaining:
                raise SandboxViolationError(WALL_CLOCK) from exc
            raise SandboxViolationError(
                f"the sandboxed agent did not read its replies within {self.policy.io_timeout_s:g}s"
            ) from exc
        except (ConnectionError, OSError) as exc:
            raise SandboxViolationError(f"channel error: {exc}") from exc

    async def greet(self, hello: dict[str, Any] | None) -> None:
        if hello is None:
            raise SandboxViolationError("the sandboxed agent exited before saying hello")
        try:
            ident, op = check_request(hello)
        except ChannelError as exc:
            raise SandboxViolationError(f"malformed channel message: {exc}") from exc
        if op != "hello":
            raise SandboxViolationError(f"expected hello, got {op!r}")
        await self._send({"id": ident, "ok": self.start})

    async def serve(self, run: Any, hello: dict[str, Any] | None) -> Any:
        """Answer the guest until it reports its outcome; return the agent's output. Every step of
        it, and of the tasks and worker threads it starts, is charged to ``meter``."""
        return await metered(self._serve(run, hello), self.meter)

    def check_cpu(self, before: float, op: str) -> None:
        """Raise SandboxViolationError when the request in hand (which started at ``before`` on the
        meter) or the re-run so far has cost the host more CPU than the policy allows. Called after
        a request is read and after its step, never inside a step: a budget never cuts an effect
        between claim and act (so one request may overrun by its own cost, which the message
        limits bound)."""
        used, p = self.meter.used, self.policy
        if used - before > p.max_request_cpu_s:
            raise SandboxViolationError(
                f"request {self.requests} ({op}) cost the host {used - before:.2f}s of CPU, over the budget of "
                f"{p.max_request_cpu_s:g}s a request (SandboxPolicy.max_request_cpu_s): the sandboxed agent makes "
                "the host work too hard; raise it if this re-run's requests really need more"
            )
        if used > p.max_host_cpu_s:
            raise SandboxViolationError(
                f"the re-run cost the host {used:.2f}s of CPU in {self.requests} requests, over its budget of "
                f"{p.max_host_cpu_s:g}s (SandboxPolicy.max_host_cpu_s): the sandboxed agent makes the host work "
                "too hard; raise it if this re-run really needs more"
            )

    async def _serve(self, run: Any, hello: dict[str, Any] | None) -> Any:
        await self.greet(hello)
        while True:
            before = self.meter.used
            message = await self._read()
            if message is None:
                raise SandboxViolationError("the sandboxed agent exited without reporting an outcome")
            try:
                ident, op = check_request(message)
            except ChannelError as exc:
                raise SandboxViolationError(f"malformed channel message: {exc}") from exc
            if op == "done":
                return message.get("output")
            if op == "failed":
                raise AgentFailedError(message["error"])
            if op == "hello":
                raise SandboxViolationError("malformed channel message: a second hello")
            self.check_cpu(before, op)  # its parse, and the re-run so far
            check_limits = getattr(run, "check_limits", None)
            if check_limits is not None:
                check_limits()  # before the step starts: a cap never cuts an effect between claim and act
            self.requests += 1
            try:
                reply = {"id": ident, "ok": _scrub(run, await self._dispatch(run, op, message))}
            except FORWARDED as exc:
                fields = {k: v for k, v in vars(exc).items() if isinstance(v, str | int | float | bool | None)}
                error = {"type": type(exc).__name__, "message": str(exc), "fields": fields}
                reply = {"id": ident, "error": _scrub(run, error)}
            self.check_cpu(before, op)  # the step done (recorded), its reply not sent
            await self._send(reply)

    async def _dispatch(self, run: Any, op: str, m: dict[str, Any]) -> Any:
        # The fields and their types were checked by check_request (runledger.sandbox.channel.FIELDS).
        try:
            if op == "model":
                return (await run.model(m["messages"], **(m.get("params") or {}))).model_dump()
            if op == "tool":
                return await run.tool(_text(m, "name"), m.get("args"), tool_call_id=m.get("tool_call_id"))
            if op == "effect":
                return await run.served_effect(_text(m, "name"), m.get("args"), tool_call_id=m.get("tool_call_id"))
            if op == "approval":
                return await run.approval(_text(m, "action"), m.get("args"))
            if op == "child":
                return await run.served_child(_text(m, "agent"), m.get("input"))
            if op == "now":
                return (await run.now()).isoformat()
            if op == "random":
                return await run.random()
        except TypeError as exc:  # keyword arguments from the guest that the SDK does not take
            raise SandboxViolationError(f"bad {op} request: {exc}") from exc
        raise SandboxViolationError(f"unexpected op {op!r}")


def _scrub(run: Any, value: Any) -> Any:
    """``value`` with every secret the re-run resolved replaced by its token (BranchRun.scrub)."""
    scrub = getattr(run, "scrub", None)
    return value if scrub is None else scrub(value)


def _text(message: dict[str, Any], field: str) -> str:
    value = message.get(field)
    if not isinstance(value, str) or not value or len(value) > 1000:
        raise SandboxViolationError(f"request field {field!r} must be a non-empty string of at most 1000 characters")
    return value


def _raise(exc: BaseException) -> Any:
    raise SandboxViolationError(f"channel error: {exc}") from exc
