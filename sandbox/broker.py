"""The broker: the host side of the channel, answering one sandboxed agent for one re-run.

Each request from the guest becomes a call on the branch's host-side Run, which answers
from the record, from a stub, or by calling the real model or tool with the host's
credentials. Errors the agent is meant to see (a tool that failed, a denied approval)
go back over the channel; anything that ends the run (divergence, a budget, a
suspension, a broken protocol) propagates to the runner, which records it and kills the
container. The guest is untrusted: every message is validated, every wait bounded.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from runledger.errors import ApprovalDeniedError, ChildFailedError, EffectFailedError, ToolFailedError
from runledger.sandbox.channel import check_request, encode, read_message
from runledger.sandbox.errors import AgentFailedError, ChannelError, SandboxViolation

# Errors an agent may catch and handle: forwarded to the guest instead of ending the run.
FORWARDED = (ToolFailedError, EffectFailedError, ApprovalDeniedError, ChildFailedError)


class Broker:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        start: dict[str, Any],
        *,
        deadline: float,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.start = start
        self.deadline = deadline
        self.requests = 0

    async def _read(self) -> dict[str, Any] | None:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise SandboxViolation("the re-run exceeded its wall-clock limit")
        try:
            return await asyncio.wait_for(read_message(self.reader), timeout=remaining)
        except TimeoutError as exc:
            raise SandboxViolation("the re-run exceeded its wall-clock limit") from exc
        except ChannelError as exc:
            raise SandboxViolation(f"malformed channel message: {exc}") from exc
        except (ConnectionError, OSError) as exc:
            return None if isinstance(exc, ConnectionResetError) else _raise(exc)

    async def _send(self, message: dict[str, Any]) -> None:
        self.writer.write(encode(message))
        await self.writer.drain()

    async def greet(self, hello: dict[str, Any] | None) -> None:
        if hello is None:
            raise SandboxViolation("the sandboxed agent exited before saying hello")
        ident, op = check_request(hello)
        if op != "hello":
            raise SandboxViolation(f"expected hello, got {op!r}")
        await self._send({"id": ident, "ok": self.start})

    async def serve(self, run: Any, hello: dict[str, Any] | None) -> Any:
        """Answer the guest until it reports its outcome; return the agent's output."""
        await self.greet(hello)
        while True:
            message = await self._read()
            if message is None:
                raise SandboxViolation("the sandboxed agent exited without reporting an outcome")
            try:
                ident, op = check_request(message)
            except ChannelError as exc:
                raise SandboxViolation(f"malformed channel message: {exc}") from exc
            if op == "done":
                return message.get("output")
            if op == "failed":
                error = message.get("error")
                raise AgentFailedError(error if isinstance(error, dict) else {"message": repr(error)})
            self.requests += 1
            try:
                result = await self._dispatch(run, op, message)
            except FORWARDED as exc:
                fields = {k: v for k, v in vars(exc).items() if isinstance(v, str | int | float | bool | None)}
                await self._send({"id": ident, "error": {"type": type(exc).__name__, "message": str(exc),
                                                         "fields": fields}})  # fmt: skip
                continue
            await self._send({"id": ident, "ok": result})

    async def _dispatch(self, run: Any, op: str, m: dict[str, Any]) -> Any:
        try:
            if op == "model":
                messages, params = m.get("messages"), m.get("params") or {}
                if not isinstance(messages, list) or not isinstance(params, dict):
                    raise SandboxViolation("model request needs messages (a list) and params (an object)")
                return (await run.model(messages, **params)).model_dump()
            if op == "tool":
                call_id = m.get("tool_call_id")
                if call_id is not None and not isinstance(call_id, str):
                    raise SandboxViolation("tool_call_id must be a string")
                return await run.tool(_text(m, "name"), m.get("args"), tool_call_id=call_id)
            if op == "effect":
                return await run.effect(_text(m, "name"), m.get("args"), key=_text(m, "key"))
            if op == "approval":
                return await run.approval(_text(m, "action"), m.get("args"))
            if op == "child":
                return await run.served_child(_text(m, "agent"), m.get("input"))
            if op == "now":
                return (await run.now()).isoformat()
            if op == "random":
                return await run.random()
        except TypeError as exc:  # keyword arguments from the guest that the SDK does not take
            raise SandboxViolation(f"bad {op} request: {exc}") from exc
        raise SandboxViolation(f"unexpected op {op!r}")


def _text(message: dict[str, Any], field: str) -> str:
    value = message.get(field)
    if not isinstance(value, str) or not value or len(value) > 1000:
        raise SandboxViolation(f"request field {field!r} must be a non-empty string")
    return value


def _raise(exc: BaseException) -> Any:
    raise SandboxViolation(f"channel error: {exc}") from exc
