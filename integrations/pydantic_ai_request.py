"""A Pydantic AI model request as a model step records it, and the request made again from the record.

A model step of a Pydantic AI agent (runledger.integrations.pydantic_ai) records, beside the
OpenAI-style messages the readers show, everything ``Model.request`` needs, so that whoever holds the
record alone can make the request: the sandbox's host, which makes the model calls of a re-run's guest
(the guest has no network and no credentials), or a model counterfactual's other model. The
parameters (``request_params``):

- ``history``: Pydantic AI's own message history, dumped by its type adapter, without the fields a
  new execution makes anew (``timestamp``, ``run_id``, ``conversation_id``), so a resume and a
  re-drive (whose agent run has another id) digest the same request;
- ``tools``: the function tools as ``{"type": "function", "name", "description", "parameters"}``
  (``strict`` when set), the layout a tools counterfactual rewrites;
- the model settings the sandbox allows (``temperature``, ``top_p``, ``max_tokens``, ``seed``,
  ``presence_penalty``, ``frequency_penalty``, ``parallel_tool_calls``; ``stop_sequences`` as
  ``stop``), each as a parameter of its own, and the others under ``model_settings`` (never
  ``extra_headers``, which carry credentials);
- ``output``: how the response is to be shaped (``output_mode``, ``output_tools``, ``output_object``,
  ``allow_text_output``, ``allow_image_output``, ``prompted_output_template``);
- ``native_tools``: tools the provider runs (web search, code execution), when the agent has any.

``model_request(params)`` rebuilds ``(messages, model_settings, model_request_parameters)`` from them.

Rejected: rebuilding Pydantic AI's messages from the OpenAI-style ones (a retry prompt, an
instruction and a system prompt, multimodal content would come back as something else, and a
``FunctionModel`` sees parts, not roles), and recording the ``ModelRequestParameters`` whole (most
of its fields are the agent's bookkeeping of deferred tools and telemetry, not what the model sees).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from runledger import require_extra

require_extra("pydantic-ai", "runledger.integrations.pydantic_ai_request")

from pydantic import TypeAdapter  # noqa: E402
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter  # noqa: E402
from pydantic_ai.models import ModelRequestParameters  # noqa: E402
from pydantic_ai.settings import ModelSettings  # noqa: E402
from pydantic_ai.tools import ToolDefinition  # noqa: E402
from pydantic_core import to_jsonable_python  # noqa: E402

from runledger import ConfigurationError  # noqa: E402

__all__ = ["model_request", "request_params"]

# Fields a new execution of the same step makes anew: never part of what the step asks.
VOLATILE = frozenset({"timestamp", "run_id", "conversation_id"})
# Model settings recorded as parameters of their own (the names the sandbox allows on a live call).
SETTINGS_AS_PARAMS = {
    "temperature": "temperature", "top_p": "top_p", "max_tokens": "max_tokens", "seed": "seed",
    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
    "parallel_tool_calls": "parallel_tool_calls", "stop_sequences": "stop",
}  # fmt: skip
# Settings never recorded: they carry credentials (extra_headers).
UNRECORDED_SETTINGS = frozenset({"extra_headers"})
OUTPUT_FIELDS = (
    "output_mode", "output_tools", "output_object", "allow_text_output", "allow_image_output",
    "prompted_output_template",
)  # fmt: skip
_TOOLS = TypeAdapter(list[ToolDefinition])


def _without_volatile(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_volatile(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_without_volatile(v) for v in value]
    return value


def _tool_schema(tool: ToolDefinition) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "function", "name": tool.name, "description": tool.description or "",
              "parameters": tool.parameters_json_schema}  # fmt: skip
    if tool.strict is not None:
        schema["strict"] = tool.strict
    return schema


def request_params(
    messages: Sequence[ModelMessage], settings: ModelSettings | None, parameters: ModelRequestParameters
) -> dict[str, Any]:
    """The parameters of the model step that makes this Pydantic AI request (the module's docstring)."""
    params: dict[str, Any] = {
        "history": _without_volatile(ModelMessagesTypeAdapter.dump_python(list(messages), mode="json"))
    }
    if parameters.function_tools:
        params["tools"] = [_tool_schema(t) for t in parameters.function_tools]
    rest: dict[str, Any] = {}
    for name, value in (settings or {}).items():
        if name in SETTINGS_AS_PARAMS:
            params[SETTINGS_AS_PARAMS[name]] = value
        elif name not in UNRECORDED_SETTINGS:
            rest[name] = value
    if rest:
        params["model_settings"] = to_jsonable_python(rest, fallback=str)
    # Fields a Pydantic AI release lacks are left out (the range runledger[pydantic-ai] accepts).
    params["output"] = to_jsonable_python({f: getattr(parameters, f) for f in OUTPUT_FIELDS if hasattr(parameters, f)})
    native = getattr(parameters, "native_tools", None) or getattr(parameters, "builtin_tools", None)
    if native:
        params["native_tools"] = to_jsonable_python(native, fallback=str)
    return params


def model_request(params: dict[str, Any]) -> tuple[list[ModelMessage], ModelSettings, ModelRequestParameters]:
    """``(messages, model_settings, model_request_parameters)`` of ``Model.request`` that a model step's
    parameters stand for. Raises ConfigurationError for a step recorded without Pydantic AI's own
    request (by a runledger before 0.1.0's sandbox re-runs of Pydantic AI agents) and for tools the
    provider runs (they would act at the provider with the caller's credentials, outside the record)."""
    history = params.get("history")
    if not isinstance(history, list):
        raise ConfigurationError(
            "this model step has no Pydantic AI request to make again (`history`): it was recorded by an older "
            "runledger; record the run again to re-run it in the sandbox or with another model"
        )
    if params.get("native_tools"):
        raise ConfigurationError(
            "this model step asked for tools the provider runs (native_tools): runledger makes it again only "
            "without them, as they act at the provider, outside the record"
        )
    messages = ModelMessagesTypeAdapter.validate_python(history)
    settings: dict[str, Any] = dict(params.get("model_settings") or {})
    settings.update({field: params[param] for field, param in SETTINGS_AS_PARAMS.items() if param in params})
    tools = [
        {"name": t["name"], "description": t.get("description") or None,
         "parameters_json_schema": t.get("parameters") or {}, **({"strict": t["strict"]} if "strict" in t else {})}
        for t in params.get("tools") or []
    ]  # fmt: skip
    output = dict(params.get("output") or {})
    output["output_tools"] = _TOOLS.validate_python(output.get("output_tools") or [])
    parameters = TypeAdapter(ModelRequestParameters).validate_python(
        {**output, "function_tools": _TOOLS.validate_python(tools)}
    )
    return messages, cast(ModelSettings, settings), parameters
