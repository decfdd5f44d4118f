"""runledger as a durable-execution engine for Pydantic AI: an agent's model requests and tool calls
are the steps of a run, so a crashed agent resumes from the record.

Built the way Pydantic AI's own Temporal, DBOS and Prefect integrations are, on its public
``pydantic_ai.durable_exec`` surface: ``RunledgerDurability`` is a durability capability
(``Agent(..., capabilities=[RunledgerDurability()])``) whose operation backend makes each durable
unit a runledger step. The durable container is a runledger run: inside an agent function, under
``recording(run)`` (or through ``agent_spec``, which does it for you), every ``agent.run`` /
``agent.iter`` / ``agent.run_stream`` of the agent records

- each model request as a ``model.called`` step (``run.model``): the request as OpenAI-style messages
  (no timestamps, so a resume digests the same request), the reply's text, tool calls, finish
  reason and token usage for the readers (``runledger show``, the projection, OTel), and the whole
  Pydantic AI ``ModelResponse`` as JSON (``PydanticAIResponse.message``, dumped and loaded by Pydantic
  AI's own type adapters, so it round-trips);
- each tool call as a ``tool.called`` step (``run.tool``) named by the tool, its arguments the
  model's; the result is Pydantic AI's recorded form of a tool call (its value, or a control-flow
  signal such as ``ModelRetry`` carried as data), so a replayed retry prompt is the same;
- a tool declared in ``effects=`` as an effect (``Effect(key=...)``): claimed on its idempotency key
  before it acts and applied at most once across crashes and resumes (runledger.sdk.effect_step);
  its function finds the attempt's ``EffectContext`` (``EffectContext.current().key``: pass it to the
  service as its idempotency key).

On resume (``resume_run``) the agent function runs again from the top; each recorded step is served
from the record (the model is not called, the tool function does not run) and Pydantic AI gets the
same ``ModelResponse`` and tool result it got live; past the record the run goes on live. The run's
model adapter must be ``PydanticAIModel`` (``AgentSpec(model=PydanticAIModel())``, what ``agent_spec``
sets): ``run.model`` calls it, and it makes the Pydantic AI request the backend set up for the step.

Not journaled, run in the container as they are: tool discovery (``get_tools``; a function
toolset's is deterministic), argument validation, and waits (``durable_sleep`` is Pydantic AI's
in-process sleep: a resume waits again). Other durable operations (event-stream handlers, token
counts, capability operations) are read-tool steps named ``pydantic_ai:<operation>``. Tool calls run
one after another inside a run (``sequential_tools_in_durable_context``), so step numbers follow the
model's order of tool calls whatever the scheduling. What runs in the agent function outside
model requests and tool calls (a clock, randomness, I/O) must be deterministic or go through the
Run API, as for any runledger agent.

Rejected: a ``WrapperAgent`` with a wrapped model and wrapped toolsets of our own (what the
integrations did before Pydantic AI's durability capability): Pydantic AI now owns that machinery and
asks engines not to copy it; and ``open_run`` (a run continued without replay), since a Pydantic AI
agent does not recover by itself: replaying its model responses is what rebuilds its state.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from runledger import require_extra

require_extra("pydantic-ai", "runledger.integrations.pydantic_ai")

from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.durable_exec import (  # noqa: E402
    JSON_CODEC,
    BaseDurabilityCapability,
    BoundDurableOperation,
    DurabilityEngineSpec,
    DurableOperation,
    DurableOperationBackend,
    ModelCompactMessagesId,
    ModelRequestId,
    ModelRequestParams,
    ToolsetCallToolId,
    ToolsetValidateToolArgumentsId,
    conversation_id_from_run_id,
    durable_unit_scope,
)
from pydantic_ai.messages import ModelMessage  # noqa: E402
from pydantic_ai.messages import ModelResponse as PydanticModelResponse  # noqa: E402
from pydantic_ai.models import Model, infer_model  # noqa: E402
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset  # noqa: E402
from pydantic_core import ValidationError, to_jsonable_python  # noqa: E402

from runledger import (  # noqa: E402
    AgentSpec,
    ConfigurationError,
    ModelResponse,
    Run,
    SyncRun,
    Tool,
    ToolFailedError,
    server_of,
)
from runledger.integrations.pydantic_ai_request import model_request, request_params  # noqa: E402

__all__ = [
    "Effect",
    "PydanticAIModel",
    "PydanticAIResponse",
    "RunledgerDurability",
    "agent_spec",
    "declared_tools",
    "recording",
    "request_messages",
]

DEFAULT_MODEL_NAME = "pydantic-ai"
T = TypeVar("T")
R = TypeVar("R", Run, SyncRun)


@dataclass
class _Container:
    """The run Pydantic AI agents record into, and how many agent runs it started (their ids). ``loop``:
    the event loop that owns ``run`` when the agents run on another (``agent.run_sync`` in an agent
    function made with ``sync_agent``, whose ``SyncRun`` hands its ``async_run`` and ``loop``)."""

    run: Run
    agent_runs: int = 0
    loop: asyncio.AbstractEventLoop | None = None


_CONTAINER: ContextVar[_Container | None] = ContextVar("runledger_pydantic_ai_run", default=None)


@contextmanager
def recording(run: R) -> Iterator[R]:
    """Make ``run`` the durable container of the Pydantic AI agents called inside the block: the model
    requests and tool calls of every agent with ``RunledgerDurability`` become steps of ``run``, and
    an agent run started without a ``run_id`` gets ``<run id>-pa<n>`` (its n-th in the block, the same
    on resume), its conversation id derived from it.

    ``run`` is an agent function's ``Run`` (call ``await agent.run(...)``, ``agent.iter``,
    ``agent.run_stream``) or the ``SyncRun`` of a blocking one (``runledger.sync_agent``), where
    ``agent.run_sync(...)`` works too: Pydantic AI runs the agent on an event loop of the function's
    thread, and each step is made on the run's own loop. ``agent.run_sync`` inside an async agent
    function cannot work (the loop it would drive is running the function) and raises
    ConfigurationError saying what to use."""
    container = _Container(run.async_run, loop=run.loop) if isinstance(run, SyncRun) else _Container(run)
    token = _CONTAINER.set(container)
    try:
        yield run
    except RuntimeError as exc:
        # asyncio's own words when agent.run_sync() is asked to drive the loop an async agent function
        # runs on (Pydantic AI passes them on as they are): said here with what to do instead.
        if container.loop is None and "event loop is already running" in str(exc):
            raise ConfigurationError(
                "agent.run_sync() cannot be used inside an async agent function (its event loop is running "
                "the function): use `await agent.run(...)`, or make the agent function blocking with "
                "runledger.sync_agent, where agent.run_sync() records and resumes like agent.run()"
            ) from exc
        raise
    finally:
        _CONTAINER.reset(token)


async def _on(loop: asyncio.AbstractEventLoop | None, step: Awaitable[T]) -> T:
    """``step`` awaited on ``loop`` (the run's, when the agent runs on another), without blocking the
    agent's loop. The step's task starts in a copy of this task's context (asyncio copies the caller's
    into a callback scheduled from another thread), so it sees what the agent's context holds."""
    if loop is None or loop is asyncio.get_running_loop():
        return await step
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_awaited(step), loop))


async def _awaited(step: Awaitable[T]) -> T:
    return await step


@dataclass(frozen=True)
class Effect:
    """A tool declared as a side effect (``RunledgerDurability(effects={"refund": Effect(key=...)})``).

    ``key`` builds the idempotency key from the tool's arguments (a JSON object): the business
    identity, e.g. ``lambda a: f"refund:{a['order_id']}"``, never a digest of model-generated text.
    ``effect_class`` is ``write`` or ``irreversible``; ``reconcile`` (``key -> the tool's return value``
    or ``runledger.NOT_FOUND``, sync or async), asked when a crash left the effect in doubt, says
    whether the external system did it: its value is recorded as the tool's return (as Pydantic
    AI records one) and handed to the model. ``lease_s`` is the claim's lease (runledger.sdk.context)."""

    key: Callable[[Any], str]
    effect_class: Literal["write", "irreversible"] = "write"
    reconcile: Callable[[str], Any] | None = None
    lease_s: float | None = None


class PydanticAIResponse(ModelResponse):
    """A ``ModelResponse`` that also carries Pydantic AI's ``ModelResponse`` as JSON (``message``), what a
    replay hands back to the agent."""

    message: Any = None


@dataclass
class _Call:
    """The Pydantic AI request a model step is making, for the adapter that makes it."""

    name: str
    body: Callable[[], Awaitable[object]]
    answered: bool = False
    base_url: Any = None  # the model's (``Model.base_url``): where the request goes


_CALL: ContextVar[_Call | None] = ContextVar("runledger_pydantic_ai_call", default=None)


class PydanticAIModel:
    """The model adapter of a run whose agent is a Pydantic AI agent with ``RunledgerDurability``.

    Called by ``run.model`` for a model step the backend set up, it makes that Pydantic AI request
    (the agent's model, its settings and retries) and records its response; its ``name`` is then the
    requested model's (``function:...``, ``openai:gpt-4o``). Called with a step's recorded request
    alone (the host of a sandboxed re-run, which makes its guest's model calls; a model counterfactual's
    other model), it makes the request the record holds (runledger.integrations.pydantic_ai_request) with
    ``model``: a Pydantic AI ``Model``, a model name (``openai:gpt-4o``, made with Pydantic AI's
    ``infer_model`` at the first such call, so a guest makes no client), or a function that makes one;
    its ``name`` is then ``model``'s. ``agent_spec`` passes the agent's own model."""

    response_type = PydanticAIResponse
    retry = None  # a Pydantic AI model retries by its own settings; each request is one attempt here

    def __init__(
        self, model: Model | str | Callable[[], Model] | None = None, *, default_name: str | None = None
    ) -> None:
        self._model = model
        self.default_name = default_name or _name_of(model)

    @property
    def name(self) -> str:
        call = _CALL.get()
        return call.name if call is not None else self.default_name

    @name.setter
    def name(self, value: str) -> None:  # ModelAdapter's name is settable: it sets the default
        self.default_name = value

    def model(self) -> Model:
        """The Pydantic AI model a request made from the record goes to."""
        made = self._model
        if made is None:
            raise ConfigurationError(
                "this PydanticAIModel has no model to make a recorded request with: "
                "PydanticAIModel(model=...) (a Pydantic AI Model or a name such as 'openai:gpt-4o')"
            )
        if callable(made) and not isinstance(made, Model):
            made = made()
        model = made if isinstance(made, Model) else infer_model(made)
        self._model = model
        return model

    async def complete(self, messages: list[dict[str, Any]], **params: Any) -> ModelResponse:
        call = _CALL.get()
        if call is not None:
            call.answered = True
            return summary(await call.body()).model_copy(update={"server": server_of(call.base_url)})
        history, settings, parameters = model_request(params)  # a request made from the record alone
        model = self.model()
        response = await model.request(history, settings, parameters)
        made = summary(JSON_CODEC.dump(PydanticModelResponse, response))
        return made.model_copy(update={"server": server_of(getattr(model, "base_url", None))})


def _name_of(model: Model | str | Callable[[], Model] | None) -> str:
    if isinstance(model, str):
        return model
    if isinstance(model, Model):
        return _qualified(model)
    return DEFAULT_MODEL_NAME


def _qualified(model: Any) -> str:
    system, name = str(getattr(model, "system", "") or ""), str(getattr(model, "model_name", "") or "")
    if system and name and not name.startswith(f"{system}:"):
        return f"{system}:{name}"  # as Pydantic AI names models: openai:gpt-4o, test:test
    return name or system or DEFAULT_MODEL_NAME


def summary(payload: Any) -> PydanticAIResponse:
    """What the record keeps of a Pydantic AI ``ModelResponse`` (as JSON, ``payload``): its text, its tool
    calls as OpenAI-style calls, finish reason and token usage for the readers, and the whole of it."""
    parts = payload.get("parts", []) if isinstance(payload, dict) else []
    text = "".join(p.get("content", "") for p in parts if p.get("part_kind") == "text")
    calls = [
        {"id": p.get("tool_call_id"), "type": "function",
         "function": {"name": p.get("tool_name"), "arguments": _arguments(p.get("args"))}}
        for p in parts
        if p.get("part_kind") == "tool-call"
    ]  # fmt: skip
    usage = (payload.get("usage") if isinstance(payload, dict) else None) or {}
    finish = (payload.get("finish_reason") if isinstance(payload, dict) else None) or (
        "tool_calls" if calls else "stop"
    )
    # The model's own reason: the provider's as Pydantic AI kept it (``provider_details``), else Pydantic
    # AI's reading of it; never the default filled in above.
    details = payload.get("provider_details") if isinstance(payload, dict) else None
    own = details.get("finish_reason") if isinstance(details, dict) else None
    if not isinstance(own, str):
        own = payload.get("finish_reason") if isinstance(payload, dict) else None
    return PydanticAIResponse(
        content=text,
        tool_calls=calls,
        finish_reason=str(finish),
        model_finish_reason=own if isinstance(own, str) else None,
        input_tokens=int(usage.get("input_tokens") or 0),
        output_tokens=int(usage.get("output_tokens") or 0),
        message=payload,
    )


def _arguments(args: Any) -> str:
    if isinstance(args, str):
        return args
    return json.dumps(args if args is not None else {}, sort_keys=True, separators=(",", ":"))


def request_messages(messages: Sequence[ModelMessage]) -> list[dict[str, Any]]:
    """A Pydantic AI message history as the OpenAI-style messages a model step records: system,
    user, assistant (text and tool calls) and tool messages, without timestamps or run ids, so the
    same conversation gives the same request digest live and on resume."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.kind == "request":
            if message.instructions:
                out.append({"role": "system", "content": message.instructions})
            out.extend(_request_part(part) for part in message.parts)
            continue
        text = "".join(str(getattr(p, "content", "")) for p in message.parts if p.part_kind == "text")
        calls = [
            {"id": p.tool_call_id, "type": "function",
             "function": {"name": p.tool_name, "arguments": p.args_as_json_str()}}
            for p in message.parts
            if p.part_kind == "tool-call"
        ]  # fmt: skip
        out.append({"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})})
    return out


def _request_part(part: Any) -> dict[str, Any]:
    kind = part.part_kind
    if kind == "system-prompt":
        return {"role": "system", "content": part.content}
    if kind == "user-prompt":
        content = part.content if isinstance(part.content, str) else to_jsonable_python(part.content)
        return {"role": "user", "content": content}
    if kind == "tool-return":
        return {"role": "tool", "tool_call_id": part.tool_call_id, "name": part.tool_name,
                "content": part.model_response_str()}  # fmt: skip
    if kind == "retry-prompt":
        if part.tool_name is None:
            return {"role": "user", "content": part.model_response()}
        return {"role": "tool", "tool_call_id": part.tool_call_id, "name": part.tool_name,
                "content": part.model_response()}  # fmt: skip
    return {"role": "user", "content": to_jsonable_python(part, fallback=str)}


# -- the backend: durable units as steps ---------------------------------------------------------


class _Bound:
    """One durable operation bound to runledger: called inside a run, it is a step of the run."""

    def __init__(self, operation: DurableOperation[Any, Any, Any], durability: RunledgerDurability) -> None:
        self._operation = operation
        self._durability = durability

    @property
    def operation(self) -> DurableOperation[Any, Any, Any]:
        return self._operation

    async def __call__(self, params: Any, *, config: object | None = None) -> Any:
        operation = self._operation

        async def body() -> object:
            with durable_unit_scope():
                return operation.result_codec.dump(await operation.handler(params))

        container = _CONTAINER.get()
        op_id = operation.operation_id
        if container is None or isinstance(op_id, ToolsetValidateToolArgumentsId):
            return operation.result_codec.load(await body())  # outside a run, or pure validation: nothing to record
        run, agent_loop = container.run, asyncio.get_running_loop()
        if container.loop is not None and container.loop is not agent_loop:
            # The step is made on the run's loop, and its body (Pydantic AI's request or tool) back on the agent's.
            made = body

            async def body() -> object:
                return await _on(agent_loop, made())

        if isinstance(op_id, (ModelRequestId, ModelCompactMessagesId)):
            payload = await _on(container.loop, _model_step(run, params, body))
        elif isinstance(op_id, ToolsetCallToolId):
            effect = self._durability.effects.get(params.name)
            described = getattr(getattr(getattr(params, "tool", None), "tool_def", None), "description", None)
            step = _tool_step(run, params.name, params.tool_args, params.ctx.tool_call_id, body, effect, described)
            return _tool_result(operation.result_codec.load, await _on(container.loop, step))
        else:
            step = _tool_step(run, f"pydantic_ai:{type(op_id).__name__}", None, None, body, None)
            payload = await _on(container.loop, step)
        return operation.result_codec.load(payload)


def _tool_result(load: Callable[[Any], Any], payload: Any) -> Any:
    """A tool step's value as Pydantic AI's ``CallToolResult``: what Pydantic AI recorded (its return
    value or a control-flow signal, as data), or a *plain* return value, which only an answer from
    outside the call gives (a reconcile's, an operator's ``runledger effects resolve KEY --committed
    --result JSON``): handed to the model as the tool's return, as if the tool had returned it."""
    try:
        return load(payload)
    except ValidationError:
        return load({"kind": "tool_return", "result": payload})


def _model_name(params: Any) -> str:
    ctx = getattr(params, "run_context", None)
    model = getattr(ctx, "model", None)
    if model is not None:
        return _qualified(model)
    return str(getattr(params, "model_id", None) or DEFAULT_MODEL_NAME)


async def _model_step(run: Run, params: Any, body: Callable[[], Awaitable[object]]) -> object:
    if isinstance(params, ModelRequestParams):
        messages = request_messages(params.messages)
        request = request_params(params.messages, params.model_settings, params.model_request_parameters)
    else:  # a compaction of the history (ModelCompactMessagesParams)
        messages = request_messages(params.request_context.messages)
        request = {"operation": "compact_messages"}
    model = getattr(getattr(params, "run_context", None), "model", None)
    call = _Call(_model_name(params), body, base_url=getattr(model, "base_url", None))
    token = _CALL.set(call)
    try:
        response = await run.model(messages, **request)
    except ToolFailedError as exc:
        if isinstance(exc.__cause__, Exception):
            raise exc.__cause__ from None  # the model's own error, recorded; Pydantic AI's retries see it
        raise
    finally:
        _CALL.reset(token)
    if not isinstance(response, PydanticAIResponse):
        raise ConfigurationError(
            "a run whose agent calls a Pydantic AI agent needs AgentSpec(model=PydanticAIModel()) "
            f"(its model adapter answered {type(response).__name__})"
        )
    return response.message


async def _tool_step(
    run: Run,
    name: str,
    args: Any,
    tool_call_id: str | None,
    body: Callable[[], Awaitable[object]],
    effect: Effect | None,
    description: str | None = None,
) -> object:
    async def call(arguments: Any) -> object:  # a value tool: the arguments are the record's, unvalidated
        return await body()

    described = description if isinstance(description, str) else ""  # the tool's definition's, recorded
    if effect is None:
        declared: Tool[Any, Any] = Tool(name, call, description=described)
    else:
        reconcile = None if effect.reconcile is None else _reconciler(effect.reconcile)
        declared = Tool(
            name, call, effect_class=effect.effect_class, key=effect.key, reconcile=reconcile, lease_s=effect.lease_s,
            description=described,
        )  # fmt: skip
    try:
        return await run.tool(declared, args, tool_call_id=tool_call_id)
    except ToolFailedError as exc:
        if isinstance(exc.__cause__, Exception):
            raise exc.__cause__ from None  # the tool's own error, recorded
        raise


def _reconciler(reconcile: Callable[[str], Any]) -> Callable[[str], Awaitable[Any]]:
    """``reconcile`` sync or async. Its found value is recorded as it is, a plain return value, which the
    step hands Pydantic AI as the tool's return (``_tool_result``); ``NOT_FOUND`` as it is."""

    async def reconciled(key: str) -> Any:
        found = reconcile(key)
        return await found if inspect.isawaitable(found) else found

    return reconciled


class _Backend(DurableOperationBackend[None]):
    def __init__(self, durability: RunledgerDurability) -> None:
        self._durability = durability

    def bind(self, operation: DurableOperation[Any, Any, Any]) -> BoundDurableOperation[Any, Any, Any]:
        return _Bound(operation, self._durability)

    def config_for_tool(
        self, operation: DurableOperation[Any, Any, Any], *, tool: object | None, tool_name: str
    ) -> None:
        return None

    def registrations(self) -> Sequence[Callable[..., object]]:
        return ()


class RunledgerDurability(BaseDurabilityCapability[Any]):
    """The capability that makes a Pydantic AI agent durable on runledger
    (``Agent(..., capabilities=[RunledgerDurability(effects=...)])``).

    Inside ``recording(run)`` (or an ``agent_spec`` run) the agent's model requests and tool calls
    are steps of ``run``; outside one the agent runs as it would without it. ``effects`` maps tool
    names to their ``Effect`` declarations; every other tool is a read tool, re-run freely by a
    re-drive and served from the record on resume."""

    engine_spec = DurabilityEngineSpec(
        engine_name="runledger",
        durable_unit_noun="step",
        durable_unit_plural="steps",
        durable_container_noun="run",
        codec=JSON_CODEC,  # the record is JSON: values are reduced by Pydantic AI's type adapters
        unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        toolset_lifecycles={"function": "enter-always", "mcp": "enter-in-durable-unit", "dynamic": "enter-never"},
        journal_discovery=False,
        sequential_tools_in_durable_context=True,
        tool_config_key=None,
    )

    def __init__(self, *, effects: Mapping[str, Effect] | None = None, name: str | None = None) -> None:
        super().__init__(name=name)
        self.effects: dict[str, Effect] = dict(effects or {})

    @property
    def in_durable_context(self) -> bool:
        return _CONTAINER.get() is not None

    def get_default_run_id(self) -> str | None:
        container = _CONTAINER.get()
        if container is None:
            return None
        container.agent_runs += 1
        return f"{container.run.run_id}-pa{container.agent_runs}"

    def get_default_conversation_id(self, run_id: str) -> str | None:
        return conversation_id_from_run_id(run_id) if self.in_durable_context else None

    def get_durable_operation_backend(self) -> DurableOperationBackend[Any]:
        return _Backend(self)


def agent_spec(
    agent: Agent[Any, Any],
    name: str | None = None,
    *,
    agent_version: str | None = None,
    deps: Callable[[Run], Any] | None = None,
    model: PydanticAIModel | None = None,
    **spec: Any,
) -> AgentSpec:
    """A runledger agent (``start_run``, ``resume_run``, ``runledger run --agent module:attr``) that runs
    ``agent`` on the run's input: a string is the user prompt; an object gives ``prompt`` and may give
    ``instructions``. Returns the agent's output as JSON. ``deps(run)`` builds the agent's
    dependencies; ``spec`` is passed on to ``AgentSpec`` (budgets, data policy, durability)."""
    if RunledgerDurability.from_agent(agent) is None:
        raise ConfigurationError(
            f"agent {agent.name or name!r} has no RunledgerDurability: Agent(..., capabilities=[RunledgerDurability()])"
        )
    run_name = name or agent.name
    if not run_name:
        raise ConfigurationError("agent_spec needs a name (the agent's, or name=)")
    durability = RunledgerDurability.from_agent(agent)
    assert durability is not None

    async def run_agent(run: Run) -> Any:
        given = run.input
        prompt = given.get("prompt") if isinstance(given, dict) else given
        with recording(run):
            result = await agent.run(
                None if prompt is None else str(prompt),
                deps=deps(run) if deps is not None else None,
                instructions=given.get("instructions") if isinstance(given, dict) else None,
            )
        return to_jsonable_python(result.output)

    spec.setdefault("tools", declared_tools(agent, durability.effects))
    adapter = model or PydanticAIModel(agent.model)
    return AgentSpec(run_name, run_agent, adapter, agent_version=agent_version, **spec)


def declared_tools(agent: Agent[Any, Any], effects: Mapping[str, Effect] | None = None) -> list[Tool[Any, Any]]:
    """The agent's function tools declared as runledger tools (name, JSON schema, description, and
    the effect declaration of those in ``effects``), for ``AgentSpec(tools=...)``: their schema
    hashes are the run's ``tool_schema_hashes``, so a tool whose arguments changed since a run was
    recorded is a version change its resume refuses. The declarations are never called (a step
    calls the agent's own tool)."""
    effects = effects or {}
    found: dict[str, Tool[Any, Any]] = {}

    def declare(toolset: AbstractToolset[Any]) -> None:
        if not isinstance(toolset, FunctionToolset):
            return
        for tool_name, tool in toolset.tools.items():
            definition, effect = tool.tool_def, effects.get(tool_name)
            schema, description = definition.parameters_json_schema, definition.description or ""
            if effect is None:
                found[tool_name] = Tool(tool_name, _declared_only, schema=schema, description=description)
            else:
                found[tool_name] = Tool(
                    tool_name, _declared_only, effect_class=effect.effect_class, key=effect.key, schema=schema,
                    description=description,
                )  # fmt: skip

    for toolset in agent.toolsets:
        toolset.apply(declare)
    return [found[n] for n in sorted(found)]


def _declared_only(args: Any) -> Any:
    raise ConfigurationError("a Pydantic AI tool runs as the agent's own tool, through RunledgerDurability")
