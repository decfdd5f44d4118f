"""runledger.integrations.otel_semconv: the GenAI conventions' names from recorded payloads, without a server."""

from __future__ import annotations

from typing import Any

import pytest

from runledger.integrations.otel_semconv import (
    FALLBACK_PROVIDER,
    finish_reason,
    operation_name,
    provider_name,
    request_attributes,
    response_attributes,
    tool_call_part,
)


@pytest.mark.parametrize(
    ("model", "provider"),
    [
        ("gpt-4o-mini", "openai"), ("o3-mini", "openai"), ("o1", "openai"), ("claude-sonnet-4-5", "anthropic"),
        ("anthropic:claude-3-haiku", "anthropic"), ("openai/gpt-4.1", "openai"), ("gemini-2.5-pro", "gcp.gen_ai"),
        ("google_vertexai:gemini-2.0", "gcp.vertex_ai"), ("mistral-large-latest", "mistral_ai"),
        ("command-r-plus", "cohere"), ("deepseek-chat", "deepseek"), ("grok-4", "x_ai"), ("sonar-pro", "perplexity"),
        ("us.anthropic.claude-3-7-sonnet-20250219-v1:0", "aws.bedrock"), ("groq/llama-3.1-8b", "groq"),
        ("scripted-support-1", FALLBACK_PROVIDER), ("llama3", FALLBACK_PROVIDER), ("o-series", FALLBACK_PROVIDER),
    ],
)  # fmt: skip
def test_the_provider_of_a_model_id(model: str, provider: str) -> None:
    assert provider_name(model) == provider


def test_the_integration_names_the_provider_before_the_model_id() -> None:
    openai_request = {"messages": [], "params": {"endpoint": "/chat/completions", "model": "deepseek-chat"}}
    assert provider_name("deepseek-chat", openai_request, {}) == "openai"  # OpenAI's client and wire format
    langchain = {"metadata": {"model_provider": "google_genai"}}
    assert provider_name("my-bot", None, langchain) == "gcp.gemini"
    assert provider_name("my-bot", None, {"metadata": {"model_provider": "acme"}}) == "acme"


def test_request_parameters_in_the_conventions_types() -> None:
    request = {"params": {"temperature": 1, "top_p": 0.5, "max_completion_tokens": 9, "seed": 3, "n": 1,
                          "stop": "END", "stream": False, "response_format": {"type": "json_schema"}}}  # fmt: skip
    assert request_attributes(request) == {
        "gen_ai.request.temperature": 1.0, "gen_ai.request.top_p": 0.5, "gen_ai.request.max_tokens": 9,
        "gen_ai.request.seed": 3, "gen_ai.request.stop_sequences": ["END"], "gen_ai.output.type": "json",
    }  # fmt: skip
    assert isinstance(request_attributes(request)["gen_ai.request.temperature"], float)
    assert request_attributes({"params": {"stream": True, "n": 3}}) == {
        "gen_ai.request.stream": True, "gen_ai.request.choice.count": 3,
    }  # fmt: skip
    assert request_attributes({"$sealed": "..."}) == request_attributes(None) == {}


def test_response_id_and_model_from_the_sdk_or_the_reply_metadata() -> None:
    assert response_attributes({"sdk": {"id": "chatcmpl-1", "model": "gpt-4o-2024-08-06"}}) == {
        "gen_ai.response.id": "chatcmpl-1", "gen_ai.response.model": "gpt-4o-2024-08-06",
    }  # fmt: skip
    assert response_attributes({"metadata": {"id": "msg_1", "model_name": "claude-x"}}) == {
        "gen_ai.response.id": "msg_1", "gen_ai.response.model": "claude-x",
    }  # fmt: skip
    assert response_attributes({"content": "hi", "finish_reason": "stop"}) == {}


CALL: dict[str, Any] = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ({"finish_reason": "stop", "tool_calls": []}, "stop"),
        ({"finish_reason": "tool_calls", "tool_calls": [CALL]}, "tool_calls"),
        ({"finish_reason": "stop", "tool_calls": [CALL]}, "tool_call"),  # the adapter's default, not the model's
        ({"finish_reason": "stop", "tool_calls": [CALL], "sdk": {"choices": [{"finish_reason": None}]}}, "tool_call"),
        ({"finish_reason": "stop", "tool_calls": [], "sdk": {"choices": [{"finish_reason": "length"}]}}, "length"),
        ({"finish_reason": "", "tool_calls": []}, None),
        ({"finish_reason": "stop", "tool_calls": [], "message": {"finish_reason": None}}, "stop"),  # a text turn
    ],
)
def test_a_tool_call_turn_without_a_reason_is_not_stop(response: dict[str, Any], reason: str | None) -> None:
    assert finish_reason(response) == reason


def test_tool_call_parts_carry_their_arguments_in_every_recorded_shape() -> None:
    assert tool_call_part(CALL) == {"type": "tool_call", "id": "c1", "name": "f", "arguments": {"a": 1}}
    langchain = {"name": "lookup", "args": {"order": "o-1"}, "id": "call-1", "type": "tool_call"}
    assert tool_call_part(langchain)["arguments"] == {"order": "o-1"}
    anthropic = {"name": "lookup", "input": {"order": "o-2"}, "id": "toolu_1"}
    assert tool_call_part(anthropic)["arguments"] == {"order": "o-2"}
    broken = {"id": "c2", "function": {"name": "f", "arguments": '{"a": '}}
    assert tool_call_part(broken)["arguments"] == '{"a": '  # as the model gave it


def test_an_embeddings_call_is_an_embeddings_operation() -> None:
    request = {"messages": [], "params": {"endpoint": "/embeddings", "encoding_format": "float", "dimensions": 256}}
    assert operation_name(request) == "embeddings"
    assert operation_name({"params": {"endpoint": "/chat/completions"}}) == operation_name(None) == "chat"
    assert request_attributes(request) == {
        "gen_ai.request.encoding_formats": ["float"], "gen_ai.embeddings.dimension.count": 256,
    }  # fmt: skip
    assert provider_name("text-embedding-3-small", request, None) == "openai"


def test_pydantic_ai_records_are_read_as_their_own_shape() -> None:
    request = {"messages": [], "params": {"model_settings": {"temperature": 0.3, "stop_sequences": ["X"]}}}
    assert request_attributes(request) == {"gen_ai.request.temperature": 0.3, "gen_ai.request.stop_sequences": ["X"]}
    message = {"provider_name": "anthropic", "model_name": "claude-x-1", "provider_response_id": "msg_9",
               "finish_reason": None}  # fmt: skip
    response = {"finish_reason": "tool_calls", "tool_calls": [CALL], "message": message}
    assert provider_name("test:test", None, response) == "anthropic"
    assert provider_name("google-gla:gemini-2.5-flash") == "gcp.gemini"
    assert provider_name("function:my_model", None, {"message": {"provider_name": None}}) == FALLBACK_PROVIDER
    assert response_attributes(response) == {"gen_ai.response.id": "msg_9", "gen_ai.response.model": "claude-x-1"}
    assert finish_reason(response) == "tool_call"  # the model gave none; the adapter's "tool_calls" is its own
