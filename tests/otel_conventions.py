"""The OpenTelemetry GenAI semantic conventions as a table, and a validator of exported spans against it.

Transcribed from the GenAI semantic conventions, version: ``open-telemetry/semantic-conventions-genai``
at commit 002c8a6ea1c8a42b14a4527db83b3cabcded610a (status Development; unreleased, the GenAI names having
moved there from ``open-telemetry/semantic-conventions``, whose v1.41.1 they link for ``error.type`` and
``server.*``): ``docs/gen-ai/gen-ai-spans.md`` (the Inference span ``gen_ai.inference.client``, the
Embeddings span ``gen_ai.embeddings.client`` and the Execute tool span ``gen_ai.execute_tool.internal``)
and ``docs/gen-ai/gen-ai-agent-spans.md`` (the Invoke agent internal span ``gen_ai.invoke_agent.internal``),
with the output-messages JSON schema
(``docs/gen-ai/gen-ai-output-messages.json``) for the required fields of a message. Only the
``Required`` and ``Conditionally Required`` rows are transcribed, plus the types of the ``Recommended``
and ``Opt-In`` rows an exporter may send; each conditional row names the fact of the call that makes
it due (``Facts``), which a test takes from the record, never from the exporter.

``problems(span, facts)`` lists every way ``span`` breaks the table (empty: conforming). A span
without ``gen_ai.operation.name`` is no GenAI operation (an approval, a clock read): it must then
carry no ``gen_ai.*`` attribute at all.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.trace.v1.trace_pb2 import Span

from runledger import Event, RunLog, fold

CONVENTIONS = "semantic-conventions-genai@002c8a6 (GenAI spans and agent spans; on semantic conventions 1.41.1)"
# The MCP client span's table: docs/gen-ai/mcp.md of open-telemetry/semantic-conventions-genai at commit
# 0393513c908bf895e7b3ec480a2c1eb073c584af ("Client"; status Development). Its tool-call spans "are
# compatible with GenAI execute_tool spans", and an instrumentation that finds a GenAI span already tracing
# the tool execution "SHOULD add MCP-specific attributes to the existing tool execution span": a span with
# mcp.method.name is held to both tables.
MCP_CONVENTIONS = "semantic-conventions-genai@0393513 docs/gen-ai/mcp.md (MCP client span)"
SCHEMA_URL = "https://opentelemetry.io/schemas/1.41.1"

# gen_ai.provider.name: "If one of them applies, then the respective value MUST be used; otherwise, a
# custom value MAY be used."
WELL_KNOWN_PROVIDERS = frozenset({
    "anthropic", "aws.bedrock", "azure.ai.inference", "azure.ai.openai", "cohere", "deepseek", "gcp.gemini",
    "gcp.gen_ai", "gcp.vertex_ai", "groq", "ibm.watsonx.ai", "mistral_ai", "moonshot_ai", "openai", "perplexity",
    "x_ai",
})  # fmt: skip
WELL_KNOWN_OPERATIONS = frozenset({
    "chat", "create_agent", "create_memory", "create_memory_store", "delete_memory", "delete_memory_store",
    "embeddings", "execute_tool", "generate_content", "invoke_agent", "invoke_workflow", "plan", "retrieval",
    "search_memory", "text_completion", "update_memory", "upsert_memory",
})  # fmt: skip
# Names the conventions deprecated with a replacement or removed: never to be sent.
DEPRECATED = frozenset({
    "gen_ai.system", "gen_ai.prompt", "gen_ai.completion", "gen_ai.usage.prompt_tokens",
    "gen_ai.usage.completion_tokens", "gen_ai.openai.request.seed", "gen_ai.openai.request.response_format",
})  # fmt: skip


@dataclass(frozen=True)
class Attr:
    """One row: the key, its value type, its requirement level, and for a conditional row the fact
    that makes it due (``when``). ``equal``: the attribute must equal the fact's value."""

    key: str
    type: str  # string, int, double, boolean, string[], any
    level: str  # required, conditionally_required, recommended, opt_in
    when: str = ""
    equal: bool = True


@dataclass(frozen=True)
class SpanRule:
    kinds: frozenset[str]  # SHOULD (and MAY) span kinds
    attrs: tuple[Attr, ...]

    def row(self, key: str) -> Attr | None:
        return next((a for a in self.attrs if a.key == key), None)


_REQUEST_PARAMS = (
    Attr("gen_ai.request.frequency_penalty", "double", "recommended"),
    Attr("gen_ai.request.max_tokens", "int", "recommended"),
    Attr("gen_ai.request.presence_penalty", "double", "recommended"),
    Attr("gen_ai.request.stop_sequences", "string[]", "recommended"),
    Attr("gen_ai.request.temperature", "double", "recommended"),
    Attr("gen_ai.request.top_p", "double", "recommended"),
    Attr("gen_ai.response.finish_reasons", "string[]", "recommended"),
    Attr("gen_ai.usage.input_tokens", "int", "recommended"),
    Attr("gen_ai.usage.output_tokens", "int", "recommended"),
    Attr("gen_ai.input.messages", "any", "opt_in"),
    Attr("gen_ai.output.messages", "any", "opt_in"),
    Attr("gen_ai.system_instructions", "any", "opt_in"),
    Attr("gen_ai.tool.definitions", "any", "opt_in"),
)

RULES: dict[str, SpanRule] = {
    # gen-ai-spans.md, "Inference" (gen_ai.inference.client): span kind SHOULD be CLIENT, MAY be INTERNAL.
    "chat": SpanRule(frozenset({"CLIENT", "INTERNAL"}), (
        Attr("gen_ai.operation.name", "string", "required"),
        Attr("gen_ai.provider.name", "string", "required", when="provider"),
        Attr("error.type", "string", "conditionally_required", when="error", equal=False),
        Attr("gen_ai.conversation.id", "string", "conditionally_required", when="conversation"),
        Attr("gen_ai.output.type", "string", "conditionally_required", when="output_type"),
        Attr("gen_ai.request.choice.count", "int", "conditionally_required", when="choice_count"),
        Attr("gen_ai.request.model", "string", "conditionally_required", when="model"),
        Attr("gen_ai.request.seed", "int", "conditionally_required", when="seed"),
        Attr("gen_ai.request.stream", "boolean", "conditionally_required", when="stream"),
        Attr("gen_ai.request.top_k", "double", "conditionally_required", when="top_k"),
        # "If server.address is set": due with the address the test knows the call went to.
        Attr("server.port", "int", "conditionally_required", when="server.port"),
        Attr("gen_ai.response.id", "string", "recommended"),
        Attr("gen_ai.response.model", "string", "recommended"),
        Attr("server.address", "string", "recommended", when="server.address"),
        *_REQUEST_PARAMS,
    )),
    # gen-ai-spans.md, "Embeddings" (gen_ai.embeddings.client): span kind SHOULD be CLIENT.
    "embeddings": SpanRule(frozenset({"CLIENT"}), (
        Attr("gen_ai.operation.name", "string", "required"),
        Attr("gen_ai.provider.name", "string", "required", when="provider"),
        Attr("error.type", "string", "conditionally_required", when="error", equal=False),
        Attr("gen_ai.request.model", "string", "conditionally_required", when="model"),
        Attr("server.port", "int", "conditionally_required", when="server.port"),
        Attr("gen_ai.embeddings.dimension.count", "int", "recommended"),
        Attr("gen_ai.request.encoding_formats", "string[]", "recommended"),
        Attr("gen_ai.response.model", "string", "recommended"),
        Attr("gen_ai.usage.input_tokens", "int", "recommended"),
        Attr("server.address", "string", "recommended", when="server.address"),
    )),
    # gen-ai-spans.md, "Execute tool span" (gen_ai.execute_tool.internal): span kind SHOULD be INTERNAL.
    "execute_tool": SpanRule(frozenset({"INTERNAL"}), (
        Attr("gen_ai.operation.name", "string", "required"),
        Attr("gen_ai.tool.name", "string", "required", when="tool"),
        Attr("error.type", "string", "conditionally_required", when="error", equal=False),
        Attr("gen_ai.tool.call.id", "string", "recommended"),
        Attr("gen_ai.tool.description", "string", "recommended", when="tool_description"),
        Attr("gen_ai.tool.type", "string", "recommended"),
        Attr("gen_ai.tool.call.arguments", "any", "opt_in"),
        Attr("gen_ai.tool.call.result", "any", "opt_in"),
    )),
    # gen-ai-agent-spans.md, "Invoke agent internal span" (gen_ai.invoke_agent.internal): INTERNAL.
    "invoke_agent": SpanRule(frozenset({"INTERNAL"}), (
        Attr("gen_ai.operation.name", "string", "required"),
        Attr("gen_ai.provider.name", "string", "required", when="provider"),
        Attr("error.type", "string", "conditionally_required", when="error", equal=False),
        Attr("gen_ai.agent.description", "string", "conditionally_required", when="agent_description"),
        Attr("gen_ai.agent.id", "string", "conditionally_required", when="agent_id"),
        Attr("gen_ai.agent.name", "string", "conditionally_required", when="agent"),
        Attr("gen_ai.agent.version", "string", "conditionally_required", when="agent_version"),
        Attr("gen_ai.conversation.id", "string", "conditionally_required", when="conversation"),
        Attr("gen_ai.data_source.id", "string", "conditionally_required", when="data_source"),
        Attr("gen_ai.output.type", "string", "conditionally_required", when="output_type"),
        Attr("gen_ai.request.choice.count", "int", "conditionally_required", when="choice_count"),
        Attr("gen_ai.request.model", "string", "conditionally_required", when="model"),
        Attr("gen_ai.request.seed", "int", "conditionally_required", when="seed"),
        *_REQUEST_PARAMS,
    )),
}  # fmt: skip

# mcp.md, "Client" (mcp.client): span kind SHOULD be CLIENT, but held here as the GenAI execute_tool span
# it is added to (INTERNAL); gen_ai.operation.name "SHOULD be set to execute_tool when the operation
# describes a tool call". jsonrpc.request.id (conditionally required "when the client executes a request")
# is the MCP SDK's own counter, which runledger does not record: its fact is never due (docs/otel.md, Limits).
MCP_CLIENT = SpanRule(frozenset({"CLIENT", "INTERNAL"}), (
    Attr("mcp.method.name", "string", "required", when="mcp.method.name"),
    Attr("error.type", "string", "conditionally_required", when="error", equal=False),
    Attr("gen_ai.prompt.name", "string", "conditionally_required", when="prompt"),
    Attr("gen_ai.tool.name", "string", "conditionally_required", when="tool"),
    Attr("jsonrpc.request.id", "string", "conditionally_required", when="jsonrpc_request_id"),
    Attr("mcp.resource.uri", "string", "conditionally_required", when="resource"),
    Attr("rpc.response.status_code", "string", "conditionally_required", when="rpc_status"),
    Attr("gen_ai.operation.name", "string", "recommended", when="operation"),
    Attr("jsonrpc.protocol.version", "string", "recommended"),
    Attr("mcp.protocol.version", "string", "recommended", when="mcp.protocol.version"),
    Attr("mcp.session.id", "string", "recommended", when="mcp.session.id"),
    Attr("network.protocol.name", "string", "recommended"),
    Attr("network.protocol.version", "string", "recommended"),
    Attr("network.transport", "string", "recommended", when="network.transport"),
    Attr("server.address", "string", "recommended", when="server.address"),
    Attr("server.port", "int", "recommended", when="server.port"),
    Attr("gen_ai.tool.call.arguments", "any", "opt_in"),
    Attr("gen_ai.tool.call.result", "any", "opt_in"),
))  # fmt: skip
MCP_METHODS = frozenset({
    "completion/complete", "elicitation/create", "initialize", "logging/setLevel", "notifications/cancelled",
    "notifications/initialized", "notifications/message", "notifications/progress",
    "notifications/prompts/list_changed", "notifications/resources/list_changed", "notifications/resources/updated",
    "notifications/roots/list_changed", "notifications/tools/list_changed", "ping", "prompts/get", "prompts/list",
    "resources/list", "resources/read", "resources/subscribe", "resources/templates/list", "resources/unsubscribe",
    "roots/list", "sampling/createMessage", "tools/call", "tools/list",
})  # fmt: skip
NETWORK_TRANSPORTS = frozenset({"pipe", "quic", "tcp", "udp", "unix"})


@dataclass
class ExportedSpan:
    """A span as a receiver got it: what the validator looks at."""

    name: str
    kind: str  # CLIENT, INTERNAL, ...
    attributes: dict[str, Any]
    error: bool  # status ERROR
    scope_schema_url: str = ""
    resource_schema_url: str = ""


@dataclass
class Facts:
    """What the record says of the call a span stands for: each key a ``when`` of the table, its
    value the attribute's expected value (``True``: due, any value). ``stream`` absent: the request
    was not streamed, and ``gen_ai.request.stream`` must not say it was."""

    due: dict[str, Any] = field(default_factory=dict)


def _typed(value: Any, kind: str) -> bool:
    if kind == "string":
        return isinstance(value, str) and value != ""
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "double":
        return isinstance(value, float)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "string[]":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return value is not None


def _expected_name(op: str, attrs: Mapping[str, Any]) -> str:
    if op in ("chat", "embeddings"):
        return f"{op} {attrs.get('gen_ai.request.model')}"  # {gen_ai.operation.name} {gen_ai.request.model}
    if op == "execute_tool":
        return f"execute_tool {attrs.get('gen_ai.tool.name')}"
    agent = attrs.get("gen_ai.agent.name")
    return f"invoke_agent {agent}" if agent else "invoke_agent"


def _message_problems(key: str, raw: Any, output: bool) -> list[str]:
    """The required fields of the input/output messages JSON schemas."""
    try:
        messages = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return [f"{key} is not JSON"]
    if not isinstance(messages, list):
        return [f"{key} is not a list of messages"]
    out = []
    for n, m in enumerate(messages):
        required = ("role", "parts", "finish_reason") if output else ("role", "parts")
        out += [f"{key}[{n}] lacks {r}" for r in required if not isinstance(m, dict) or m.get(r) in (None, "")]
        for p, part in enumerate(m.get("parts") or [] if isinstance(m, dict) else []):
            needs = {"text": ("content",), "tool_call": ("name",), "tool_call_response": ("response",)}
            out += [f"{key}[{n}].parts[{p}] ({part.get('type')}) lacks {r}"
                    for r in ("type", *needs.get(part.get("type"), ())) if r not in part]  # fmt: skip
    return out


def _row_problems(rule: SpanRule, attrs: Mapping[str, Any], facts: Facts) -> list[str]:
    """Each row of ``rule`` that ``attrs`` break: due and missing, mistyped, or not the fact's value."""
    out = []
    for row in rule.attrs:
        value = attrs.get(row.key)
        due = row.level == "required" or (row.when and row.when in facts.due)
        if value is None:
            if due:
                out.append(f"{row.level.replace('_', ' ')} {row.key} missing")
            continue
        if not _typed(value, row.type):
            out.append(f"{row.key}={value!r} is not a {row.type}")
        expected = facts.due.get(row.when) if row.when else None
        if due and row.equal and expected not in (None, True) and value != expected:
            out.append(f"{row.key}={value!r}, but the record says {expected!r}")
    return out


def problems(span: ExportedSpan, facts: Facts) -> list[str]:
    """Every way ``span`` breaks the conventions' table, given the facts of its call."""
    attrs = span.attributes
    out = [f"deprecated attribute {k}" for k in sorted(attrs) if k in DEPRECATED]
    if span.scope_schema_url != SCHEMA_URL:
        out.append(f"instrumentation scope schema URL {span.scope_schema_url!r}, not {SCHEMA_URL}")
    op = attrs.get("gen_ai.operation.name")
    if op is None:
        return out + [f"{k} on a span that is no GenAI operation" for k in sorted(attrs) if k.startswith("gen_ai.")]
    rule = RULES.get(op)
    if rule is None:
        return [*out, f"operation {op!r} has no rule ({'well-known' if op in WELL_KNOWN_OPERATIONS else 'custom'})"]
    out += _row_problems(rule, attrs, facts)
    if "mcp.method.name" in attrs or "mcp.method.name" in facts.due:
        out += [f"MCP: {p}" for p in _row_problems(MCP_CLIENT, attrs, facts)]
        if attrs.get("mcp.method.name") not in MCP_METHODS:
            out.append(f"mcp.method.name={attrs.get('mcp.method.name')!r} is no MCP method")
        if "network.transport" in attrs and attrs["network.transport"] not in NETWORK_TRANSPORTS:
            out.append(f"network.transport={attrs['network.transport']!r} is no well-known transport")
    if attrs.get("gen_ai.request.stream") is True and "stream" not in facts.due:
        out.append("gen_ai.request.stream is true for a request that was not streamed")
    if span.error != ("error" in facts.due):
        failed = "failed" if "error" in facts.due else "did not fail"
        out.append(f"span status {'ERROR' if span.error else 'not ERROR'}, but the call {failed}")
    if span.kind not in rule.kinds:
        out.append(f"span kind {span.kind}, not {' or '.join(sorted(rule.kinds))}")
    if span.name != _expected_name(op, attrs):
        out.append(f"span name {span.name!r}, not {_expected_name(op, attrs)!r}")
    for key in ("gen_ai.input.messages", "gen_ai.output.messages"):
        if key in attrs:
            out += _message_problems(key, attrs[key], key == "gen_ai.output.messages")
    return out


# -- the facts of a recorded run, from its record -----------------------------------------------------------------


@dataclass(frozen=True)
class Known:
    """What a test knows of a run's calls from how it made them, not from the record (so a record that
    lacks them fails): the provider of its model calls, the host and port they went to, whether its
    tools were declared with descriptions, the MCP facts of its tool calls (each a ``when`` of the
    MCP table, ``True``: due with any value)."""

    provider: str | None = None
    server: tuple[str, int] | None = None
    described: bool = False
    mcp: Mapping[str, Any] | None = None


def _step_facts(events: list[Event], conversation: str | None, known: Known) -> Facts:
    last, first = events[-1], events[0]
    due: dict[str, Any] = {}
    failed = last.type in ("effect.failed", "child.failed") or (
        last.type in ("model.called", "tool.called")
        and last.payload.get("error")
        and not last.payload.get("will_retry")
    )
    if failed:
        due["error"] = True
    p = last.payload
    if last.type == "model.called":
        due["provider"] = known.provider or True
        due["model"] = p["model"]
        if known.server is not None:
            due["server.address"], due["server.port"] = known.server
        params = (p.get("request") or {}).get("params") or {}
        if isinstance(params.get("seed"), int):
            due["seed"] = params["seed"]
        if isinstance(params.get("n"), int) and params["n"] != 1:
            due["choice_count"] = params["n"]
        if params.get("stream") is True:
            due["stream"] = True
        if "top_k" in params:
            due["top_k"] = True
        if params.get("response_format") or (params.get("text") or {}).get("format"):
            due["output_type"] = True  # "if the request includes an output format"
        if conversation:
            due["conversation"] = conversation
    elif first.type in ("tool.called", "effect.intended"):
        due["tool"] = p.get("name") or first.payload.get("name") or True
        if known.described:
            due["tool_description"] = True
        if known.mcp is not None:
            due |= {"operation": "execute_tool", **known.mcp}
    elif first.type == "child.started":
        due["agent"] = first.payload["agent"]
        due["provider"] = True  # the child's model is in the child's record, not this one
    return Facts(due)


def record_facts(log: RunLog, known: Known | str | None = None) -> dict[int | None, Facts]:
    """The facts of each span of ``log``'s trace (None: the run's root span), from the record and what
    the test knows (``Known``; a string: the provider alone). The root span's model is the model the
    run's first model call named (the record's ``model.called``), never the version tuple's, which for a
    framework's adapter is the adapter's name."""
    known = known if isinstance(known, Known) else Known(provider=known)
    provider = known.provider
    cp = fold(log.records, check_chain=False)
    started = next((e.payload for e in log.events if e.type == "run.started"), {})
    labels = started.get("labels") or {}
    conversation = labels.get("gen_ai.conversation.id") or labels.get("langgraph.thread_id")
    by_step: dict[int, list[Event]] = defaultdict(list)
    for ev in log.events:
        if ev.step is not None and not ev.type.startswith(("run.", "budget.")):  # run.failed names its step
            by_step[ev.step].append(ev)
    facts: dict[int | None, Facts] = {step: _step_facts(evs, conversation, known) for step, evs in by_step.items()}
    version = cp.version or {}
    root: dict[str, Any] = {"agent": cp.agent, "provider": provider or True}
    if version.get("agent_version"):
        root["agent_version"] = str(version["agent_version"])
    called = next((e.payload["model"] for e in log.events if e.type == "model.called"), None)
    if called:
        root["model"] = str(called)
    if conversation:
        root["conversation"] = conversation
    if cp.status == "failed":
        root["error"] = True
    facts[None] = Facts(root)
    return facts


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def exported(span: Span, scope_schema_url: str, resource_schema_url: str) -> ExportedSpan:
    """A span as an OTLP receiver decoded it (``opentelemetry-proto``), for ``problems``."""
    return ExportedSpan(
        name=span.name,
        kind=Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
        attributes={kv.key: _value(kv.value) for kv in span.attributes},
        error=span.status.code == span.status.STATUS_CODE_ERROR,
        scope_schema_url=scope_schema_url,
        resource_schema_url=resource_schema_url,
    )
