"""runledger as a durable-execution engine for the OpenAI Agents SDK (``openai-agents``): an agent's
model calls, function tools and handoffs are the steps of a run, so a crashed agent resumes from the
record and a recorded run re-runs in the sandbox like any runledger agent.

Built the way the durable-execution engines' integrations of the SDK are (Temporal's model activity,
DBOS's durable runner): the model is replaced by a stub whose every call is a journaled step, and the
call itself is made from the step's serialisable request (instructions, input items, settings, tool
and handoff schemas), never from live Python objects, so whoever holds the request can make it: the
agent's process, or the host answering a sandboxed re-run. Inside an agent function,
``durable(agent, run)`` (or ``agent_spec``, which does it for you) returns a copy of the agent and of
every agent it hands off to in which

- every model call (``Model.get_response``) is a ``model.called`` step (``run.model``): the request
  as messages (the instructions as a system message, then the SDK's input items as they are) with
  ``tools`` (function tools and handoffs as Responses-API function schemas), the settings a re-run
  may send (``temperature``, ``max_tokens``, ...), ``response_format`` for a structured output, and
  any other setting under ``model_settings``; the response's text, tool calls, finish reason and
  token usage for the readers, and the SDK's output items as JSON (``OpenAIAgentsResponse.output``).
  The agent gets the SDK's ``ModelResponse`` rebuilt from that record, live as on resume;
- every function tool call is a ``tool.called`` step named by the tool, its arguments the model's
  (parsed), its result the tool's as the record gives it back;
- a tool named in ``effects=`` is an effect (``Effect(key=...)``): claimed on its idempotency key
  before it acts, at most once across crashes and resumes; its function finds the attempt's
  ``EffectContext`` (``EffectContext.current().key``: pass it on as the service's idempotency key);
- a handoff is a ``tool.called`` step named by its tool (``transfer_to_refunds``) whose result is the
  agent handed to (``{"agent": "refunds"}``): a resume hands off to the same agent without running
  the handoff's ``on_handoff`` callback again.

The run's model adapter is ``OpenAIAgentsModel`` (``AgentSpec(model=OpenAIAgentsModel())``, what
``agent_spec`` sets): ``run.model`` calls it with the step's request, and it makes that request with
the agent's model (a ``Model`` the agent was given) or the one its ``ModelProvider`` names (the SDK's
``OpenAIProvider`` by default). On resume the agent function runs again from the top and each
recorded step is served from the record; past the record the run goes on live.

Not covered (each raises ``ConfigurationError`` saying so): hosted tools (web search, file search,
computer use: the model provider runs them, outside the record), MCP servers on an agent, and streaming
(``Runner.run_streamed``). An agent used as a tool (``agent.as_tool``) runs inside its tool's step: the
step is recorded, the nested agent's model calls are not steps of the run. Guardrails, hooks and
dynamic instructions run in the agent process as they are: they must be deterministic or go through
the Run API, as any runledger agent's code.

Rejected: recording at the HTTP client (the record would hold wire bytes and headers, and the host
of a sandboxed re-run could not make the call without the agent's objects), and a ``RunHooks``
observer (hooks see calls, they cannot answer them from a record).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

from runledger import require_extra

require_extra("openai-agents", "runledger.integrations.openai_agents")

from agents import (  # noqa: E402
    Agent,
    AgentOutputSchemaBase,
    FunctionTool,
    Handoff,
    Model,
    ModelProvider,
    ModelSettings,
    ModelTracing,
    OpenAIChatCompletionsModel,
    OpenAIProvider,
    OpenAIResponsesModel,
    RunConfig,
    RunContextWrapper,
    Runner,
    RunResult,
    Usage,
    handoff,
)
from agents import ModelResponse as AgentsModelResponse  # noqa: E402
from agents.items import TResponseOutputItem  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from runledger import (  # noqa: E402
    AgentSpec,
    ConfigurationError,
    ModelResponse,
    Run,
    Server,
    Tool,
    ToolFailedError,
    server_of,
)

__all__ = [
    "Effect",
    "OpenAIAgentsModel",
    "OpenAIAgentsResponse",
    "agent_spec",
    "declared_tools",
    "durable",
]

DEFAULT_MODEL = "gpt-4o"
# The model settings a sandboxed re-run may send (runledger.sandbox.branch's MODEL_PARAMS), as ``ModelSettings``
# names them: recorded as the step's parameters of those names; every other setting goes in ``model_settings``.
_SETTINGS_AS_PARAMS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "tool_choice": "tool_choice",
    "parallel_tool_calls": "parallel_tool_calls",
    "max_tokens": "max_tokens",
}


@dataclass(frozen=True)
class Effect:
    """A function tool declared as a side effect (``durable(agent, run, effects={"refund": Effect(key=...)})``).

    ``key`` builds the idempotency key from the tool's arguments (a JSON object): the business
    identity, e.g. ``lambda a: f"refund:{a['order']}"``, never a digest of model-generated text.
    ``effect_class`` is ``write`` or ``irreversible``; ``reconcile`` (``key -> the tool's result`` or
    ``runledger.NOT_FOUND``, sync or async), asked when a crash left the effect in doubt, says whether
    the external system did it: its value is recorded as the tool's result and handed to the model.
    ``lease_s`` is the claim's lease (runledger.sdk.context)."""

    key: Callable[[Any], str]
    effect_class: Literal["write", "irreversible"] = "write"
    reconcile: Callable[[str], Any] | None = None
    lease_s: float | None = None


class OpenAIAgentsResponse(ModelResponse):
    """A ``ModelResponse`` that also carries the SDK's output items as JSON (``output``), its response id
    and its usage details: what the SDK's ``ModelResponse`` is rebuilt from on every path."""

    output: list[dict[str, Any]] = []
    response_id: str | None = None
    usage_details: dict[str, Any] = {}
    # Who answered, as LangChain's replies say it (``model_provider``): "openai" for the SDK's OpenAI models.
    metadata: dict[str, Any] = {}


@dataclass
class _Call:
    """The model a step's call goes to: the agent's own ``Model`` (``model``) or the provider's ``name``."""

    name: str
    model: Model | None
    tracing: ModelTracing


_CALL: ContextVar[_Call | None] = ContextVar("runledger_openai_agents_call", default=None)


class OpenAIAgentsModel:
    """The model adapter of a run whose agent is an OpenAI Agents SDK agent made ``durable``.

    ``complete(messages, **params)`` makes the call a model step records (its request is all it
    needs) with the agent's ``Model`` when the agent has one, else with ``provider.get_model(name)``;
    ``name`` (the recorded model name) is the agent's model name, else ``model``. ``provider`` is a
    ``ModelProvider`` or a function that makes one (called once, at the first live call: a sandbox
    guest, which never calls the model itself, makes no client), by default the SDK's
    ``OpenAIProvider()``. The host of a sandboxed re-run calls the model of the branch: ``model``."""

    response_type = OpenAIAgentsResponse
    retry = None  # the model's own client retries (the SDK's); each step is one attempt here

    def __init__(
        self,
        provider: ModelProvider | Callable[[], ModelProvider] | None = None,
        model: str = DEFAULT_MODEL,
    ) -> None:
        self._provider_or_factory = provider
        self._provider: ModelProvider | None = provider if isinstance(provider, ModelProvider) else None
        self.default_model = model

    @property
    def name(self) -> str:
        call = _CALL.get()
        return call.name if call is not None else self.default_model

    @name.setter
    def name(self, value: str) -> None:  # ModelAdapter's name is settable: it sets the default
        self.default_model = value

    def provider(self) -> ModelProvider:
        if self._provider is None:
            factory = self._provider_or_factory
            self._provider = factory() if callable(factory) else OpenAIProvider()
        return self._provider

    async def complete(self, messages: list[dict[str, Any]], **params: Any) -> ModelResponse:
        call = _CALL.get()
        model = call.model if call is not None and call.model is not None else None
        if model is None:
            model = self.provider().get_model(self.name)
        tracing = call.tracing if call is not None else ModelTracing.DISABLED
        response = await model.get_response(**_call_arguments(messages, params), tracing=tracing)
        openai_sdk = isinstance(model, OpenAIResponsesModel | OpenAIChatCompletionsModel)
        return summary(response).model_copy(
            update={"server": model_server(model), "metadata": {"model_provider": "openai"} if openai_sdk else {}}
        )


# -- the request: what a model step records, and the call made from it ----------------------------------


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_unset=True)
    return value


def _tool_schema(tool: Any) -> dict[str, Any]:
    if isinstance(tool, FunctionTool):
        return {"type": "function", "name": tool.name, "description": tool.description,
                "parameters": tool.params_json_schema, "strict": tool.strict_json_schema}  # fmt: skip
    raise ConfigurationError(
        f"tool {getattr(tool, 'name', type(tool).__name__)!r} is a {type(tool).__name__}: runledger records "
        "function tools and handoffs; a hosted tool runs at the model provider, outside the record"
    )


def _handoff_schema(h: Handoff[Any, Any]) -> dict[str, Any]:
    return {"type": "function", "name": h.tool_name, "description": h.tool_description,
            "parameters": h.input_json_schema, "strict": h.strict_json_schema, "handoff": h.agent_name}  # fmt: skip


def request_of(
    system_instructions: str | None,
    input: str | list[Any],
    model_settings: ModelSettings,
    tools: Sequence[Any],
    output_schema: AgentOutputSchemaBase | None,
    handoffs: Sequence[Handoff[Any, Any]],
    *,
    previous_response_id: str | None = None,
    conversation_id: str | None = None,
    prompt: Any = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A model call of the SDK as the (messages, params) of a model step: everything the call needs,
    as JSON (``_call_arguments`` makes the call from it again)."""
    messages: list[dict[str, Any]] = []
    if system_instructions is not None:
        messages.append({"role": "system", "content": system_instructions})
    items = [{"role": "user", "content": input}] if isinstance(input, str) else [_plain(i) for i in input]
    messages.extend(items)
    params: dict[str, Any] = {}
    schemas = [_tool_schema(t) for t in tools] + [_handoff_schema(h) for h in handoffs]
    if schemas:
        params["tools"] = schemas
    settings = {k: v for k, v in model_settings.to_json_dict().items() if v is not None}
    for field, param in _SETTINGS_AS_PARAMS.items():
        if field in settings:
            params[param] = settings.pop(field)
    if settings:
        params["model_settings"] = settings
    if output_schema is not None and not output_schema.is_plain_text():
        params["response_format"] = {"type": "json_schema", "name": output_schema.name(),
                                     "schema": output_schema.json_schema(),
                                     "strict": output_schema.is_strict_json_schema()}  # fmt: skip
    for name, value in (("previous_response_id", previous_response_id), ("conversation_id", conversation_id),
                        ("prompt", prompt)):  # fmt: skip
        if value is not None:
            params[name] = _plain(value)
    return messages, params


class _RecordedOutputSchema(AgentOutputSchemaBase):
    """A structured output's schema as a step recorded it (``response_format``)."""

    def __init__(self, recorded: Mapping[str, Any]) -> None:
        self._recorded = dict(recorded)

    def is_plain_text(self) -> bool:
        return False

    def name(self) -> str:
        return str(self._recorded.get("name", "output"))

    def json_schema(self) -> dict[str, Any]:
        return dict(self._recorded.get("schema") or {})

    def is_strict_json_schema(self) -> bool:
        return bool(self._recorded.get("strict", True))

    def validate_json(self, json_str: str) -> Any:
        return json.loads(json_str)  # never asked: the agent's own schema validates its output


def _declared_order(schema: Any) -> Any:
    """A JSON schema from the record (whose objects' keys are sorted) with each object's ``properties`` in
    the order of its ``required`` list, the order they were declared in (a strict schema requires every
    property): the SDK derives ``required`` from that order again, and a model generates arguments in it."""
    if isinstance(schema, list):
        return [_declared_order(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _declared_order(v) for k, v in schema.items()}
    properties, required = out.get("properties"), out.get("required")
    if isinstance(properties, dict) and isinstance(required, list):
        first = [k for k in required if isinstance(k, str) and k in properties]
        out["properties"] = {k: properties[k] for k in [*first, *(k for k in properties if k not in first)]}
    return out


async def _never_invoked(ctx: RunContextWrapper[Any], arguments: str) -> Any:
    raise ConfigurationError("a tool rebuilt from a model step's request is shown to the model, never called")


def _call_arguments(messages: list[dict[str, Any]], params: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of ``Model.get_response`` (but ``tracing``) that a step's request stands for."""
    messages = list(messages)
    instructions = None
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        instructions = messages.pop(0)["content"]
    tools: list[Any] = []
    handoffs: list[Handoff[Any, Any]] = []
    for schema in params.get("tools") or []:
        if "handoff" in schema:
            handoffs.append(Handoff(
                tool_name=schema["name"], tool_description=schema.get("description") or "",
                input_json_schema=_declared_order(schema.get("parameters") or {}), agent_name=schema["handoff"],
                on_invoke_handoff=_never_invoked, strict_json_schema=schema.get("strict", True),
            ))  # fmt: skip
        else:
            tools.append(FunctionTool(
                name=schema["name"], description=schema.get("description") or "",
                params_json_schema=_declared_order(schema.get("parameters") or {}), on_invoke_tool=_never_invoked,
                strict_json_schema=schema.get("strict", True),
            ))  # fmt: skip
    settings = dict(params.get("model_settings") or {})
    settings.update({field: params[param] for field, param in _SETTINGS_AS_PARAMS.items() if param in params})
    output = params.get("response_format")
    return {
        "system_instructions": instructions,
        "input": messages,
        "model_settings": ModelSettings(**settings),
        "tools": tools,
        "output_schema": _RecordedOutputSchema(_declared_order(output)) if isinstance(output, dict) else None,
        "handoffs": handoffs,
        "previous_response_id": params.get("previous_response_id"),
        "conversation_id": params.get("conversation_id"),
        "prompt": params.get("prompt"),
    }


# -- the response: recorded, and rebuilt from the record -----------------------------------------------


def model_server(model: Any) -> Server | None:
    """The host and port an SDK model calls: its OpenAI client's base URL. The SDK's two OpenAI models
    keep their client as ``_client`` and show it nowhere else; a model without one (a fake, another
    provider's) records no server."""
    client = getattr(model, "_client", None)
    return server_of(getattr(client, "base_url", None)) if client is not None else None


def summary(response: AgentsModelResponse) -> OpenAIAgentsResponse:
    """What the record keeps of the SDK's ``ModelResponse``: its output items as JSON, its text, its
    function calls as OpenAI-style tool calls, a finish reason and token usage for the readers."""
    output = [_plain(item) for item in response.output]
    text = "".join(
        part.get("text", "")
        for item in output if item.get("type") == "message"
        for part in item.get("content") or [] if part.get("type") == "output_text"
    )  # fmt: skip
    calls = [
        {"id": item.get("call_id"), "type": "function",
         "function": {"name": item.get("name"), "arguments": item.get("arguments", "")}}
        for item in output if item.get("type") == "function_call"
    ]  # fmt: skip
    usage = response.usage
    details = {
        "requests": usage.requests,
        "total_tokens": usage.total_tokens,
        "input_tokens_details": _plain(usage.input_tokens_details),
        "output_tokens_details": _plain(usage.output_tokens_details),
    }
    return OpenAIAgentsResponse(
        content=text, tool_calls=calls, finish_reason="tool_calls" if calls else "stop",
        input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
        output=output, response_id=response.response_id, usage_details=details,
    )  # fmt: skip


def _item_classes() -> dict[str, type[BaseModel]]:
    """The SDK's output item classes by their ``type``."""
    classes: dict[str, type[BaseModel]] = {}

    def visit(tp: Any) -> None:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = tp.model_fields.get("type")
            for literal in typing.get_args(field.annotation) if field is not None else ():
                classes.setdefault(str(literal), tp)
            return
        for arg in typing.get_args(tp):
            visit(arg)

    visit(TResponseOutputItem)
    return classes


_ITEMS = _item_classes()


def rebuilt(response: OpenAIAgentsResponse) -> AgentsModelResponse:
    """The SDK's ``ModelResponse`` from a step's record: each output item built as the SDK builds one
    from the wire (``construct``, keys in the record's order), the usage from the recorded counts."""
    items: list[Any] = []
    for item in response.output:
        cls = _ITEMS.get(str(item.get("type")))
        if cls is None:
            raise ConfigurationError(
                f"a recorded model output item of type {item.get('type')!r} is not one this version of "
                "openai-agents knows: resume with the version that recorded the run"
            )
        items.append(cls.construct(**item))
    details = response.usage_details
    usage = Usage(
        requests=int(details.get("requests", 1)),
        input_tokens=response.input_tokens,
        output_tokens=response.output_tokens,
        total_tokens=int(details.get("total_tokens", response.input_tokens + response.output_tokens)),
    )
    # The details' fields differ between SDK versions: built as the SDK builds them from the wire.
    if isinstance(details.get("input_tokens_details"), dict):
        usage.input_tokens_details = InputTokensDetails.construct(**details["input_tokens_details"])
    if isinstance(details.get("output_tokens_details"), dict):
        usage.output_tokens_details = OutputTokensDetails.construct(**details["output_tokens_details"])
    return AgentsModelResponse(output=items, usage=usage, response_id=response.response_id)


# -- the durable copies: the model stub, tools and handoffs as steps -------------------------------------


class _RecordedModel(Model):
    """The model of a durable agent: each call a model step of ``run``, answered from the record when
    it holds the step. ``inner`` is the agent's own ``Model`` (None: the provider's ``name``)."""

    def __init__(self, run: Run, name: str, inner: Model | None) -> None:
        self._run = run
        self._name = name
        self._inner = inner

    async def get_response(
        self,
        system_instructions: str | None,
        input: Any,
        model_settings: ModelSettings,
        tools: list[Any],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff[Any, Any]],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None = None,
        conversation_id: str | None = None,
        prompt: Any = None,
    ) -> AgentsModelResponse:
        messages, params = request_of(
            system_instructions, input, model_settings, tools, output_schema, handoffs,
            previous_response_id=previous_response_id, conversation_id=conversation_id, prompt=prompt,
        )  # fmt: skip
        token = _CALL.set(_Call(self._name, self._inner, tracing))
        try:
            response = await self._run.model(messages, **params)
        except ToolFailedError as exc:
            if isinstance(exc.__cause__, Exception):
                raise exc.__cause__ from None  # the model's own error, recorded; the SDK's handling sees it
            raise
        finally:
            _CALL.reset(token)
        if not isinstance(response, OpenAIAgentsResponse):
            raise ConfigurationError(
                "a run whose agent is an OpenAI Agents SDK agent needs AgentSpec(model=OpenAIAgentsModel()) "
                f"(its model adapter answered {type(response).__name__})"
            )
        return rebuilt(response)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise ConfigurationError(
            "a durable OpenAI Agents SDK agent runs with Runner.run (or run_sync): streaming "
            "(Runner.run_streamed) is not recorded"
        )


def _arguments(arguments: str) -> Any:
    """A tool call's arguments as the step records them: the JSON object the model sent, in its order."""
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return arguments  # not JSON: recorded as sent; the tool's own parsing reports it


def _declared(
    name: str, fn: Callable[[Any], Awaitable[Any]], effect: Effect | None, description: str | None
) -> Tool[Any, Any]:
    """The step of a function tool (``description``: the tool's own, which the step records as OTel's
    ``gen_ai.tool.description``)."""
    if effect is None:
        return Tool(name, fn, description=description or None)
    reconcile = None if effect.reconcile is None else _reconciler(effect.reconcile)
    return Tool(name, fn, effect_class=effect.effect_class, key=effect.key, reconcile=reconcile, lease_s=effect.lease_s,
                description=description or None)  # fmt: skip


def _reconciler(reconcile: Callable[[str], Any]) -> Callable[[str], Awaitable[Any]]:
    async def reconciled(key: str) -> Any:
        found = reconcile(key)
        return await found if inspect.isawaitable(found) else found

    return reconciled


async def _step(run: Run, declared: Tool[Any, Any], args: Any, tool_call_id: str | None) -> Any:
    try:
        return await run.tool(declared, args, tool_call_id=tool_call_id)
    except ToolFailedError as exc:
        if isinstance(exc.__cause__, Exception):
            raise exc.__cause__ from None  # the tool's own error, recorded
        raise


def _durable_tool(run: Run, tool: FunctionTool, effect: Effect | None) -> FunctionTool:
    original = tool.on_invoke_tool

    async def invoke(ctx: ToolContext[Any], arguments: str) -> Any:
        async def call(args: Any) -> Any:  # the SDK's own invocation: parsing, validation, failure handling
            return await original(ctx, arguments)

        declared = _declared(tool.name, call, effect, tool.description)
        return await _step(run, declared, _arguments(arguments), ctx.tool_call_id or None)

    return dataclasses.replace(tool, on_invoke_tool=invoke)


class _Graph:
    """The durable copies of an agent and of every agent it hands off to, made once per run."""

    def __init__(self, run: Run, effects: Mapping[str, Effect], model: str, agents: Iterable[Agent[Any]]) -> None:
        self.run = run
        self.effects = dict(effects)
        self.model = model
        self._copies: dict[int, Agent[Any]] = {}
        self._made: set[int] = set()  # the copies' own ids: a copy is durable already
        self._by_name: dict[str, Agent[Any]] = {}
        self._targets: set[str] = set()  # the agents custom Handoff objects name
        for extra in agents:
            self.copy(extra)

    def copy(self, agent: Agent[Any], instructions: Any = None) -> Agent[Any]:
        if id(agent) in self._made:
            return agent
        found = self._copies.get(id(agent))
        if found is not None and instructions is None:
            return found
        if agent.mcp_servers:
            raise ConfigurationError(
                f"agent {agent.name!r}: MCP servers are not recorded here (runledger.integrations.mcp)"
            )
        inner = agent.model if isinstance(agent.model, Model) else None
        name = agent.model if isinstance(agent.model, str) and agent.model else self.model
        if inner is not None:
            name = str(getattr(inner, "model", None) or self.model)
        tools = []
        for tool in agent.tools:
            _tool_schema(tool)  # refuses what is not recorded, before anything runs
            assert isinstance(tool, FunctionTool)
            tools.append(_durable_tool(self.run, tool, self.effects.get(tool.name)))
        copy = agent.clone(
            model=_RecordedModel(self.run, name, inner),
            tools=tools,
            handoffs=[],
            **({"instructions": instructions} if instructions is not None else {}),
        )
        self._made.add(id(copy))
        self._copies.setdefault(id(agent), copy)
        self._by_name.setdefault(agent.name, copy)
        copy.handoffs = [self._durable_handoff(h) for h in agent.handoffs]
        return copy

    def check_targets(self) -> None:
        """Refuse, before anything runs, a custom ``Handoff`` to an agent a resume could not hand off to."""
        unknown = sorted(self._targets - set(self._by_name))
        if unknown:
            raise ConfigurationError(
                f"a handoff goes to agent(s) {', '.join(map(repr, unknown))} that the agent does not reach as "
                "Agent objects in its handoffs (a custom Handoff hides its agent until it is invoked): pass "
                "them as agents=[...] so a resume hands off to them without invoking the handoff again"
            )

    def _durable_handoff(self, entry: Agent[Any] | Handoff[Any, Any]) -> Handoff[Any, Any]:
        if isinstance(entry, Agent):
            made: Handoff[Any, Any] = handoff(self.copy(entry))
        else:
            made = entry
            self._targets.add(made.agent_name)
        original = made.on_invoke_handoff
        name = made.tool_name

        async def invoke(ctx: RunContextWrapper[Any], arguments: str) -> Any:
            target: list[Agent[Any]] = []

            async def call(args: Any) -> dict[str, str]:
                agent = await original(ctx, arguments)
                target.append(agent)
                return {"agent": agent.name}

            step = Tool(name, call, description=made.tool_description or None)
            handed = await _step(self.run, step, _arguments(arguments), None)
            if target:
                return self.copy(target[0])
            agent_name = handed.get("agent") if isinstance(handed, dict) else None
            found = self._by_name.get(str(agent_name))
            if found is None:
                raise ConfigurationError(
                    f"handoff {name!r} handed off to agent {agent_name!r} in the record, which this agent does "
                    "not reach by its handoffs: pass it to durable(..., agents=[...])"
                )
            return found

        return dataclasses.replace(made, on_invoke_handoff=invoke)


def durable(
    agent: Agent[Any],
    run: Run,
    *,
    effects: Mapping[str, Effect] | None = None,
    model: str = DEFAULT_MODEL,
    instructions: str | None = None,
    agents: Iterable[Agent[Any]] = (),
) -> Agent[Any]:
    """A copy of ``agent`` (and of every agent it hands off to) whose model calls, function tools and
    handoffs are steps of ``run``: run it with ``Runner.run`` inside the agent function. ``effects``
    maps tool names to their ``Effect``; ``model`` names the model of an agent that names none;
    ``instructions`` replaces the agent's own (``agent_spec`` passes ``run.prompt``); ``agents`` are
    agents reached only through custom ``Handoff`` objects, so a resume can hand off to them by name.

    Raises ConfigurationError for what is not recorded (hosted tools, MCP servers)."""
    graph = _Graph(run, effects or {}, model, agents)
    made = graph.copy(agent, instructions)
    graph.check_targets()
    return made


def declared_tools(agent: Agent[Any], effects: Mapping[str, Effect] | None = None) -> list[Tool[Any, Any]]:
    """The function tools and handoffs of ``agent`` and of the agents it hands off to, as runledger tools
    (name, JSON schema, description, and the effect declaration of those in ``effects``), for
    ``AgentSpec(tools=...)``: their schema hashes are the run's ``tool_schema_hashes``, so a tool whose
    arguments changed since a run was recorded is a version change its resume refuses. Called by the
    host of a sandboxed live re-run, a tool runs the agent's function (a handoff answers the agent it
    hands off to)."""
    effects = effects or {}
    found: dict[str, Tool[Any, Any]] = {}
    seen: set[int] = set()

    def visit(current: Agent[Any]) -> None:
        if id(current) in seen:
            return
        seen.add(id(current))
        for tool in current.tools:
            if isinstance(tool, FunctionTool) and tool.name not in found:
                found[tool.name] = _host_tool(tool, effects.get(tool.name))
        for entry in current.handoffs:
            made = handoff(entry) if isinstance(entry, Agent) else entry
            if made.tool_name not in found:
                answer = {"agent": made.agent_name}
                found[made.tool_name] = Tool(made.tool_name, _answer(answer), schema=made.input_json_schema or {},
                                             description=made.tool_description)  # fmt: skip
            if isinstance(entry, Agent):
                visit(entry)

    visit(agent)
    return [found[n] for n in sorted(found)]


def _answer(value: dict[str, str]) -> Callable[[Any], Awaitable[dict[str, str]]]:
    async def answer(args: Any) -> dict[str, str]:
        return dict(value)

    return answer


def _host_tool(tool: FunctionTool, effect: Effect | None) -> Tool[Any, Any]:
    async def call(args: Any) -> Any:
        arguments = args if isinstance(args, str) else json.dumps(args)
        ctx = ToolContext(context=None, tool_name=tool.name, tool_call_id="", tool_arguments=arguments)
        return await tool.on_invoke_tool(ctx, arguments)

    schema, description = tool.params_json_schema, tool.description
    if effect is None:
        return Tool(tool.name, call, schema=schema, description=description)
    return Tool(tool.name, call, effect_class=effect.effect_class, key=effect.key, schema=schema,
                description=description, lease_s=effect.lease_s)  # fmt: skip


def agent_spec(
    agent: Agent[Any],
    name: str | None = None,
    *,
    effects: Mapping[str, Effect] | None = None,
    agent_version: str | None = None,
    model: OpenAIAgentsModel | None = None,
    run_config: Callable[[Run], RunConfig] | None = None,
    context: Callable[[Run], Any] | None = None,
    max_turns: int = 10,
    agents: Iterable[Agent[Any]] = (),
    result: Callable[[RunResult], Any] | None = None,
    **spec: Any,
) -> AgentSpec:
    """A runledger agent (``start_run``, ``resume_run``, ``runledger run --agent module:attr``, ``runledger
        rerun``) that runs ``agent`` with ``Runner.run`` on the run's input (a string, or an object whose
        ``input`` is) and returns its final output as JSON.

        The spec's ``prompt`` is the agent's instructions (when they are a string), so ``prompt_hash``
        pins them and a counterfactual of the prompt (``runledger rerun --mode counterfactual --set
        prompt=TEXT``) runs the agent with new instructions. ``effects`` maps tool names to their
        ``Effect``; ``run_config(run)`` and ``context(run)`` build the SDK's ``RunConfig`` and the run
        context; ``result(run_result)`` makes the agent's output from the SDK's ``RunResult`` (by
    default its final output as JSON); ``spec`` is passed on to ``AgentSpec`` (budgets, data policy, durability)."""
    run_name = name or agent.name
    adapter = model or OpenAIAgentsModel()
    extra = tuple(agents)
    prompt = agent.instructions if isinstance(agent.instructions, str) else ""

    async def run_agent(run: Run) -> Any:
        given = run.input.get("input") if isinstance(run.input, dict) else run.input
        instructions = run.prompt if isinstance(agent.instructions, str) and run.prompt else None
        made = durable(agent, run, effects=effects, model=adapter.default_model, instructions=instructions,
                       agents=extra)  # fmt: skip
        done = await Runner.run(
            made,
            given if isinstance(given, str | list) else json.dumps(given),
            context=context(run) if context is not None else None,
            max_turns=max_turns,
            run_config=run_config(run) if run_config is not None else None,
        )
        if result is not None:
            return result(done)
        output = done.final_output
        return output.model_dump(mode="json") if isinstance(output, BaseModel) else output

    spec.setdefault("tools", declared_tools(agent, effects))
    spec.setdefault("prompt", prompt)
    return AgentSpec(run_name, run_agent, adapter, agent_version=agent_version, **spec)
