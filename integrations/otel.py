"""OpenTelemetry export: every recorded run as one OTLP trace, in the GenAI semantic conventions.

A run becomes a trace: a root span for the run (``invoke_agent <agent>``) and a child span per
step, each laid out from what the record holds (the step's own start and duration, so parallel
steps overlap as they ran). Model calls are ``chat <model>`` spans with ``gen_ai.request.model``
and ``gen_ai.usage.input_tokens`` / ``output_tokens`` summed over the step's recorded attempts;
tool calls and effects are ``execute_tool <tool>`` spans with ``gen_ai.tool.name`` and, where it is
known, ``gen_ai.tool.call.id`` (recorded with an effect, else the matching call of the model turn
before the step); effects add their idempotency key and state (``runledger.effect.*``), approvals
their request and decision (``runledger.approval.*``), child runs are ``invoke_agent`` spans
linked to the child's trace. A branch's root span links to its parent run's root span
(``run.forked``); a child run's root span links to the parent's step that started it.

Ids are derived, never drawn: the trace id from the run id, a span id from the run id and the
step (``trace_id_of``, ``span_id_of``). Exporting a run twice sends the same ids, so a receiver
that keys spans by id holds each once; and a run's links to its parent or children need nothing
read from those runs.

Content (model messages, tool arguments and results, error messages) is left out unless asked
for (``content=True``, as the GenAI conventions make it opt-in), and then exported only as the
run's capture policy recorded it: redacted where the run redacts, never where the run keeps only
hashes, and only what this connection could open with the run's key. A value that stayed sealed,
hashed or stored by reference is left out, never exported as what it stands for.

Rejected: starting spans with the SDK's tracer (it draws ids at random and stamps the export's
clock, so a second export would duplicate every span, and overlapping parallel steps would need
their recorded times re-applied anyway); a custom ``IdGenerator`` fed the next id before each
``start_span`` (order-dependent state in a global provider). The spans are built as the SDK's
``ReadableSpan`` from the record and handed to its OTLP/HTTP exporter directly: no provider, no
batching processor, nothing global.
"""

from __future__ import annotations

from runledger import require_extra

require_extra("otel", "runledger.integrations.otel")

# ruff: noqa: E402  (the check above must run before OpenTelemetry is imported)

import asyncio
import datetime as dt
import hashlib
import json
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event as SpanEvent
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from runledger import (
    Checkpoint,
    ConfigurationError,
    Event,
    LedgerClient,
    LedgerError,
    RunLog,
    StepRecord,
    fold,
    follow_events,
    is_placeholder,
    load_run,
)
from runledger.integrations.otel_semconv import (
    FALLBACK_PROVIDER,
    SCHEMA_URL,
    call_name,
    chat_messages,
    finish_reason,
    mcp_attributes,
    operation_name,
    provider_name,
    provider_of_model,
    request_attributes,
    response_attributes,
    server_attributes,
)

logger = logging.getLogger(__name__)

__all__ = [
    "OtlpExportResult",
    "export_runs",
    "follow_runs",
    "otlp_exporter",
    "run_spans",
    "span_id_of",
    "trace_id_of",
]

# A run's events after which it is worth exporting (again): it stopped, for now or for good.
SETTLED = frozenset({"run.completed", "run.failed", "run.suspended"})
# Run-level facts shown as events of the root span (the steps' own events shape their spans).
_RUN_EVENTS = frozenset({
    "run.resumed", "run.suspended", "run.retried", "run.forked", "budget.granted", "version.accepted", "run.erased",
})  # fmt: skip
_ERROR_STATUSES = frozenset({"error", "failed"})
_SCOPE_NAME = "runledger.integrations.otel"
# Run labels that name the conversation (gen_ai.conversation.id): set by the user, or a LangGraph thread's id.
CONVERSATION_LABELS = ("gen_ai.conversation.id", "langgraph.thread_id")


def _digest(*parts: str) -> bytes:
    return hashlib.sha256("\0".join(("runledger.otel", *parts)).encode()).digest()


def trace_id_of(run_id: str) -> int:
    """The trace id of ``run_id``'s trace: 128 bits of sha256 over the run id (never 0, which is invalid)."""
    return int.from_bytes(_digest("trace", run_id)[:16], "big") or 1


def span_id_of(run_id: str, step: int | None = None) -> int:
    """The span id of ``run_id``'s root span (``step`` None) or of its step ``step``: 64 bits, never 0."""
    return int.from_bytes(_digest("span", run_id, "run" if step is None else str(step))[:8], "big") or 1


def _context(run_id: str, step: int | None = None) -> SpanContext:
    return SpanContext(trace_id_of(run_id), span_id_of(run_id, step), is_remote=True,
                       trace_flags=TraceFlags(TraceFlags.SAMPLED))  # fmt: skip


def _ns(ts: str) -> int:
    """An event's RFC 3339 ``ts`` as nanoseconds since the epoch (exact to the microsecond)."""
    when = dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))
    return (when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1) * 1000


def _json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


def _scope() -> InstrumentationScope:
    try:
        return InstrumentationScope(_SCOPE_NAME, version("runledger"), schema_url=SCHEMA_URL)
    except PackageNotFoundError:  # a source tree that was never installed
        return InstrumentationScope(_SCOPE_NAME, schema_url=SCHEMA_URL)


@dataclass
class _Step:
    """What the events of one step say about its span: when it ran and what it used."""

    start: int | None = None
    end: int | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    events: list[Event] = field(default_factory=list)

    def saw(self, start: int, end: int) -> None:
        self.start = start if self.start is None else min(self.start, start)
        self.end = end if self.end is None else max(self.end, end)


def _steps(events: Sequence[Event]) -> dict[int, _Step]:
    """Each step's span times and token use. A model or tool event is stamped when the call
    returned and records how long it took, so it started ``duration_ms`` earlier; an effect runs
    from its claim to its outcome, an approval from its request to its decision."""
    steps: dict[int, _Step] = defaultdict(_Step)
    by_request: dict[str, int] = {}
    by_key: dict[str, int] = {}
    for ev in events:
        p = ev.payload
        step = ev.step
        if step is None:  # an operator's decision on a step: an approval, an in-doubt effect settled
            if ev.type == "approval.resolved":
                step = by_request.get(str(p.get("request_id")))
            elif ev.type == "effect.resolved":
                step = by_key.get(str(p.get("key")))
            if step is None:
                continue
        end = _ns(ev.ts)
        duration = p.get("duration_ms")
        start = end - int(float(duration) * 1_000_000) if isinstance(duration, int | float) else end
        if ev.type == "effect.committed" and step in steps and steps[step].start is not None:
            start = end  # the claim already opened the span; the act's duration lies inside it
        rec = steps[step]
        rec.saw(start, end)
        rec.events.append(ev)
        if ev.type == "model.called":
            usage = p.get("usage") or {}
            rec.input_tokens += int(usage.get("input_tokens") or 0)
            rec.output_tokens += int(usage.get("output_tokens") or 0)
        elif ev.type == "approval.requested":
            by_request[str(p.get("request_id"))] = step
        elif ev.type == "effect.intended":
            by_key[str(p.get("key"))] = step
    return steps


def _readable(value: Any) -> bool:
    """Content this export may show: present and not a stand-in (sealed, hashed, by reference)."""
    return value is not None and not is_placeholder(value)


class _ToolCallIds:
    """The model's ids of the tool calls a run executed, where the record does not hold them.

    An effect records its ``tool_call_id``; a plain tool step does not. Such a step is matched,
    by tool name and in call order, to a tool call of the last model turn before it whose response
    this export can read (a model turn's calls are executed after it, in its order)."""

    def __init__(self) -> None:
        self._open: list[tuple[str, str]] = []  # (name, id) of the last model turn, not yet matched

    def model_turn(self, response: Any) -> None:
        if not _readable(response) or not isinstance(response, dict):
            return
        calls = [c for c in response.get("tool_calls") or [] if isinstance(c, dict) and c.get("id")]
        if calls:
            self._open = [(name, str(c["id"])) for c in calls if (name := call_name(c))]

    def take(self, name: str) -> str | None:
        for i, (called, call_id) in enumerate(self._open):
            if called == name:
                del self._open[i]
                return call_id
        return None


@dataclass
class _StepView:
    """One step as its span is built: the fold's record and the step's events, first and last of each type."""

    rec: StepRecord
    seen: _Step
    content: bool
    conversation: str | None = None  # gen_ai.conversation.id of the run, when it has one

    def __post_init__(self) -> None:
        self.first = {ev.type: ev.payload for ev in reversed(self.seen.events)}
        self.last = {ev.type: ev.payload for ev in self.seen.events}  # a retried call: its final attempt


def _model_attrs(view: _StepView, calls: _ToolCallIds) -> dict[str, Any]:
    rec, seen = view.rec, view.seen
    call = view.last.get("model.called", {})
    request = call.get("request") if _readable(call.get("request")) else None
    response = call.get("response")
    calls.model_turn(response)
    readable = isinstance(response, dict) and _readable(response)
    if not isinstance(response, dict) or not readable:
        response = {}
    operation = operation_name(request)
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        "gen_ai.provider.name": provider_name(rec.name, request, response),
        "gen_ai.request.model": rec.name,
        **request_attributes(request),
        **response_attributes(response),
        **server_attributes(call.get("server")),
        "gen_ai.usage.input_tokens": seen.input_tokens,
        "runledger.step.attempts": rec.attempts,
    }
    if operation == "embeddings":  # no output tokens, messages or finish reasons: vectors
        return attrs
    attrs["gen_ai.usage.output_tokens"] = seen.output_tokens
    if view.conversation:
        attrs["gen_ai.conversation.id"] = view.conversation
    reason = finish_reason(response) if readable else None
    if reason:
        attrs["gen_ai.response.finish_reasons"] = [reason]
    if view.content:
        if isinstance(request, dict):
            attrs["gen_ai.input.messages"] = _json(chat_messages(request.get("messages")))
        if readable:
            reply = {"role": "assistant", "content": response.get("content"), "tool_calls": response.get("tool_calls")}
            out = chat_messages([reply])
            out[0]["finish_reason"] = reason or "stop"  # required in an output message
            attrs["gen_ai.output.messages"] = _json(out)
    return attrs


def _tool_attrs(view: _StepView, calls: _ToolCallIds) -> dict[str, Any]:
    rec = view.rec
    attrs: dict[str, Any] = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": rec.name,
                             "gen_ai.tool.type": "function"}  # fmt: skip
    intended = view.first.get("effect.intended", {})
    declared = intended or view.last.get("tool.called", {})  # what the call recorded of its tool
    if isinstance(declared.get("description"), str) and declared["description"]:
        attrs["gen_ai.tool.description"] = declared["description"]
    attrs |= mcp_attributes(declared.get("via"))
    call_id = intended.get("tool_call_id") or calls.take(rec.name)
    if call_id:
        attrs["gen_ai.tool.call.id"] = str(call_id)
    if rec.kind == "effect":
        attrs |= {"runledger.effect.key": rec.key or intended.get("key", ""), "runledger.effect.state": rec.status,
                  "runledger.effect.class": intended.get("effect_class", "write")}  # fmt: skip
        if "effect.committed" in view.last:
            attrs["runledger.effect.via"] = view.last["effect.committed"].get("via", "act")
        if intended.get("lease_s") is not None:
            attrs["runledger.effect.lease_s"] = float(intended["lease_s"])
        resolved = view.last.get("effect.resolved")
        if resolved:
            attrs["runledger.effect.resolved_by"] = str(resolved.get("by", ""))
            attrs["runledger.effect.forced"] = bool(resolved.get("forced"))
    else:
        attrs["runledger.step.attempts"] = rec.attempts
    if view.content:
        args = intended.get("args") if rec.kind == "effect" else view.last.get("tool.called", {}).get("args")
        if _readable(args):
            attrs["gen_ai.tool.call.arguments"] = _json(args)
        if rec.status in ("ok", "committed", "simulated") and _readable(rec.output):
            attrs["gen_ai.tool.call.result"] = _json(rec.output)
    return attrs


def _approval_attrs(view: _StepView) -> dict[str, Any]:
    rec = view.rec
    attrs: dict[str, Any] = {
        "runledger.approval.action": rec.name,
        "runledger.approval.request_id": rec.request_id or "",
        "runledger.approval.state": rec.status,
    }
    decision = view.last.get("approval.resolved")
    if decision:
        attrs["runledger.approval.by"] = str(decision.get("by", ""))
    return attrs


def _error_status(error: dict[str, Any] | None, fallback: str, content: bool) -> tuple[Status, str]:
    """An ERROR status and the ``error.type``; the message (content) only with ``content``."""
    error = error or {}
    error_type = str(error.get("type") or fallback)
    message = error.get("message")
    detail = f"{error_type}: {message}" if content and _readable(message) else error_type
    return Status(StatusCode.ERROR, detail), error_type


def _step_span(
    run_id: str, view: _StepView, root: SpanContext, resource: Resource, scope: InstrumentationScope,
    calls: _ToolCallIds,
) -> ReadableSpan:  # fmt: skip
    rec = view.rec
    attrs: dict[str, Any] = {"runledger.run.id": run_id, "runledger.step": rec.step, "runledger.step.kind": rec.kind,
                             "runledger.step.status": rec.status}  # fmt: skip
    kind = SpanKind.INTERNAL
    links: list[Link] = []
    if rec.kind == "model":
        attrs |= _model_attrs(view, calls)
        name, kind = f"{attrs['gen_ai.operation.name']} {rec.name}", SpanKind.CLIENT
    elif rec.kind in ("tool", "effect"):
        name = f"execute_tool {rec.name}"
        attrs |= _tool_attrs(view, calls)
    elif rec.kind == "child":
        name = f"invoke_agent {rec.name}"
        # The child's model is in the child's own record, not this one: its provider is not known here.
        attrs |= {"gen_ai.operation.name": "invoke_agent", "gen_ai.provider.name": FALLBACK_PROVIDER,
                  "gen_ai.agent.name": rec.name}  # fmt: skip
        if rec.child_run_id:
            attrs["runledger.child.run_id"] = rec.child_run_id
            links.append(Link(_context(rec.child_run_id), {"runledger.link": "child_run"}))
    elif rec.kind == "approval":
        name = f"approval {rec.name}"
        attrs |= _approval_attrs(view)
    else:  # clock, random: the recorded value is what the step did
        name = f"{rec.kind} {rec.name}".strip()
    status = Status(StatusCode.UNSET)
    if rec.status in _ERROR_STATUSES:
        status, attrs["error.type"] = _error_status(rec.error, "_OTHER", view.content)
    start = view.seen.start if view.seen.start is not None else _ns(rec.ts)
    end = view.seen.end if view.seen.end is not None else start
    return ReadableSpan(
        name=name, context=_context(run_id, rec.step), parent=root, resource=resource, attributes=attrs,
        links=links, kind=kind, status=status, start_time=start, end_time=max(start, end), instrumentation_scope=scope,
    )  # fmt: skip


def _root_attrs(cp: Checkpoint, run_id: str, agent: str) -> dict[str, Any]:
    version_tuple = cp.version or {}
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": agent,
        "runledger.run.id": run_id,
        "runledger.run.status": cp.status,
        "runledger.run.capture": cp.capture,
        "runledger.run.steps": cp.last_step + 1,
        "runledger.run.attempts": cp.attempts,
    }
    if version_tuple.get("agent_version"):
        attrs["gen_ai.agent.version"] = str(version_tuple["agent_version"])
    if version_tuple.get("prompt_hash"):
        attrs["runledger.version.prompt_hash"] = str(version_tuple["prompt_hash"])
    if cp.failure_reason:
        attrs["runledger.run.failure_reason"] = cp.failure_reason
    return attrs


def _conversation(events: Sequence[Event]) -> str | None:
    """The run's conversation id: a label of its ``run.started`` (``CONVERSATION_LABELS``)."""
    started = next((ev.payload for ev in events if ev.type == "run.started"), None)
    labels = started.get("labels") if started else None
    if not isinstance(labels, dict):
        return None
    return next((str(labels[k]) for k in CONVERSATION_LABELS if labels.get(k)), None)


def _run_model(children: Sequence[ReadableSpan], model: Any) -> dict[str, Any]:
    """The root span's ``gen_ai.request.model`` and ``gen_ai.provider.name``: those of its first model
    call (the model the call named, the provider its adapter spoke to), not the version tuple's
    model, which for a framework's adapter is the adapter's name (``pydantic-ai``, ``langchain``). A
    run without a model call names no model, and its provider is the version tuple's model's."""
    for span in children:
        attrs = span.attributes or {}
        if attrs.get("gen_ai.operation.name") in ("chat", "embeddings"):
            return {"gen_ai.request.model": str(attrs["gen_ai.request.model"]),
                    "gen_ai.provider.name": str(attrs["gen_ai.provider.name"])}  # fmt: skip
    return {"gen_ai.provider.name": provider_of_model(model) if isinstance(model, str) else FALLBACK_PROVIDER}


def _root_links(cp: Checkpoint, attrs: dict[str, Any]) -> list[Link]:
    """A branch's link to its parent run, a child run's to the parent's step (noted in ``attrs`` too)."""
    links: list[Link] = []
    if cp.parent:
        parent_run = str(cp.parent["forked_from"])
        fork: dict[str, Any] = {"runledger.fork.step": int(cp.parent["fork_step"]),
                                "runledger.fork.mode": str(cp.parent["mode"])}  # fmt: skip
        if cp.parent.get("changed"):
            fork["runledger.fork.changed"] = str(cp.parent["changed"])
        attrs |= {"runledger.fork.parent_run_id": parent_run, **fork}
        links.append(Link(_context(parent_run), {"runledger.link": "forked_from", **fork}))
    if cp.child_of_run_id:
        attrs["runledger.child_of.run_id"] = cp.child_of_run_id
        if cp.child_of_step is not None:
            attrs["runledger.child_of.step"] = cp.child_of_step
        links.append(Link(_context(cp.child_of_run_id, cp.child_of_step), {"runledger.link": "child_of"}))
    return links


def run_spans(log: RunLog, *, content: bool = False, service_name: str | None = None) -> list[ReadableSpan]:
    """The spans of one run's trace, root first, from its record (``runledger.load_run``).

    Pure: the same record gives the same spans, ids and times included. ``content`` adds
    message, argument, result and error texts where the record holds them readable (the run's
    capture policy decides what that is). ``service_name`` defaults to the run's agent."""
    events = [r.event for r in log.records]
    if not events:
        return []
    cp = fold(log.records, check_chain=False)  # as `runledger show`: everything that folds is shown
    run_id = cp.run_id or log.run_id
    agent = cp.agent or log.agent
    resource = Resource.create({"service.name": service_name or agent, "runledger.agent": agent}, SCHEMA_URL)
    scope = _scope()
    root = _context(run_id)
    attrs = _root_attrs(cp, run_id, agent)
    links = _root_links(cp, attrs)
    seen = _steps(events)
    calls = _ToolCallIds()  # fed in step order: a model turn comes before the calls it asked for
    conversation = _conversation(events)
    views = [_StepView(rec, seen.get(step, _Step()), content, conversation) for step, rec in sorted(cp.steps.items())]
    children = [_step_span(run_id, view, root, resource, scope, calls) for view in views]
    attrs |= _run_model(children, (cp.version or {}).get("model"))
    if conversation:
        attrs["gen_ai.conversation.id"] = conversation
    attrs["gen_ai.usage.input_tokens"] = sum(s.input_tokens for s in seen.values())
    attrs["gen_ai.usage.output_tokens"] = sum(s.output_tokens for s in seen.values())
    status = Status(StatusCode.OK if cp.status == "completed" else StatusCode.UNSET)
    if cp.status == "failed":
        status, attrs["error.type"] = _error_status(cp.error, cp.failure_reason or "_OTHER", content)
    span_events = [
        SpanEvent(ev.type, {k: _attr(v) for k, v in ev.payload.items() if _attr(v) is not None}, _ns(ev.ts))
        for ev in events
        if ev.type in _RUN_EVENTS
    ]
    start = _ns(events[0].ts)
    end = max([_ns(ev.ts) for ev in events] + [s.end_time or start for s in children])
    run_span = ReadableSpan(
        name=f"invoke_agent {agent}", context=root, parent=None, resource=resource, attributes=attrs,
        events=span_events, links=links, kind=SpanKind.INTERNAL, status=status, start_time=start, end_time=end,
        instrumentation_scope=scope,
    )  # fmt: skip
    return [run_span, *children]


def _attr(value: Any) -> str | int | float | bool | None:
    """A run-level event's payload value as a span event attribute (structure only: these events
    carry no content fields)."""
    if isinstance(value, bool | int | float | str):
        return value
    return None


# -- sending ---------------------------------------------------------------------------------------------


@dataclass
class OtlpExportResult:
    """What an export sent: each run's trace id (hex) and the number of spans."""

    traces: dict[str, str] = field(default_factory=dict)
    spans: int = 0

    @property
    def runs(self) -> list[str]:
        return list(self.traces)


def otlp_exporter(endpoint: str, *, headers: dict[str, str] | None = None, timeout: float = 10.0) -> SpanExporter:
    """The OTLP/HTTP (protobuf) span exporter for ``endpoint``.

    A bare collector address (``http://host:4318``) gets the traces path ``/v1/traces``; a URL
    with a path is used as it is. Raises ConfigurationError for what is not an http(s) URL."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigurationError(f"--endpoint {endpoint!r} is not an http(s) URL: e.g. http://localhost:4318")
    url = endpoint.rstrip("/") + "/v1/traces" if parts.path in ("", "/") else endpoint
    return OTLPSpanExporter(endpoint=url, headers=headers, timeout=timeout)


async def _send(exporter: SpanExporter, spans: Sequence[ReadableSpan], what: str) -> None:
    result = await asyncio.to_thread(exporter.export, spans)
    if result is not SpanExportResult.SUCCESS:
        raise LedgerError(
            f"the OTLP receiver did not accept the trace of {what} (see the log above for its answer): "
            "check --endpoint and that the collector accepts OTLP/HTTP protobuf; exporting again is safe"
        )


async def export_runs(
    client: LedgerClient,
    run_ids: Iterable[str],
    exporter: SpanExporter,
    *,
    content: bool = False,
    service_name: str | None = None,
    on_run: Callable[[str, str, int], None] | None = None,
) -> OtlpExportResult:
    """Send each run of ``run_ids`` as one trace through ``exporter`` (``otlp_exporter(URL)``).

    Runs are read with ``load_run`` (content opened where this connection may). ``on_run(run_id,
    trace_id_hex, spans)`` is called after each. Idempotent for the receiver: the same run gives
    the same ids. Raises RunNotFoundError for an unknown run, LedgerError when the receiver
    refuses a trace (the runs before it were sent)."""
    result = OtlpExportResult()
    for run_id in run_ids:
        # Opened even without ``content``: a response's finish reason and tool-call ids live in it.
        log = await load_run(client, run_id)
        spans = run_spans(log, content=content, service_name=service_name)
        await _send(exporter, spans, f"run {run_id}")
        trace_hex = format(trace_id_of(run_id), "032x")
        result.traces[run_id] = trace_hex
        result.spans += len(spans)
        if on_run is not None:
            on_run(run_id, trace_hex, len(spans))
    return result


async def follow_runs(
    client: LedgerClient,
    exporter: SpanExporter,
    stop: asyncio.Event,
    *,
    content: bool = False,
    service_name: str | None = None,
    on_run: Callable[[str, str, int], None] | None = None,
    ready: Callable[[], Awaitable[None] | None] | None = None,
) -> OtlpExportResult:
    """Export every run that settles (completes, fails or suspends) from now until ``stop`` is set.

    A run that settles again (a suspended run resumed and completed) is exported again, with the
    same ids. ``ready()`` is called once the subscription is in place (events before it are not
    seen: export those by id, as ``runledger export otlp --where`` does). A run whose export fails is
    logged and skipped; following goes on."""
    result = OtlpExportResult()
    settled: asyncio.Queue[str] = asyncio.Queue()

    def on_event(event: Event) -> None:
        if event.type in SETTLED:
            settled.put_nowait(event.run_id)

    async with follow_events(client, on_event):
        if ready is not None:
            maybe = ready()
            if maybe is not None:
                await maybe
        stopping = asyncio.ensure_future(stop.wait())
        while not stop.is_set():
            getting = asyncio.ensure_future(settled.get())
            await asyncio.wait({getting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not getting.done():
                getting.cancel()
                break
            run_id = getting.result()
            try:
                one = await export_runs(client, [run_id], exporter, content=content, service_name=service_name,
                                        on_run=on_run)  # fmt: skip
            except LedgerError as exc:
                logger.warning("run %s not exported: %s", run_id, exc)
                continue
            result.traces |= one.traces
            result.spans += one.spans
        stopping.cancel()
    return result
