"""The GenAI semantic conventions as the OTLP export writes them: provider names, request
parameters, response facts, finish reasons and message parts, from what a run recorded.

Written to the GenAI conventions as they stand in ``open-telemetry/semantic-conventions-genai``
(2026-12; the GenAI names moved there from ``semantic-conventions``, whose release 1.41.1 they build
on: ``SCHEMA_URL``). Pure functions of recorded payloads; ``runledger.integrations.otel`` builds spans
with them.

``provider_name`` is the documented mapping of ``gen_ai.provider.name`` (required on chat and
invoke_agent spans): a step recorded through ``runledger.integrations.openai`` is ``openai`` (the
client's API, as OpenAI's own instrumentation says); a model id naming its provider
(``anthropic:claude-...``, ``openai/gpt-...``) is that provider; a model id of a known family
(``gpt-``, ``claude``, ``gemini``, ``mistral``...) its maker; a LangChain reply that recorded its
``model_provider`` that one; anything else ``FALLBACK_PROVIDER``, a custom value as the conventions
allow where no well-known value applies.

Rejected: emitting ``gen_ai.system`` beside ``gen_ai.provider.name`` (deprecated, replaced by it);
taking the provider from the model's class name (a scripted or wrapped model would pass for the
provider it imitates).
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = [
    "FALLBACK_PROVIDER",
    "SCHEMA_URL",
    "call_name",
    "chat_messages",
    "finish_reason",
    "mcp_attributes",
    "operation_name",
    "provider_name",
    "provider_of_model",
    "request_attributes",
    "response_attributes",
    "server_attributes",
    "tool_call_part",
]

# The semantic conventions release the GenAI conventions build on (they link its error.type and server.*).
SCHEMA_URL = "https://opentelemetry.io/schemas/1.41.1"
# A custom gen_ai.provider.name value: "If one of them applies, then the respective value MUST be used;
# otherwise, a custom value MAY be used."
FALLBACK_PROVIDER = "unknown"

# The prefix of "provider:model" (LangChain's init_chat_model) or "provider/model" (LiteLLM, routers).
_PROVIDER_PREFIXES = {
    "openai": "openai", "azure": "azure.ai.openai", "azure_openai": "azure.ai.openai",
    "azure_ai": "azure.ai.inference", "anthropic": "anthropic", "bedrock": "aws.bedrock",
    "bedrock_converse": "aws.bedrock", "aws": "aws.bedrock", "google_genai": "gcp.gemini", "gemini": "gcp.gemini",
    "google_vertexai": "gcp.vertex_ai", "vertex_ai": "gcp.vertex_ai", "vertexai": "gcp.vertex_ai",
    "google": "gcp.gen_ai", "mistralai": "mistral_ai", "mistral": "mistral_ai", "cohere": "cohere", "groq": "groq",
    "deepseek": "deepseek", "xai": "x_ai", "x_ai": "x_ai", "perplexity": "perplexity", "ibm": "ibm.watsonx.ai",
    "watsonx": "ibm.watsonx.ai", "moonshot": "moonshot_ai", "moonshotai": "moonshot_ai",
    # Pydantic AI's model ids ("<system>:<model>")
    "google-gla": "gcp.gemini", "google-vertex": "gcp.vertex_ai", "grok": "x_ai",
}  # fmt: skip
# Bare model ids by family, first match wins (Bedrock's "vendor.model" ids before the vendors' own).
_MODEL_FAMILIES: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(r"^(?:[a-z]{2}\.)?(?:amazon|anthropic|meta|cohere|ai21|mistral|deepseek|writer)\.[a-z]"),
        "aws.bedrock",
    ),
    (re.compile(r"^(?:gpt-|chatgpt-|o\d(?:$|-)|text-embedding-|davinci|babbage|dall-e|whisper|tts-)"), "openai"),
    (re.compile(r"^claude"), "anthropic"),
    (re.compile(r"^gemini"), "gcp.gen_ai"),  # "may be used when specific backend is unknown"
    (re.compile(r"^(?:mistral|mixtral|codestral|ministral|magistral|pixtral|devstral|open-mistral)"), "mistral_ai"),
    (re.compile(r"^command"), "cohere"),
    (re.compile(r"^deepseek"), "deepseek"),
    (re.compile(r"^grok"), "x_ai"),
    (re.compile(r"^sonar"), "perplexity"),
    (re.compile(r"^(?:kimi|moonshot)"), "moonshot_ai"),
]
_OPENAI_ENDPOINTS = frozenset({"/chat/completions", "/responses", "/embeddings"})


def operation_name(request: Any) -> str:
    """``gen_ai.operation.name`` of a model step: ``embeddings`` for the OpenAI integration's
    embeddings calls, else ``chat`` (every other model step is a chat turn)."""
    params = request.get("params") if isinstance(request, dict) else None
    return "embeddings" if isinstance(params, dict) and params.get("endpoint") == "/embeddings" else "chat"


def provider_name(model: str, request: Any = None, response: Any = None) -> str:
    """``gen_ai.provider.name`` of a model step: by the integration that recorded it, else the model id."""
    params = request.get("params") if isinstance(request, dict) else None
    if isinstance(params, dict) and params.get("endpoint") in _OPENAI_ENDPOINTS:
        return "openai"
    if isinstance(response, dict) and isinstance(response.get("sdk"), dict) and response.get("endpoint"):
        return "openai"
    by_model = provider_of_model(model)
    if by_model != FALLBACK_PROVIDER:
        return by_model
    # What a reply said of itself: LangChain's model_provider, Pydantic AI's provider_name.
    for source, key in (("metadata", "model_provider"), ("message", "provider_name")):
        given = response.get(source) if isinstance(response, dict) else None
        if isinstance(given, dict) and isinstance(given.get(key), str) and given[key]:
            named = str(given[key]).lower()
            return _PROVIDER_PREFIXES.get(named, named)
    return FALLBACK_PROVIDER


def provider_of_model(model: str) -> str:
    """The provider a model id names or belongs to, else ``FALLBACK_PROVIDER``."""
    lowered = model.strip().lower()
    for sep in (":", "/"):
        prefix, found, _ = lowered.partition(sep)
        if found and prefix in _PROVIDER_PREFIXES:
            return _PROVIDER_PREFIXES[prefix]
    for pattern, provider in _MODEL_FAMILIES:
        if pattern.search(lowered):
            return provider
    return FALLBACK_PROVIDER


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _output_type(params: dict[str, Any]) -> str | None:
    """``gen_ai.output.type`` of a request that asked for an output format (chat ``response_format``,
    the responses API's ``text.format``)."""
    wanted = params.get("response_format")
    text = params.get("text")
    if wanted is None and isinstance(text, dict):
        wanted = text.get("format")
    kind = wanted.get("type") if isinstance(wanted, dict) else wanted if isinstance(wanted, str) else None
    if kind in ("json_object", "json_schema", "json"):
        return "json"
    return "text" if kind == "text" else None


def request_attributes(request: Any) -> dict[str, Any]:
    """The ``gen_ai.request.*`` (and ``gen_ai.output.type``) attributes of a recorded request's
    parameters (``run.model(messages, **params)``): those present, in the conventions' types."""
    params = request.get("params") if isinstance(request, dict) else None
    if not isinstance(params, dict):
        return {}
    settings = params.get("model_settings")  # Pydantic AI's ModelSettings
    if isinstance(settings, dict):
        params = {**settings, **params}
    attrs: dict[str, Any] = {}
    for key in ("temperature", "top_p", "top_k", "frequency_penalty", "presence_penalty"):
        if (value := _number(params.get(key))) is not None:
            attrs[f"gen_ai.request.{key}"] = value
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if (count := _integer(params.get(key))) is not None:
            attrs["gen_ai.request.max_tokens"] = count
            break
    if (seed := _integer(params.get("seed"))) is not None:
        attrs["gen_ai.request.seed"] = seed
    if (choices := _integer(params.get("n"))) is not None and choices != 1:
        attrs["gen_ai.request.choice.count"] = choices
    stop = params.get("stop", params.get("stop_sequences"))
    if isinstance(stop, str):
        attrs["gen_ai.request.stop_sequences"] = [stop]
    elif isinstance(stop, list) and stop and all(isinstance(s, str) for s in stop):
        attrs["gen_ai.request.stop_sequences"] = list(stop)
    if params.get("stream") is True:  # "if and only if the request is streaming"
        attrs["gen_ai.request.stream"] = True
    if (output := _output_type(params)) is not None:
        attrs["gen_ai.output.type"] = output
    if isinstance(params.get("encoding_format"), str):  # embeddings
        attrs["gen_ai.request.encoding_formats"] = [params["encoding_format"]]
    if (dimensions := _integer(params.get("dimensions"))) is not None:
        attrs["gen_ai.embeddings.dimension.count"] = dimensions
    return attrs


def response_attributes(response: Any) -> dict[str, Any]:
    """``gen_ai.response.id`` and ``gen_ai.response.model`` where the response recorded them: the
    SDK's own response (``sdk``) of the OpenAI integration, a LangChain reply's ``metadata``, a
    Pydantic AI ``ModelResponse`` (``message``)."""
    if not isinstance(response, dict):
        return {}
    attrs: dict[str, Any] = {}
    for source in (response.get("metadata"), response.get("sdk"), response.get("message")):
        if not isinstance(source, dict):
            continue
        for key, attr in (("id", "gen_ai.response.id"), ("provider_response_id", "gen_ai.response.id"),
                          ("model", "gen_ai.response.model"), ("model_name", "gen_ai.response.model")):  # fmt: skip
            value = source.get(key)
            if isinstance(value, str) and value and attr not in attrs:
                attrs[attr] = value
    return attrs


def finish_reason(response: dict[str, Any]) -> str | None:
    """The reason the model gave for ending its turn: as the provider gave it where the adapter
    recorded it (``model_finish_reason``: OpenAI's ``tool_calls``, Anthropic's ``tool_use``); else
    ``tool_call`` (the conventions' value) for a turn that asked for tools and gave none. The
    record's ``stop`` on a tool-call turn is the adapter's default for a reply without a reason
    (``ModelResponse``, LangChain's replies), not the model's. A text turn without the model's own
    reason keeps the one recorded (``stop``)."""
    own = response.get("model_finish_reason")  # the model's own, as the provider gave it (ModelResponse)
    if isinstance(own, str) and own:
        return own
    recorded = response.get("finish_reason")
    reason = recorded
    # The model's own, before the adapter filled it in: the OpenAI SDK's choice, Pydantic AI's message.
    sdk, message = response.get("sdk"), response.get("message")
    choices = sdk.get("choices") if isinstance(sdk, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        reason = choices[0].get("finish_reason")
    elif isinstance(message, dict) and "finish_reason" in message:
        reason = message["finish_reason"]
    calls = response.get("tool_calls")
    if reason == "stop" and calls:
        reason = None
    if reason:
        return str(reason)
    if calls:
        return "tool_call"
    return str(recorded) if recorded else None


def _json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


def _arguments(call: dict[str, Any]) -> Any:
    """A tool call's arguments as an object where they parse as one: OpenAI's ``function.arguments``
    (a JSON string), LangChain's ``args``, Anthropic's ``input``."""
    function = call.get("function")
    if isinstance(function, dict) and "arguments" in function:
        arguments = function["arguments"]
    else:
        arguments = next((call[k] for k in ("args", "arguments", "input") if k in call), None)
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments  # the model's text as it gave it
    return arguments


def call_name(call: Any) -> str | None:
    """The tool a recorded tool call names (OpenAI's ``function.name``, else ``name``)."""
    if not isinstance(call, dict):
        return None
    function = call.get("function")
    name = function.get("name") if isinstance(function, dict) else call.get("name")
    return name if isinstance(name, str) else None


def tool_call_part(call: Any) -> dict[str, Any]:
    """A recorded tool call (OpenAI's or LangChain's shape) as a ``tool_call`` message part."""
    call = call if isinstance(call, dict) else {}
    return {"type": "tool_call", "id": call.get("id"), "name": call_name(call) or "", "arguments": _arguments(call)}


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    """Recorded chat messages (OpenAI-style dicts) in the conventions' shape: a role and its parts."""
    out = []
    for m in messages if isinstance(messages, list) else []:
        if not isinstance(m, dict):
            continue
        parts: list[dict[str, Any]] = []
        if m.get("content") not in (None, ""):
            parts.append({"type": "text", "content": _json(m["content"])})
        for call in m.get("tool_calls") or []:
            parts.append(tool_call_part(call))
        if m.get("role") == "tool":
            parts = [{"type": "tool_call_response", "id": m.get("tool_call_id"), "response": m.get("content")}]
        out.append({"role": m.get("role", "user"), "parts": parts})
    return out


def server_attributes(server: Any) -> dict[str, Any]:
    """``server.address`` and ``server.port`` of a recorded ``server`` (host and port only)."""
    if not isinstance(server, dict) or not isinstance(server.get("address"), str) or not server["address"]:
        return {}
    attrs: dict[str, Any] = {"server.address": server["address"]}
    if isinstance(server.get("port"), int) and not isinstance(server["port"], bool):
        attrs["server.port"] = server["port"]
    return attrs


def mcp_attributes(via: Any) -> dict[str, Any]:
    """The MCP conventions' attributes of a tool call made through an MCP server (``via`` recorded by
    ``runledger.integrations.mcp``), added to its ``execute_tool`` span as ``mcp.md`` says an
    instrumentation does when a GenAI span already traces the tool execution: ``mcp.method.name``,
    ``network.transport``, ``mcp.protocol.version``, ``mcp.session.id``, ``server.*``."""
    if not isinstance(via, dict) or via.get("protocol") != "mcp":
        return {}
    attrs: dict[str, Any] = {"mcp.method.name": str(via.get("method") or "tools/call")}
    for key, attr in (("transport", "network.transport"), ("protocol_version", "mcp.protocol.version"),
                      ("session_id", "mcp.session.id"), ("request_id", "jsonrpc.request.id")):  # fmt: skip
        if isinstance(via.get(key), str | int) and via[key] != "":
            attrs[attr] = str(via[key])
    return attrs | server_attributes(via.get("server"))
