"""The guest: what runs inside the sandbox container.

``python3 -m runledger.sandbox.guest /run/runledger/broker.sock [AGENT]`` imports the SDK and,
when the pool named one, loads the agent (``module:attribute``: its import and factory), so a
warm container has paid for both; then it connects to the broker, says hello and waits to be
given a re-run: the agent to load and its input (the loaded one is used only when the re-run
names the same agent; a failure to load it ahead is reported, as the re-run's failure, only
if the re-run then needs it). The agent function then runs
against ``RemoteRun``, whose every call is a request to the broker on the host,
which answers from the record, from a stub, or by calling the real model or tool
with the host's credentials. The guest holds no credentials and no network.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import os
import sys
import types
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import runledger.errors as ledger_errors
from runledger.sandbox.channel import MAX_LINE, encode, read_message
from runledger.sandbox.errors import RemoteError
from runledger.sdk.code_identity import code_hash

if TYPE_CHECKING:
    import datetime as dt

    from runledger.sdk.agent import AgentSpec
    from runledger.sdk.models import ModelResponse


def _rebuild_error(error: dict[str, Any]) -> Exception:
    cls = getattr(ledger_errors, str(error.get("type", "")), None)
    message = str(error.get("message", ""))
    if isinstance(cls, type) and issubclass(cls, ledger_errors.LedgerError):
        exc: Exception = cls.__new__(cls)
        Exception.__init__(exc, message)
        for key, value in (error.get("fields") or {}).items():
            setattr(exc, key, value)
        return exc
    return RemoteError(f"{error.get('type')}: {message}")


class RemoteRun:
    """The Run API inside the sandbox: each call is a request to the broker."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        start: dict[str, Any],
        response_type: type[ModelResponse] | None = None,
    ) -> None:
        self._reader = reader
        # The agent's model adapter's response type (an integration's subclass carries the framework's
        # own response): what the host's answer is rebuilt as, as a resume rebuilds it from the record.
        self._response_type = response_type
        self._writer = writer
        self._next_id = 1
        # One request at a time (the broker answers in order): calls the agent makes at once
        # (asyncio.gather) queue here in call order, the order the host numbers their steps in.
        self._one_at_a_time = asyncio.Lock()
        self.run_id: str = start["run_id"]
        self.agent: str = start.get("agent_name", "")
        self.input: Any = start.get("input")
        self.prompt: str = start.get("prompt", "")

    async def _call(self, op: str, **fields: Any) -> Any:
        async with self._one_at_a_time:
            ident = self._next_id
            self._next_id += 1
            self._writer.write(encode({"id": ident, "op": op, **fields}))
            await self._writer.drain()
            reply = await read_message(self._reader)
        if reply is None:
            raise SystemExit("the broker closed the channel")  # the re-run was ended on the host
        if reply.get("id") != ident:
            raise SystemExit(f"the broker answered {reply.get('id')} to request {ident}")
        if "error" in reply:
            raise _rebuild_error(reply["error"])
        return reply.get("ok")

    async def model(self, messages: list[dict[str, Any]], **params: Any) -> ModelResponse:
        from runledger.sdk.models import ModelResponse

        response_type = self._response_type or ModelResponse
        return response_type.model_validate(await self._call("model", messages=messages, params=params))

    async def tool(self, tool: Any, args: Any = None, *, fn: Any = None, tool_call_id: str | None = None) -> Any:
        name = tool if isinstance(tool, str) else tool.name
        return await self._call("tool", name=name, args=args, tool_call_id=tool_call_id)

    async def effect(
        self, name: str, args: Any, *, key: str, fn: Any = None, tool_call_id: str | None = None, **_: Any
    ) -> Any:
        """An effect step: the host computes its key (from the declared tool's key function over
        ``args``, or from the record), so ``key`` and ``fn`` stay here; the request names neither."""
        return await self._call("effect", name=name, args=args, tool_call_id=tool_call_id)

    async def approval(self, action: str, args: Any = None) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("approval", action=action, args=args)
        return result

    async def child(self, spec: AgentSpec, input: Any = None) -> Any:
        """A child run: the host answers it from the record by the child's agent name and input
        (a re-run never starts a child; runledger.sandbox.branch, ``BranchRun.served_child``)."""
        return await self._call("child", agent=spec.name, input=input)

    async def now(self) -> dt.datetime:
        import datetime as dt

        return dt.datetime.fromisoformat(await self._call("now"))

    async def random(self) -> float:
        return float(await self._call("random"))

    async def commit(self) -> None:
        """Nothing to wait for: the host records each step of a re-run before it answers it."""


NO_BROKER = 2  # serve's exit code when nothing answers at the socket path


def preload(agent: str) -> AgentSpec | None:
    """The agent ``agent`` names, loaded ahead of the re-run, or None if it cannot be loaded (the
    re-run that names it loads it again and reports the error as its outcome)."""
    return preload_report(agent)[0]


def preload_report(agent: str) -> tuple[AgentSpec | None, dict[str, Any]]:
    """The agent ``agent`` names, loaded ahead of the re-run (None if it cannot be), and what its hello
    says of it (``preloaded``): the agent, and either its ``agent_version`` as this guest computes
    it or the ``error`` that stopped it loading (``rerun --plan`` reads it: a candidate that cannot
    load in the image is named before anything is queued)."""
    from runledger.sdk.agent import load_agent

    try:
        spec = load_agent(agent)
        return spec, {"agent": agent, "agent_version": running_version(spec)}
    except BaseException as exc:  # an import that fails or exits: the guest must still say hello
        return None, {"agent": agent, "error": f"{type(exc).__name__}: {exc}"[:2000]}


def running_version(spec: AgentSpec) -> str:
    """The ``agent_version`` of the code this guest was given: the version it declares, else the hash
    of its import closure over the mounted code (runledger.sdk.code_identity)."""
    return spec.agent_version or code_hash(spec.fn)


def check_version(spec: AgentSpec, expected: str | None) -> None:
    """Raise RuntimeError unless the code given is the version the branch records (``expected``), by
    the same rule: a declared version with a declared version (its hash is not compared), a code hash
    with the hash of the mounted code."""
    if not expected:
        return
    if spec.agent_version is not None:
        if spec.agent_version != expected:
            raise RuntimeError(
                f"the mounted agent code declares version {spec.agent_version}, the run expects {expected}"
            )
        return
    actual = code_hash(spec.fn)
    if actual != expected:
        raise RuntimeError(f"the mounted agent code hashes to {actual}, the run expects {expected}")


async def _drive(spec: AgentSpec, run: RemoteRun, listings: list[dict[str, Any]] | None) -> Any:
    """Run the agent. Its tools listed from outside the code (an MCP server's, reached over stdio or
    HTTP) are declared from the listings the host sent (``tool_listings``, made on the host where the
    server is reachable): the guest lists nothing, having no network. Without them (a listing too
    large to send), the guest lists the source itself, as it did before."""
    from runledger.sdk.deferred_tools import declared_for_run

    spec = spec.from_record(listings or [])
    with declared_for_run(spec.restored):
        return await spec.fn(run)


async def serve(socket_path: str, agent: str = "") -> int:
    """Serve one re-run for the broker at ``socket_path``, with ``agent`` (``module:attribute``)
    loaded ahead if given; returns the guest's exit code."""
    loaded, report = preload_report(agent) if agent else (None, None)
    for _ in range(200):  # the broker creates the socket before starting us; allow for slow mounts
        try:
            reader, writer = await asyncio.open_unix_connection(socket_path, limit=MAX_LINE)
            break
        except OSError:
            await asyncio.sleep(0.05)
    else:
        return NO_BROKER
    writer.write(encode({"id": 0, "op": "hello", **({"preloaded": report} if report is not None else {})}))
    await writer.drain()
    hello = await read_message(reader)
    if hello is None or "ok" not in hello:
        return 0  # released from the pool without work
    start = hello["ok"]
    from runledger.sdk.agent import load_agent

    try:
        spec = loaded if loaded is not None and start["agent"] == agent else load_agent(start["agent"])
        check_version(spec, start.get("agent_version"))
        run = RemoteRun(reader, writer, start, getattr(spec.model, "response_type", None))
        output = await _drive(spec, run, start.get("tool_listings"))
        message = {"id": -1, "op": "done", "output": output}
    except SystemExit:
        return 1
    except BaseException as exc:  # the agent's failure is the re-run's outcome, reported to the host
        import traceback

        message = {
            "id": -1,
            "op": "failed",
            "error": {"type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()},
        }
    try:
        writer.write(encode(message))
    except (TypeError, ValueError) as exc:
        writer.write(encode({"id": -1, "op": "failed", "error": {"type": "TypeError", "message": str(exc)}}))
    await writer.drain()
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()  # everything written has left the process
    return 0


class _RunOnFirstUse(types.ModuleType):
    """Stands for a module not run yet: the first attribute read that it lacks imports the real one
    (``importlib.util.LazyLoader`` does not serve: on 3.11 the import statement itself reads the
    module's ``__spec__``, which runs it) and copies its namespace in, so a reference taken to this
    stand-in works as one to the module."""

    def __getattr__(self, attr: str) -> Any:
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        real = importlib.import_module(self.__name__)
        self.__dict__.update(real.__dict__)
        return getattr(real, attr)


@contextlib.contextmanager
def _deferred(name: str) -> Iterator[None]:
    """Within: ``import name`` (a submodule) gives a stand-in that runs the module when first used.
    On leaving, the import system forgets the stand-in (if it was not used): later imports are real."""
    if name in sys.modules:
        yield
        return
    parent, _, child = name.rpartition(".")
    stand_in = _RunOnFirstUse(name)
    sys.modules[name] = stand_in
    setattr(sys.modules[parent], child, stand_in)
    try:
        yield
    finally:
        if sys.modules.get(name) is stand_in:
            del sys.modules[name]
        if getattr(sys.modules[parent], child, None) is stand_in:
            delattr(sys.modules[parent], child)


@contextlib.contextmanager
def lean_start() -> Iterator[None]:
    """The guest's own imports (the SDK: pydantic and the spec's models) at less CPU, paid once per
    container. Inside: pydantic loads no plugins (its scan reads every installed distribution's
    metadata; the image holds no plugin, and none is to observe the guest's own models), which leaves
    ``importlib.metadata`` (with email, zipfile, csv, ...: about a tenth of the guest's imports) unused:
    it is loaded lazily, when something first reads it; and the cyclic garbage collector waits (imports
    make long-lived objects, not garbage), then freezes what they made, so the run's collections skip it.
    The environment is as it was on leaving (the agent sees the one the container was given)."""
    saved = os.environ.get(PLUGINS_VARIABLE)
    os.environ[PLUGINS_VARIABLE] = "__all__"
    gc.disable()
    try:
        with _deferred("importlib.metadata"):
            yield
    finally:
        gc.freeze()
        gc.enable()
        if saved is None:
            os.environ.pop(PLUGINS_VARIABLE, None)
        else:
            os.environ[PLUGINS_VARIABLE] = saved


PLUGINS_VARIABLE = "PYDANTIC_DISABLE_PLUGINS"


def main() -> None:
    socket_path = sys.argv[1] if len(sys.argv) > 1 else "/run/runledger/broker.sock"
    with lean_start():
        importlib.import_module("runledger.sdk.agent")  # what loading any agent needs: before the agent
    code = asyncio.run(serve(socket_path, sys.argv[2] if len(sys.argv) > 2 else ""))
    if code == NO_BROKER:
        # The guest is a program of its own (the container's command), and this is its main: what
        # it has to say goes to its own stderr. Nothing configures logging in the container, and
        # the host sees the exit code either way (the sandbox's description names it).
        print(f"guest: no broker at {socket_path}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    # Exit without finalizing the interpreter: the outcome was sent and the container is removed
    # next, so tearing down every module and object (a sixth of the guest's CPU here) buys nothing.
    os._exit(code)


if __name__ == "__main__":
    main()


if TYPE_CHECKING:  # mypy checks that RemoteRun is a Run (runledger.sdk.protocol); nothing runs here
    from runledger.sdk.protocol import Run

    def _is_a_run(run: RemoteRun) -> Run:
        return run
