"""MCP tools as the steps of a run: a recorded MCP client session.

An agent reaches an MCP server (the ``mcp`` package, 1.x from 1.24 or 2.x) through an ``McpServer`` (how to connect:
``McpServer.stdio(command, args)`` spawns the server, ``McpServer.http(url)`` speaks streamable
HTTP to a running one). ``server.tools()`` declares the server's tools, each as a runledger ``Tool``,
the way its annotations say, from one listing made when the spec first needs them (``McpTools``):

- ``readOnlyHint`` true: a ``read`` tool (``tool.called``; run again live by a live re-run that
  names it with ``--live-tool``);
- anything else is an effect: ``irreversible`` when ``destructiveHint`` is true or absent (MCP's
  default), else ``write``. Its idempotency key comes from the call (``call_tool(..., key=...)``)
  or from the key function given for the tool (``tools(keys={"refund": lambda a: ...})``); a call
  with neither is refused before anything is claimed. Idempotent (``idempotentHint``) or not, the
  tool changes the world, so it is claimed, acted at most once, and a claim without an outcome is
  in doubt at resume (``EffectInDoubtError``) unless ``reconcile`` is given for it.

``effects={"name": "read"}`` overrides the class of a tool whose annotations are wrong or absent
(MCP's annotations are hints a server may get wrong). Put the tools on the spec
(``AgentSpec(..., tools=server.tools(...))``): each one's name, class and input schema is then in
the run's ``tool_schema_hashes``, so a server whose tools changed (a new schema, a tool that became
destructive) is a version change, and ``resume`` refuses it (``VersionMismatchError``).

When the server is needed: a run's start lists it, and records the listing (``tools/list`` as
JSON, in ``run.started``'s ``tool_listings``) beside the version tuple it backs. A resume declares
the tools from that record and lists nothing: a run whose calls left are all recorded (it completes,
or suspends for an approval, without a live call to the server), like a completed one, resumes with
the server stopped. Before its first live call to the server (a tool call, a reconcile), and before
anything of that call is recorded, the resume lists the server once: a server whose tools changed is
refused there as a version change (``VersionMismatchError``), one that cannot be listed with a
ConfigurationError (``cannot list the tools of the MCP server ...``); either way the run is left as
it was, for a resume once the server is back as recorded (runledger.sdk.deferred_tools). A run
recorded before listings were has none, and its resume lists the server at its version check.

In the agent, ``async with server.session(run) as session`` gives a ``RecordedSession``:
``await session.call_tool(name, arguments)`` is ``run.tool`` of the declared tool and returns the
SDK's ``CallToolResult``; ``await session.list_tools()`` returns the listing the run's tools were
declared from, as its record keeps it (the one the version tuple pins). Live, the call goes to the
server over a connection the session opens on its first live call (a replayed call never connects);
on resume, a recorded call is answered from the record and a committed effect is served from its
key; in a sandboxed re-run the agent's calls go to the host, which calls the server in ``live`` mode
for a read tool named live, serves effects from the record in ``redrive`` and stubs them
(``{"simulated": true, ...}`` as structured content) in ``live``. The effect's key is also sent to
the server in the call's ``_meta`` (``io.runledger/idempotency-key``), for a server that honours one.

What is recorded of a call: its arguments, and the ``CallToolResult`` as JSON (content, structured
content, ``isError``). A tool that answers ``isError`` has still run: the result is recorded as
its output (an effect is committed with it), as MCP hands tool errors to the model. A protocol or
connection error is the step's failure.

Rejected: recording the session's JSON-RPC messages (the record would hold transport framing, not
steps that the fold, ``show`` and the projection read) and recording ``list_tools`` as a step (the
listing is the run's, recorded once at its start beside the hashes it backs, and a live call first
checks the server against it); listing where the spec is built (every resume then needed the server,
even of a run with nothing left to do); listing at every resume that drives the agent (a run whose
calls left were all recorded needed the server). Not covered: resources, prompts, sampling and
elicitation callbacks, the blocking ``SyncRun``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime
import importlib.metadata
import json
import logging
import os
import sys
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from runledger import require_extra

require_extra("mcp", "runledger.integrations.mcp")

import mcp  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from runledger import (  # noqa: E402
    ConfigurationError,
    DeferredTools,
    EffectClass,
    EffectContext,
    Run,
    SyncRun,
    Tool,
    current_run_id,
    runledger_home,
    server_of,
)

logger = logging.getLogger(__name__)

__all__ = ["KEY_META", "McpServer", "McpTools", "RecordedSession", "effect_class_of"]

# The name under which an effect's idempotency key travels in a call's ``_meta``.
KEY_META = "io.runledger/idempotency-key"
KeyFn = Callable[[Any], str]
# Where a stdio server's stderr goes when ``McpServer.stdio(stderr=...)`` does not say: a file path
# (appended to), or ``-`` for this process's own stderr. Unset: ``server_log_path(run id)``.
STDERR_ENV = "RUNLEDGER_MCP_STDERR"
# The major version of the installed ``mcp`` SDK: the extra accepts 1.x (from 1.24, the first with
# ``streamable_http_client``) and 2.x; the two differ in field names (see ``_wire``) and timeouts.
MCP_MAJOR = int(importlib.metadata.version("mcp").split(".")[0])


def effect_class_of(tool: mcp.types.Tool) -> EffectClass:
    """The runledger class of an MCP tool by its annotations: ``read`` when ``readOnlyHint`` is
    true; otherwise an effect, ``irreversible`` unless ``destructiveHint`` is false (MCP's default
    for it is true), then ``write``."""
    hints = _wire(tool.annotations) if tool.annotations is not None else {}
    if hints.get("readOnlyHint"):
        return "read"
    if hints.get("destructiveHint") is False:
        return "write"
    return "irreversible"


def _wire(model: Any) -> dict[str, Any]:
    """An SDK object as MCP's JSON (camelCase): the same under mcp 1.x, whose types name their fields
    as the wire does, and 2.x, whose fields are snake_case with the wire names as aliases."""
    dumped: dict[str, Any] = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped


@dataclass
class McpServer:
    """How to reach one MCP server, and the tools declared from its listing (``tools``).

    Build one with ``McpServer.stdio`` or ``McpServer.http``. Connections are opened per use (a
    listing, a session's first live call, a call made outside a session), never held by this
    object, so one ``McpServer`` serves every run and event loop of a process."""

    stdio_params: StdioServerParameters | None = None
    url: str | None = None
    read_timeout_s: float | None = 60.0
    # A stdio server's stderr: a file path (appended to), an open file (``sys.stderr``), or None for
    # ``$RUNLEDGER_MCP_STDERR``, else a log file of the run (``server_log_path``).
    stderr: str | os.PathLike[str] | TextIO | None = None
    # The tools of the last ``tools()`` call: what this server's sessions call, as the run they record
    # declared them (``McpTools.in_this_run``: from the run's record on resume).
    in_use: McpTools | None = field(default=None, init=False, repr=False)
    # What the last connection's initialisation told (the protocol version, an HTTP session's id): the
    # facts a tool call records of its session (``tool.called``'s ``via``).
    _session: dict[str, str] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stderr: str | os.PathLike[str] | TextIO | None = None,
    ) -> McpServer:
        """A server spawned as ``command args`` and spoken to over its stdin and stdout (``env`` is
        added to the MCP SDK's small default environment, not the whole of this process's).

        ``stderr``, where the server's own stderr (its log lines) goes: a file path, appended to; an
        open file (``sys.stderr``: this process's); None: the path ``$RUNLEDGER_MCP_STDERR`` names
        (``-``: this process's stderr), else the log file of the run that spawns it,
        ``server_log_path(run_id)``, named once in this process's log (the CLI shows it)."""
        params = StdioServerParameters(command=command, args=list(args), env=dict(env) if env else None, cwd=cwd)
        return cls(stdio_params=params, stderr=stderr)

    @classmethod
    def http(cls, url: str) -> McpServer:
        """A running server at ``url`` (its streamable HTTP endpoint, e.g. ``http://host:8000/mcp``)."""
        return cls(url=url)

    def __post_init__(self) -> None:
        if (self.stdio_params is None) == (self.url is None):
            raise ConfigurationError("an McpServer is reached over stdio or over HTTP: McpServer.stdio or .http")

    @property
    def where(self) -> str:
        if self.url is not None:
            return self.url
        assert self.stdio_params is not None
        return " ".join([self.stdio_params.command, *self.stdio_params.args])

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[mcp.ClientSession]:
        """An initialised ``mcp.ClientSession`` with the server, closed (and a spawned server
        stopped) on leaving."""
        timeout = _read_timeout(self.read_timeout_s)
        with contextlib.ExitStack() as files:
            if self.url is not None:
                transport = streamable_http_client(self.url)
            else:
                transport = stdio_client(self._stdio(), errlog=self._errlog(files))
            async with transport as streams, mcp.ClientSession(streams[0], streams[1], timeout) as session:
                initialized = await session.initialize()
                self._session = {"protocol_version": str(_wire(initialized)["protocolVersion"])}
                session_id = streams[2]() if len(streams) > 2 and callable(streams[2]) else None
                if session_id:
                    self._session["session_id"] = str(session_id)
                yield session

    def _errlog(self, files: contextlib.ExitStack) -> TextIO:
        """Where a server spawned now writes its stderr (``stdio``'s ``stderr`` says), open."""
        where = self.stderr if self.stderr is not None else os.environ.get(STDERR_ENV) or None
        if where == "-":
            return sys.stderr
        if where is not None and not isinstance(where, (str, os.PathLike)):
            return where
        path = Path(where) if where is not None else server_log_path(current_run_id())
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            log = files.enter_context(open(path, "a", encoding="utf-8"))  # noqa: SIM115 - closed by the stack
        except OSError as exc:
            raise ConfigurationError(
                f"cannot write the stderr of the MCP server {self.where} to {path}: {exc}. Give another file "
                f"(McpServer.stdio(..., stderr=PATH) or ${STDERR_ENV}=PATH; - for this process's stderr)"
            ) from exc
        _name_once(path, self.where)
        return log

    def via(self) -> dict[str, Any]:
        """What a call of this server's tools records of how it went (``tool.called``'s ``via``), in the
        terms of OpenTelemetry's MCP conventions: the method (``tools/call``), the transport (``pipe``
        for stdio, ``tcp`` for HTTP), the server's host and port (HTTP), and the last session's
        protocol version and id where it gave them. The JSON-RPC request id is the MCP SDK's own and
        is not recorded."""
        facts: dict[str, Any] = {"protocol": "mcp", "method": "tools/call",
                                 "transport": "tcp" if self.url is not None else "pipe", **self._session}  # fmt: skip
        server = server_of(self.url) if self.url is not None else None
        if server is not None:
            facts["server"] = server.model_dump(exclude_none=True)
        return facts

    def _stdio(self) -> StdioServerParameters:
        assert self.stdio_params is not None
        return self.stdio_params

    async def alist_tools(self) -> mcp.types.ListToolsResult:
        """The server's whole listing (every page), asked of it now."""
        async with self.connect() as session:
            result = await session.list_tools()
            tools = list(result.tools)
            while cursor := _wire(result).get("nextCursor"):
                result = await session.list_tools(params=mcp.types.PaginatedRequestParams(cursor=cursor))
                tools.extend(result.tools)
        return mcp.types.ListToolsResult(tools=tools)

    def tools(
        self,
        *,
        keys: Mapping[str, KeyFn] | None = None,
        effects: Mapping[str, EffectClass] | None = None,
        reconcile: Mapping[str, Callable[[str], Any]] | None = None,
        lease_s: float | None = None,
    ) -> McpTools:
        """The server's tools, to put on the agent's spec: listed when the spec first needs them
        (a run's start: ``McpTools``), never here; a resume declares them from the listing its run
        recorded, and lists the server only before a live call to it. Each is declared as a runledger
        ``Tool``: ``effect_class_of`` its annotations unless ``effects`` names its class, ``keys`` its
        key function, ``reconcile`` its reconcile function (an effect's), its input schema as given.
        Where they are first needed, ConfigurationError names the server when it cannot be listed,
        and a key, class or reconcile function naming a tool it does not have."""
        return McpTools(self, keys=keys, effects=effects, reconcile=reconcile, lease_s=lease_s)

    def list_now(self) -> mcp.types.ListToolsResult:
        """The server's listing, asked of it now (blocking: a thread of its own runs the listing,
        so this works inside a running event loop too). Raises ConfigurationError naming the
        server when it cannot be listed."""
        outcome: dict[str, Any] = {}

        def list_in_thread() -> None:
            try:
                outcome["listing"] = asyncio.run(self.alist_tools())
            except BaseException as exc:  # handed to the caller's thread
                outcome["error"] = exc

        # In this context: the run being started names the server's log file (``server_log_path``).
        context = contextvars.copy_context()
        thread = threading.Thread(target=context.run, args=(list_in_thread,), name="runledger-mcp-list", daemon=True)
        thread.start()
        thread.join()
        if "error" in outcome:
            error = outcome["error"]
            raise ConfigurationError(f"cannot list the tools of the MCP server {self.where}: {_leaf(error)}") from error
        listing: mcp.types.ListToolsResult = outcome["listing"]
        return listing

    def declare(
        self,
        listing: mcp.types.ListToolsResult,
        *,
        keys: Mapping[str, KeyFn] | None = None,
        effects: Mapping[str, EffectClass] | None = None,
        reconcile: Mapping[str, Callable[[str], Any]] | None = None,
        lease_s: float | None = None,
    ) -> list[Tool]:
        """The runledger tools of ``listing`` (what ``tools`` does with a listing, live or recorded)."""
        names = {t.name for t in listing.tools}
        for what, given in (("keys", keys), ("effects", effects), ("reconcile", reconcile)):
            unknown = sorted(set(given or {}) - names)
            if unknown:
                raise ConfigurationError(
                    f"{what} names {', '.join(unknown)}, which the MCP server {self.where} does not list "
                    f"(it lists {', '.join(sorted(names)) or 'no tools'})"
                )
        declared = [
            self._declared_tool(t, (effects or {}).get(t.name), (keys or {}).get(t.name),
                                (reconcile or {}).get(t.name), lease_s)
            for t in listing.tools
        ]  # fmt: skip
        return declared

    def _declared_tool(
        self,
        listed: mcp.types.Tool,
        effect: EffectClass | None,
        key: KeyFn | None,
        reconcile: Callable[[str], Any] | None,
        lease_s: float | None,
    ) -> Tool:
        name = listed.name
        effect_class = effect or effect_class_of(listed)

        async def call(args: dict[str, Any], ctx: EffectContext | None = None) -> dict[str, Any]:
            return await self._call(name, args, ctx)

        if effect_class != "read" and key is None:
            key = _missing_key(name, self.where)
        return Tool(
            name,
            call,
            effect_class=effect_class,
            key=key if effect_class != "read" else None,
            reconcile=reconcile if effect_class != "read" else None,
            schema=dict(_wire(listed)["inputSchema"]),
            description=listed.description or "",
            lease_s=lease_s,
            via=self.via,
        )

    async def _call(self, name: str, args: dict[str, Any], ctx: EffectContext | None) -> dict[str, Any]:
        """Call the tool on the server: over the open session of this task's ``RecordedSession``,
        else over a connection of its own (a re-run's host calling a tool). Returns the result as JSON."""
        meta = {KEY_META: ctx.key} if ctx is not None else None
        recorded = (_OPEN.get() or {}).get(id(self))
        if recorded is not None:
            session = await recorded.live_session()
            result = await session.call_tool(name, args or {}, meta=meta)  # type: ignore[arg-type]
        else:
            async with self.connect() as session:
                result = await session.call_tool(name, args or {}, meta=meta)  # type: ignore[arg-type]
        return _wire(result)

    def session(self, run: Run) -> RecordedSession:
        """The recorded session of ``run`` with this server (``async with server.session(run) as s``)."""
        return RecordedSession(run, self)


class McpTools(DeferredTools):
    """The tools of an ``McpServer`` as its ``tools()`` call asked for them, listed and declared
    on first use (``DeferredTools``): on the spec, that is a run's start, never a resume. The
    listing (``tools/list``, as JSON) is recorded in the run's ``run.started``; a resume declares
    the tools from it and lists the server only before its first live call to one of them
    (runledger.sdk.deferred_tools). Reads as the list of declared ``Tool``s."""

    source = "mcp"

    def __init__(
        self,
        server: McpServer,
        *,
        keys: Mapping[str, KeyFn] | None = None,
        effects: Mapping[str, EffectClass] | None = None,
        reconcile: Mapping[str, Callable[[str], Any]] | None = None,
        lease_s: float | None = None,
    ) -> None:
        self.server = server
        self._options: dict[str, Any] = {"keys": keys, "effects": effects, "reconcile": reconcile, "lease_s": lease_s}
        server.in_use = self

    def list_source(self) -> dict[str, Any]:
        """The server's listing, asked of it now, as JSON (``ListToolsResult``'s, by alias)."""
        return _wire(self.server.list_now())

    def declare_listed(self, listing: Any) -> list[Tool]:
        return self.server.declare(mcp.types.ListToolsResult.model_validate(listing), **self._options)

    def __repr__(self) -> str:
        state = ", ".join(t.name for t in self) if self.is_declared else "not listed yet"
        return f"<McpTools of {self.server.where}: {state}>"


def server_log_path(run_id: str | None) -> Path:
    """The file a stdio server's stderr is appended to unless told otherwise: ``logs/mcp/<run id>.log``
    under the runledger home (``$RUNLEDGER_HOME``, else ``~/.runledger``), one file a run (its start,
    resumes and the listings they make); ``process-<pid>.log`` for a server spawned outside a run (a
    re-run's host calling a tool)."""
    return runledger_home() / "logs" / "mcp" / (f"{run_id}.log" if run_id else f"process-{os.getpid()}.log")


_NAMED: set[Path] = set()  # the log files this process has named (``_name_once``)
_NAMING = threading.Lock()


def _name_once(path: Path, where: str) -> None:
    """Say, once a process, where the stderr of stdio servers goes (INFO: the CLI prints it)."""
    with _NAMING:
        if path in _NAMED:
            return
        _NAMED.add(path)
    logger.info("the MCP server %s logs to %s (McpServer.stdio(stderr=...) or $%s sends it elsewhere)",
                where, path, STDERR_ENV)  # fmt: skip


def _read_timeout(seconds: float | None) -> Any:
    """``ClientSession``'s read timeout: seconds (a float) under mcp 2.x, a ``timedelta`` under 1.x."""
    if seconds is None or MCP_MAJOR >= 2:
        return seconds
    return datetime.timedelta(seconds=seconds)


def _leaf(exc: BaseException) -> str:
    """What went wrong, out of the task groups the MCP SDK's transports wrap errors in."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


def _missing_key(name: str, where: str) -> KeyFn:
    def no_key(args: Any) -> str:
        raise ConfigurationError(
            f"MCP tool {name!r} of {where} is an effect and has no idempotency key: give it in the call "
            f"(session.call_tool({name!r}, arguments, key=...)) or a key function "
            f"(server.tools(keys={{{name!r}: lambda args: ...}}))"
        )

    return no_key


# The RecordedSession open in this task for each server (by id): its tools' calls go over its connection.
_OPEN: ContextVar[Mapping[int, RecordedSession] | None] = ContextVar("runledger_mcp_sessions", default=None)


def _as_result(output: Any) -> mcp.types.CallToolResult:
    """The SDK's result for a recorded output. A live re-run's stub of an effect (``{"simulated":
    true, ...}``) is no ``CallToolResult``: it comes back as one whose structured content (and text)
    is the marker, so the agent sees it for what it is."""
    if isinstance(output, dict) and "content" in output:
        return mcp.types.CallToolResult.model_validate(output)
    text = json.dumps(output, sort_keys=True)
    structured = output if isinstance(output, dict) else {"result": output}
    return mcp.types.CallToolResult.model_validate(
        {"content": [{"type": "text", "text": text}], "structuredContent": structured}
    )


class RecordedSession:
    """An MCP client session whose tool calls are steps of ``run`` (made by ``McpServer.session``).

    Opens no connection until a call runs live; then one, held by a task of its own (the MCP
    SDK's transports must be entered and left in one task) until the session is left."""

    def __init__(self, run: Run, server: McpServer) -> None:
        if isinstance(run, SyncRun):
            raise ConfigurationError("a RecordedSession records into the async Run (async agent code), not a SyncRun")
        self.run = run
        self.server = server
        self._token: Token[Mapping[int, RecordedSession] | None] | None = None
        self._owner: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[mcp.ClientSession] | None = None
        self._closing = asyncio.Event()
        self._opening = asyncio.Lock()

    async def __aenter__(self) -> RecordedSession:
        self._token = _OPEN.set({**(_OPEN.get() or {}), id(self.server): self})
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._token is not None:
            _OPEN.reset(self._token)
            self._token = None
        await self.aclose()

    async def aclose(self) -> None:
        """Close the live connection, if one was opened."""
        self._closing.set()
        if self._owner is not None:
            with contextlib.suppress(Exception):
                await self._owner
            self._owner = None

    async def live_session(self) -> mcp.ClientSession:
        """The connection live calls use, opened on first use."""
        async with self._opening:
            if self._ready is None:
                self._ready = asyncio.get_running_loop().create_future()
                self._owner = asyncio.ensure_future(self._hold(self._ready))
        return await asyncio.shield(self._ready)

    async def _hold(self, ready: asyncio.Future[mcp.ClientSession]) -> None:
        try:
            async with self.server.connect() as session:
                ready.set_result(session)
                await self._closing.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(ConfigurationError(f"cannot connect to the MCP server {self.server.where}: {exc}"))
            raise

    def _tools(self) -> DeferredTools:
        """The server's tools as this run declared them: listed at its start, from its record on resume."""
        if self.server.in_use is None:
            raise ConfigurationError(
                f"the tools of the MCP server {self.server.where} were never declared: build the agent's spec "
                "with tools=server.tools(...)"
            )
        return self.server.in_use.in_this_run()

    async def list_tools(self) -> mcp.types.ListToolsResult:
        """The listing the run's tools were declared from (``McpServer.tools``), as the run's record
        keeps it (``run.started``'s ``tool_listings``): the same live and on resume, no step and no
        connection (at a run's start, the listing its spec made)."""
        return mcp.types.ListToolsResult.model_validate(self._tools().listing())

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        key: str | None = None,
        tool_call_id: str | None = None,
    ) -> mcp.types.CallToolResult:
        """Call the server's tool ``name`` as a step of the run (``run.tool``; an effect's key from
        ``key`` when given, else from the tool's key function) and return its ``CallToolResult``,
        live or as recorded. ``tool_call_id``: the model's id of this call, when a model asked for it.

        Raises ConfigurationError for a tool the spec does not declare, or a ``key`` for a read
        tool; ToolFailedError when the call failed (recorded), and what ``run.tool`` raises."""
        tools = {t.name: t for t in self._tools()}
        declared = tools.get(name)
        if declared is None:
            raise ConfigurationError(
                f"MCP tool {name!r} is not among the declared tools of {self.server.where} "
                f"({', '.join(sorted(tools)) or 'it lists none'})"
            )
        args = dict(arguments or {})
        if key is None:
            output = await self.run.tool(declared, args, tool_call_id=tool_call_id)
        elif declared.effect_class == "read":
            raise ConfigurationError(f"MCP tool {name!r} is a read tool: it takes no idempotency key")
        else:
            output = await self.run.effect(
                name, args, key=key, fn=declared.call, reconcile=declared.reconcile,
                effect_class=declared.effect_class, tool_call_id=tool_call_id, lease_s=declared.lease_s,
            )  # fmt: skip
        return _as_result(output)
