"""LangChain models and tools journaled as runledger steps, inside the nodes of a LangGraph graph.

``saver.model(chat_model)`` wraps any LangChain chat model: each call is a ``model.called`` step of
the thread's run (the messages as OpenAI-style dicts, the reply, token usage), counted in its
budgets and shown by ``runledger show`` and the projection's ``steps`` table. ``saver.tool(lc_tool,
effect=..., key=..., reconcile=...)`` wraps any LangChain tool: a read tool is a ``tool.called``
step; a ``write`` or ``irreversible`` one is an effect, claimed on its idempotency key before it
acts and applied at most once across crashes and resumes (runledger.sdk.run), its function finding
the attempt's ``EffectContext`` (``EffectContext.current().key``: pass it to the service as its
idempotency key). ``saver`` is a ``runledger.integrations.langgraph.RunledgerSaver``; the thread
is the one of the node the call is made in (LangGraph's config), so the same wrapped model and
tools serve every thread.

What a wrapper returns is what the wrapped model or tool returned, as the record keeps it: the
tool's output as any step's (runledger.sdk.run), the model's ``AIMessage`` rebuilt from the recorded
response (``ai_message``), live as on every path back (a re-drive in the sandbox, a re-run's host),
so a graph observes the same message whichever path answered: an argument dict's keys in the
record's order, a whole-number float an integer (in the run's chain format), content blocks,
metadata and ids as the model gave them. What the record keeps is redacted and sealed as any run's
content. The recorded model name is the wrapped model's (``model_name``, ``model``, else its
class). A model's own exception is raised as it was (the step records it first), so LangGraph's
retry policies see it.

The wrappers only need a journal: something that gives the run of a node's thread
(``run_for(config)``) and runs a coroutine from a sync node (``call_sync``). ``RunledgerSaver`` is
one; the sandbox's re-drive of a thread is another (``runledger.integrations.langgraph.RedriveSaver``),
whose run is the guest's Run API: there a model call is answered by the host (``AIMessage``
rebuilt from the answer) and a tool's function never runs in the guest. ``ChatModelAdapter`` is
the other direction: a LangChain chat model as a runledger model adapter, what a re-run calls
live on the host.
"""

from __future__ import annotations

import json
from collections.abc import Coroutine, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from runledger import require_extra

require_extra("langgraph", "runledger.integrations.langchain")

from langchain_core.language_models import BaseChatModel  # noqa: E402
from langchain_core.messages import (  # noqa: E402
    AIMessage,
    BaseMessage,
    convert_to_messages,
    convert_to_openai_messages,
)
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from langchain_core.runnables import Runnable, RunnableConfig  # noqa: E402
from langchain_core.tools import BaseTool, StructuredTool  # noqa: E402
from langgraph.config import get_config  # noqa: E402
from pydantic import ConfigDict, Field  # noqa: E402

from runledger import ConfigurationError, ModelResponse, Server, Tool, ToolFailedError, server_of  # noqa: E402

if TYPE_CHECKING:
    from runledger import EffectClass, Run

T = TypeVar("T")


class ThreadJournal(Protocol):
    """Where the journaled wrappers record: the run of a node's thread, and a way back to its loop."""

    async def run_for(self, config: RunnableConfig) -> Run:
        """The run of the thread ``config`` names, ready for steps."""
        ...

    def call_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the journal's event loop from another thread (a sync node) and return its result."""
        ...


@dataclass
class _Call:
    """The LangChain call a journaled model is making, for the adapter that makes it."""

    model: Any
    messages: list[BaseMessage]
    stop: list[str] | None
    kwargs: dict[str, Any]
    name: str


_CALL: ContextVar[_Call | None] = ContextVar("runledger_langchain_call", default=None)


class LangChainModelAdapter:
    """The ``ModelAdapter`` of a thread's run: ``complete`` makes the LangChain call that
    ``JournaledChatModel`` set up for this task, and its ``name`` is that model's."""

    response_type: type[ModelResponse]  # LangChainResponse (set below, once it is defined)
    retry = None  # a LangChain model retries by its own settings; each call is one attempt here

    def __init__(self, default_name: str = "langchain") -> None:
        self.default_name = default_name  # outside a call: the version tuple's model

    @property
    def name(self) -> str:
        call = _CALL.get()
        return call.name if call is not None else self.default_name

    async def complete(self, messages: list[dict[str, Any]], **params: Any) -> ModelResponse:
        call = _CALL.get()
        if call is None:
            raise ConfigurationError("a LangGraph thread's run calls models through saver.model(chat_model)")
        reply = await call.model.ainvoke(call.messages, stop=call.stop, **call.kwargs)
        return model_response(_checked(reply, call.name), chat_model_server(call.model))


def _checked(reply: Any, name: str) -> AIMessage:
    if not isinstance(reply, AIMessage):
        raise ConfigurationError(f"model {name} answered {type(reply).__name__}, not an AIMessage")
    return reply


class LangChainResponse(ModelResponse):
    """A ``ModelResponse`` that also keeps what a LangChain reply said of itself (``metadata``): the
    provider its integration names (``model_provider``), the model that answered (``model_name``) and
    the provider's response ``id``, where the reply has them (the OTLP export's ``gen_ai.provider.name``
    and ``gen_ai.response.*``); and the rest of the ``AIMessage`` (``message``: its fields other than
    their defaults, the tool calls and a text content, which the common fields hold), so that
    ``ai_message`` rebuilds the message the model gave."""

    metadata: dict[str, str] = Field(default_factory=dict)
    message: dict[str, Any] | None = None


LangChainModelAdapter.response_type = LangChainResponse


def _reply_metadata(reply: AIMessage) -> dict[str, str]:
    given = reply.response_metadata or {}
    metadata = {
        k: given[k] for k in ("model_provider", "model_name", "id") if isinstance(given.get(k), str) and given[k]
    }
    if "id" not in metadata and reply.id and not _made_by_langchain(reply.id):
        metadata["id"] = reply.id
    return metadata


def _made_by_langchain(message_id: str | None) -> bool:
    """Whether LangChain named the reply itself ("run-..." / "lc_run--...", from the id of its own
    call), as it does when the provider gave no id: not the model's, and made afresh at every call."""
    return bool(message_id) and str(message_id).startswith(("run-", "lc_run"))


# Where LangChain's provider integrations keep their endpoint: ChatOpenAI (and its compatible
# kin), ChatAnthropic, ChatOllama, Azure, the generic ``api_base``; else their SDK client's.
_BASE_URL_ATTRS = ("openai_api_base", "base_url", "anthropic_api_url", "azure_endpoint", "api_base", "endpoint")


def chat_model_server(model: Any) -> Server | None:
    """The host and port a LangChain chat model calls (``model.called``'s ``server``), from its
    configured base URL or its SDK client's; None for a model that names none (a fake, a local one)."""
    inner = getattr(model, "bound", model)  # a model with tools bound is a RunnableBinding
    for attr in _BASE_URL_ATTRS:
        value = getattr(inner, attr, None)
        if isinstance(value, str) and (server := server_of(value)) is not None:
            return server
    for attr in ("root_async_client", "async_client", "root_client", "client", "_client"):
        client = getattr(inner, attr, None)
        if client is not None and (server := server_of(getattr(client, "base_url", None))) is not None:
            return server
    return None


def model_response(reply: AIMessage, server: Server | None = None) -> ModelResponse:
    """What the record keeps of a LangChain model's reply (``server``: where the call went). The
    provider's own reason is kept as given (``finish_reason``, Anthropic's ``stop_reason``...)."""
    given = reply.response_metadata or {}
    own = next((given[k] for k in ("finish_reason", "stop_reason", "done_reason") if isinstance(given.get(k), str)),
               None)  # fmt: skip
    usage: dict[str, Any] = dict(reply.usage_metadata or {})
    content = reply.content if isinstance(reply.content, str) else json.dumps(reply.content, default=str)
    # The rest of the message, recorded to be handed back as the model gave it (ai_message). Python
    # values: the step converts them to JSON as it does every response (a parsed object in
    # additional_kwargs is then its fields, live as on replay). Not an id LangChain made up: the call
    # that hands the message on names it afresh, as every call does (recorded, a re-run's model call
    # would differ from its parent's by that name alone).
    rest = reply.model_dump(exclude_defaults=True, exclude={"type", "tool_calls"})
    if isinstance(reply.content, str):
        rest.pop("content", None)
    if _made_by_langchain(reply.id):
        rest.pop("id", None)
    return LangChainResponse(
        content=content,
        tool_calls=[dict(tc) for tc in reply.tool_calls],
        finish_reason=str((reply.response_metadata or {}).get("finish_reason") or "stop"),
        input_tokens=int(usage.get("input_tokens", 0)),
        output_tokens=int(usage.get("output_tokens", 0)),
        metadata=_reply_metadata(reply),
        message=rest,
        model_finish_reason=own,
        server=server,
    )


def ai_message(response: ModelResponse) -> AIMessage:
    """The ``AIMessage`` a recorded (or remotely answered) model response stands for: the message the
    model gave (``LangChainResponse.message`` with the common fields' content and tool calls), as the
    record keeps it; for a response recorded without it, its content, tool calls and token usage,
    which is all a prompt built from it (``convert_to_openai_messages``) reads."""
    kept = getattr(response, "message", None)
    if isinstance(kept, dict):
        return AIMessage(**{"content": response.content, **kept, "tool_calls": response.tool_calls})
    total = response.input_tokens + response.output_tokens
    return AIMessage(
        content=response.content,
        tool_calls=[
            {"name": str(c.get("name", "")), "args": dict(c.get("args") or {}), "id": c.get("id"), "type": "tool_call"}
            for c in response.tool_calls
        ],
        usage_metadata={
            "input_tokens": response.input_tokens, "output_tokens": response.output_tokens, "total_tokens": total,
        },
        response_metadata={"finish_reason": response.finish_reason},
    )  # fmt: skip


class ChatModelAdapter:
    """A LangChain chat model as a runledger model adapter (``runledger.ModelAdapter``): the
    OpenAI-style messages of a step become LangChain messages, ``tools`` are bound, the reply is
    recorded as ``model_response`` makes it. ``name`` (the version tuple's model) defaults to the
    model's (``model_name``, ``model``, else its class). What a re-run of a LangGraph thread calls
    live on the host (``runledger rerun --set model=module:factory`` names a factory of one)."""

    response_type = LangChainResponse
    retry = None  # the LangChain model retries by its own settings

    def __init__(self, chat_model: Any, *, tools: Sequence[Any] = (), name: str | None = None) -> None:
        self.chat_model = chat_model
        self.tools = list(tools)
        self.name = name or chat_model_name(chat_model)

    async def complete(self, messages: list[dict[str, Any]], **params: Any) -> ModelResponse:
        model = self.chat_model.bind_tools(self.tools) if self.tools else self.chat_model
        reply = await model.ainvoke(convert_to_messages(messages), **params)
        return model_response(_checked(reply, self.name), chat_model_server(self.chat_model))


def chat_model_name(model: Any) -> str:
    """The name a LangChain chat model is recorded under: ``model_name``, ``model``, ``model_id``, else its class."""
    inner = getattr(model, "bound", model)  # a model with tools bound is a RunnableBinding
    for attr in ("model_name", "model", "model_id"):
        value = getattr(inner, attr, None)
        if isinstance(value, str) and value:
            return value
    return type(inner).__name__


def current_config() -> RunnableConfig:
    """The config of the LangGraph node this code runs in (its thread and checkpoint namespace)."""
    try:
        return get_config()
    except RuntimeError as exc:
        raise ConfigurationError(
            "a journaled model or tool records into the run of a LangGraph thread: call it inside a node of a "
            "graph compiled with checkpointer=RunledgerSaver(...)"
        ) from exc


async def journal_model_call(
    saver: ThreadJournal,
    config: RunnableConfig,
    model: Any,
    messages: list[BaseMessage],
    stop: list[str] | None = None,
    kwargs: dict[str, Any] | None = None,
) -> AIMessage:
    """Call ``model`` with ``messages`` as a ``model.called`` step of the run of ``config``'s thread.

    Returns the reply rebuilt from the recorded response (``ai_message``), whether the model was
    called here or the step was answered by the record or by the host of a sandbox: one rule for
    every path back to the graph (the module docstring)."""
    run = await saver.run_for(config)
    call = _Call(model, messages, stop, dict(kwargs or {}), chat_model_name(model))
    token = _CALL.set(call)
    try:
        response = await run.model(convert_to_openai_messages(messages), **({"stop": stop} if stop else {}))
    except ToolFailedError as exc:
        if isinstance(exc.__cause__, Exception):
            raise exc.__cause__ from None  # the model's own error, recorded; LangGraph's retry policy sees it
        raise
    finally:
        _CALL.reset(token)
    return ai_message(response)


class JournaledChatModel(BaseChatModel):
    """A LangChain chat model whose calls are steps of the thread's run (``RunledgerSaver.model``)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model: Any
    saver: Any

    @property
    def _llm_type(self) -> str:
        return "runledger-journaled"

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: str | None = None, **kwargs: Any) -> Runnable[Any, Any]:
        extra = {} if tool_choice is None else {"tool_choice": tool_choice}
        return self.model_copy(update={"model": self.model.bind_tools(tools, **extra, **kwargs)})

    async def _agenerate(
        self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        reply = await journal_model_call(self.saver, current_config(), self.model, messages, stop, kwargs)
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def _generate(
        self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        config = current_config()
        saver: ThreadJournal = self.saver
        reply = saver.call_sync(journal_model_call(saver, config, self.model, messages, stop, kwargs))
        return ChatResult(generations=[ChatGeneration(message=reply)])


def declare_tool(
    lc_tool: BaseTool,
    *,
    effect: EffectClass = "read",
    key: Any = None,
    reconcile: Any = None,
    lease_s: float | None = None,
) -> Tool[Any, Any]:
    """``lc_tool`` declared as a runledger tool (runledger.tool): its name, schema (from the tool's
    arguments) and effect declaration; calling it invokes the LangChain tool.

    ``effect`` (``read``, ``write``, ``irreversible``), ``key`` (a function of the arguments: the
    business identity, e.g. ``lambda a: f"refund:{a['order']}"``), ``reconcile`` (``key -> result``
    or ``runledger.NOT_FOUND``) and ``lease_s`` are runledger's tool declaration."""

    async def call_lc_tool(args: Any) -> Any:
        return await lc_tool.ainvoke(args)

    return Tool(
        lc_tool.name,
        call_lc_tool,
        effect_class=effect,
        key=key,
        reconcile=reconcile,
        schema={"type": "object", "properties": lc_tool.args},
        description=lc_tool.description,
        lease_s=lease_s,
    )


def journaled_tool(lc_tool: BaseTool, saver: ThreadJournal, declared: Tool[Any, Any]) -> StructuredTool:
    """``lc_tool`` as a LangChain tool whose calls are steps of the thread's run (``RunledgerSaver.tool``),
    declared by ``declared`` (``declare_tool``): its function runs where the journal's run calls
    it (in a recording process; on the host of a sandboxed re-run, never in the guest)."""

    async def step(config: RunnableConfig, kwargs: dict[str, Any]) -> Any:
        run = await saver.run_for(config)
        return await run.tool(declared, kwargs)

    async def acall(**kwargs: Any) -> Any:
        return await step(current_config(), kwargs)

    def call(**kwargs: Any) -> Any:
        return saver.call_sync(step(current_config(), kwargs))

    return StructuredTool(
        name=lc_tool.name,
        description=lc_tool.description,
        args_schema=lc_tool.args_schema if lc_tool.args_schema is not None else {"type": "object", "properties": {}},
        func=call,
        coroutine=acall,
        return_direct=lc_tool.return_direct,
        handle_tool_error=lc_tool.handle_tool_error,
    )


__all__ = [
    "ChatModelAdapter",
    "JournaledChatModel",
    "LangChainModelAdapter",
    "LangChainResponse",
    "ThreadJournal",
    "ai_message",
    "chat_model_name",
    "current_config",
    "declare_tool",
    "journal_model_call",
    "journaled_tool",
    "model_response",
]
