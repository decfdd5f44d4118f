"""Tools declared once: name, function, effect class, idempotency key, reconcile and schema.

A ``read`` tool is recorded as ``tool.called`` and re-run freely; ``write`` and
``irreversible`` tools go through the effect ledger with the key their ``key``
function builds from the business identity in the arguments (never from a hash
of model-generated text, which changes on retry).

**Two ways to take arguments.** A run always passes a tool one JSON value, ``args`` (what the
model produced; what is recorded and digested). How the function receives it follows from its
signature:

- *keyword tools*: parameters with type hints, ``def lookup_order(order: str, include_items:
  bool = False) -> dict``. ``args`` must be a JSON object; its keys are the keyword arguments,
  validated (and coerced, lax mode) by pydantic before the call; a parameter typed with a pydantic
  model receives the model. The JSON schema is derived from the signature (``Tool.parameters``),
  unless one is given with ``schema=``: the given one is then what is advertised and hashed, and
  the signature still validates.
- *value tools*: a function callable with one positional argument whose first parameter is
  unannotated or annotated ``Any``, ``object``, ``dict`` or a ``Mapping`` (``def refund(args:
  dict[str, Any])``, ``lambda a, p=bound: ...``) receives ``args`` as it is, unvalidated (the
  rule of every tool before typed ones). Its schema is the one given, or none; its schema hash is
  what it always was, so runs recorded with it keep their version tuple.

Either kind may also take the effect's ``EffectContext`` (runledger.sdk.context): a parameter
annotated ``EffectContext``, or named ``ctx`` after the first, is no argument (not in the schema)
and receives ``EffectContext.current()`` (None outside an effect, so for a read tool).

**Bad arguments are the tool's failure, recorded.** A model that produced arguments the signature
refuses is an ordinary agent event: the run records the step as a failed ``tool.called``
(``ToolArgumentsError``: the tool, then each field and what is wrong with it, never the values)
and raises ``ToolFailedError``, which a resume replays identically. The function is not called;
for an effect tool no idempotency key is built or claimed.

**Where the function runs.** ``Tool.call`` (what a run uses) awaits an async function and runs a
sync one in a worker thread (``asyncio.to_thread``), never on the event loop, unless it is declared
``inline=True``: a sync function that never blocks (no I/O, no long computation) is then called on the
loop, which saves the thread hop (~0.1-0.4 ms a call, measured by ``bench/record.py``). The decorated object
stays callable with the function's own signature (``Tool[P, R]``): a direct call outside a run
just calls the function, unvalidated and unrecorded.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import types
import typing
import weakref
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, overload

from typing_extensions import ParamSpec, TypeVar

from runledger.cpu import in_thread
from runledger.errors import ConfigurationError, ToolArgumentsError
from runledger.record.canonical import digest
from runledger.sdk.context import EffectContext
from runledger.sdk.retry import Retry

if TYPE_CHECKING:
    from pydantic import BaseModel

EffectClass = Literal["read", "write", "irreversible"]
ToolFn = Callable[..., Any]
KeyFn = Callable[[Any], str]
ReconcileFn = Callable[[str], Any]  # returns the result if the effect happened, NOT_FOUND otherwise

P = ParamSpec("P", default=...)
R = TypeVar("R", default=Any)


class _NotFound:
    def __repr__(self) -> str:
        return "NOT_FOUND"


NOT_FOUND: Any = _NotFound()
"""What a reconcile function returns when the external system has no trace of the effect."""


@dataclass(frozen=True)
class Tool(Generic[P, R]):
    """A tool: ``tool(...)(fn)`` or ``Tool(name, fn, ...)``. Calling it calls ``fn``."""

    name: str
    fn: Callable[P, R]
    effect_class: EffectClass = "read"
    key: KeyFn | None = None
    reconcile: ReconcileFn | None = None
    schema: dict[str, Any] = field(default_factory=dict)  # given explicitly; {} when derived or none
    description: str | None = None  # default: the function's docstring
    lease_s: float | None = None  # an effect tool's claim lease (runledger.sdk.context); None: the default
    retry: Retry | None = None  # a read tool's retries (runledger.sdk.retry); effects are not retried blindly
    inline: bool = False  # a sync function that never blocks: called on the event loop, no worker thread
    # The ``secret://NAME`` references this tool may have resolved where a sandboxed re-run calls it
    # (runledger.sandbox.branch): a re-run resolves no other name, whatever the arguments say.
    secrets: tuple[str, ...] = ()
    # How the tool is reached when it is another process's (an MCP server's ``tools/call``): facts
    # recorded with each call (``tool.called``/``effect.intended``'s ``via``), read after the call of
    # a read tool and before the claim of an effect. None: a function of this process.
    via: Callable[[], dict[str, Any] | None] | None = None

    def __post_init__(self) -> None:
        if self.effect_class != "read" and self.key is None:
            raise ValueError(f"tool {self.name!r} is {self.effect_class}: it needs a key function")
        # inspect.signature(tool) and help(tool) show the function's own.
        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            if hasattr(self.fn, attr):
                object.__setattr__(self, attr, getattr(self.fn, attr))
        object.__setattr__(self, "__wrapped__", self.fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def recorded_facts(self) -> dict[str, Any]:
        """The optional facts a call of this tool records beside its arguments: its ``description``
        (declared, else the function's docstring) and ``via`` (above), each only when known."""
        facts: dict[str, Any] = {}
        description = self.description if self.description is not None else inspect.getdoc(self.fn)
        if description:
            facts["description"] = description
        via = self.via() if self.via is not None else None
        if via:
            facts["via"] = via
        return facts

    @property
    def takes_keywords(self) -> bool:
        """Whether ``fn`` takes the arguments as keywords (else the ``args`` value as it is)."""
        return _arguments_of(self.fn, self.name).model is not None

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments in use: the given one, else the signature's, else {}."""
        return self.schema or _arguments_of(self.fn, self.name).schema

    @property
    def schema_hash(self) -> str:
        """What the version tuple holds for this tool: changes with the schema in use."""
        return digest({"name": self.name, "effect_class": self.effect_class, "schema": self.parameters})

    def json_schema(self) -> dict[str, Any]:
        """The OpenAI-style function description a model adapter sends: name, description, parameters."""
        description = self.description if self.description is not None else inspect.getdoc(self.fn)
        return {
            "name": self.name,
            "description": description or "",
            "parameters": self.parameters or {"type": "object", "properties": {}},
        }

    def argument_error(self, args: Any) -> ToolArgumentsError | None:
        """What is wrong with ``args`` for this tool (None when they validate, or for a value tool)."""
        try:
            _arguments_of(self.fn, self.name).bind(self.name, args)
        except ToolArgumentsError as exc:
            return exc
        return None

    async def call(self, args: Any) -> Any:
        """Validate ``args`` and call the function with them: awaited when async, in a worker
        thread when sync. Raises ToolArgumentsError (before calling) when they do not validate."""
        arguments = _arguments_of(self.fn, self.name)
        ctx = EffectContext.current() if arguments.takes_context else None
        positional, keywords = arguments.bind(self.name, args, ctx)
        fn: Callable[..., Any] = self.fn
        if self.inline or _is_async(fn):
            result = fn(*positional, **keywords)
        else:
            result = await in_thread(fn, *positional, **keywords)  # (its CPU charged to a metered re-run)
        if inspect.isawaitable(result):  # a sync function that returned a coroutine (a lambda, say)
            result = await result
        return result


async def call_maybe_async(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a sync or async function; sync ones run inline (they are the agent's own code)."""
    result = fn(*args)
    if inspect.isawaitable(result):
        return await result
    return result


@overload
def tool(name: Callable[P, R], /) -> Tool[P, R]: ...


@overload
def tool(
    name: str | None = None,
    *,
    effect: EffectClass = "read",
    key: KeyFn | None = None,
    reconcile: ReconcileFn | None = None,
    schema: dict[str, Any] | None = None,
    description: str | None = None,
    lease_s: float | None = None,
    retry: Retry | None = None,
    inline: bool = False,
    secrets: Iterable[str] = (),
) -> Callable[[Callable[P, R]], Tool[P, R]]: ...


def tool(
    name: str | Callable[P, R] | None = None,
    *,
    effect: EffectClass = "read",
    key: KeyFn | None = None,
    reconcile: ReconcileFn | None = None,
    schema: dict[str, Any] | None = None,
    description: str | None = None,
    lease_s: float | None = None,
    retry: Retry | None = None,
    inline: bool = False,
    secrets: Iterable[str] = (),
) -> Tool[P, R] | Callable[[Callable[P, R]], Tool[P, R]]:
    """Decorator: ``@tool``, ``@tool("lookup_order")``, ``@tool(effect="write", key=lambda a: f"refund:{a['order']}")``.

    The result is a ``Tool`` that stays callable as the function. ``key`` receives the ``args``
    JSON object (keyword tools too); ``schema`` overrides the schema derived from the signature.
    ``secrets`` names the ``secret://NAME`` references the tool needs: a sandboxed re-run resolves
    only those (and only the ones its operator allows), never anything else of the host's environment."""
    if callable(name):
        return Tool(name.__name__, name)

    def wrap(fn: Callable[P, R]) -> Tool[P, R]:
        return Tool(
            name or fn.__name__,
            fn,
            effect,
            key,
            reconcile,
            schema or {},
            description,
            lease_s,
            retry,
            inline=inline,
            secrets=(secrets,) if isinstance(secrets, str) else tuple(secrets),
        )

    return wrap


# -- the arguments of a function ----------------------------------------------------------------------------------


_VALUE, _FIELD, _CONTEXT = "value", "field", "context"


@dataclass(frozen=True)
class _Arguments:
    """How a function takes a run's ``args``: as one value (``model`` None), or as keyword arguments
    validated by ``model``; and whether it takes the effect's context too."""

    model: type[BaseModel] | None = None
    schema: dict[str, Any] = field(default_factory=dict)
    # The parameters in signature order: (name, role, passed by position). Field p<i> of the model
    # is the i-th parameter of role "field".
    params: tuple[tuple[str, str, bool], ...] = (("args", _VALUE, True),)
    var_keyword: bool = False

    @property
    def takes_context(self) -> bool:
        return any(role == _CONTEXT for _, role, _ in self.params)

    def bind(self, tool: str, args: Any, ctx: Any = None) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The call's positional and keyword arguments: ``args`` validated, ``ctx`` where it is taken."""
        validated = None if self.model is None else self._validate(self.model, tool, args)
        positional: list[Any] = []
        keywords: dict[str, Any] = {}
        fields = 0
        for name, role, by_position in self.params:
            if role == _VALUE:
                value = args
            elif role == _CONTEXT:
                value = ctx
            else:
                value = getattr(validated, f"p{fields}")
                fields += 1
            if by_position:
                positional.append(value)
            else:
                keywords[name] = value
        if self.var_keyword and validated is not None:
            keywords.update(validated.model_extra or {})
        return tuple(positional), keywords

    @staticmethod
    def _validate(model: type[BaseModel], tool: str, args: Any) -> BaseModel:
        from pydantic import ValidationError

        if args is None:
            args = {}
        if not isinstance(args, Mapping):
            raise ToolArgumentsError(
                tool, f"the arguments must be a JSON object of keyword arguments, not {type(args).__name__}"
            )
        try:
            return model.model_validate(args)
        except ValidationError as exc:
            problems = [
                f"{'.'.join(str(part) for part in error['loc']) or '(arguments)'}: {error['msg']}"
                for error in exc.errors(include_url=False, include_input=False)
            ]
            raise ToolArgumentsError(tool, "; ".join(problems)) from None


_VALUE_TYPES: tuple[Any, ...] = (Any, object, dict, Mapping, MutableMapping)
_CONTEXT_HINT = re.compile(r"\bEffectContext\b")
_CACHE: weakref.WeakKeyDictionary[Callable[..., Any], _Arguments] = weakref.WeakKeyDictionary()
# Derived arguments by code object, for functions made anew per call (bounded; see _arguments_of).
_BY_CODE: dict[tuple[Any, int], _Arguments] = {}
_BY_CODE_MAX = 4096


def _is_async(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    return not inspect.isroutine(fn) and inspect.iscoroutinefunction(type(fn).__call__)  # async def __call__


def _is_value_type(annotation: Any) -> bool:
    if annotation is inspect.Parameter.empty or annotation in _VALUE_TYPES:
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _is_value_type(typing.get_args(annotation)[0])
    if origin in _VALUE_TYPES:
        return True
    if origin is typing.Union or origin is types.UnionType:
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return bool(members) and all(_is_value_type(a) for a in members)
    return False


def _is_context(p: inspect.Parameter, first: bool) -> bool:
    """The parameter of the effect's context (runledger.sdk.context's rule): annotated
    ``EffectContext``, or named ``ctx`` after the first."""
    if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
        return False
    hint = p.annotation
    if isinstance(hint, str):  # a hint left as written (it names a type imported for type checking only)
        annotated = _CONTEXT_HINT.search(hint) is not None
    else:
        annotated = hint is EffectContext or EffectContext in typing.get_args(hint)
    return annotated or (p.name == "ctx" and not first)


def _arguments_of(fn: Callable[..., Any], tool: str) -> _Arguments:
    try:
        return _CACHE[fn]
    except (KeyError, TypeError):
        pass
    # A function made anew for each call (``run.tool("t", a, fn=lambda a: ...)``) has the code of
    # the last one: without defaults (which a signature shows) it takes its arguments the same way.
    code = getattr(fn, "__code__", None)
    plain = code is not None and not getattr(fn, "__defaults__", None) and not getattr(fn, "__kwdefaults__", None)
    code_key = (code, id(getattr(fn, "__globals__", None))) if plain else None
    arguments = _BY_CODE.get(code_key) if code_key is not None else None
    if arguments is None:
        arguments = _derive(fn, tool)
        if code_key is not None:
            if len(_BY_CODE) >= _BY_CODE_MAX:
                _BY_CODE.clear()
            _BY_CODE[code_key] = arguments
    with contextlib.suppress(TypeError):  # not weakly referenceable: derived again next time
        _CACHE[fn] = arguments
    return arguments


def _parameters(fn: Callable[..., Any]) -> list[inspect.Parameter] | None:
    """``fn``'s parameters with their hints evaluated (those that resolve); None without a signature."""
    try:
        return list(inspect.signature(fn, eval_str=True).parameters.values())
    except (ValueError, TypeError):  # no signature to read (a builtin)
        return None
    except Exception:  # NameError and the like: evaluate the hints one by one, keep the others as written
        pass
    namespace = getattr(inspect.unwrap(fn), "__globals__", {})
    params = []
    for p in inspect.signature(fn).parameters.values():
        if isinstance(p.annotation, str):
            with contextlib.suppress(Exception):
                p = p.replace(annotation=eval(p.annotation, namespace))  # as eval_str does
        params.append(p)
    return params


def _derive(fn: Callable[..., Any], tool: str) -> _Arguments:
    params = _parameters(fn)
    if params is None:
        return _Arguments()
    by_position = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    roles = [_CONTEXT if _is_context(p, i == 0) else _FIELD for i, p in enumerate(params)]
    named = [p for p, role in zip(params, roles, strict=True) if role == _FIELD]
    # A value tool: callable with the value alone, its first parameter typed as any value at all.
    # The rest (a default bound in a lambda, *args, **kwargs) is left to its defaults.
    if (
        named
        and named[0].kind in by_position
        and _is_value_type(named[0].annotation)
        and all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in named[1:])
    ):
        layout = tuple(
            (p.name, _VALUE, True) if p is named[0] else (p.name, _CONTEXT, p.kind is p.POSITIONAL_ONLY)
            for p, role in zip(params, roles, strict=True)
            if p is named[0] or role == _CONTEXT
        )
        return _Arguments(params=layout)
    return _keyword_arguments(fn, tool, params, roles)


def _keyword_arguments(
    fn: Callable[..., Any], tool: str, params: list[inspect.Parameter], roles: list[str]
) -> _Arguments:
    from pydantic import ConfigDict, Field, PydanticUserError, create_model
    from pydantic.errors import PydanticSchemaGenerationError

    qualname = getattr(fn, "__qualname__", repr(fn))
    star = [p.name for p in params if p.kind is inspect.Parameter.VAR_POSITIONAL]
    if star:
        raise ConfigurationError(
            f"tool {tool!r}: *{star[0]} cannot be given by name; tools take keyword arguments "
            "(or one value: `def fn(args)`)"
        )
    var_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    named = [p for p, role in zip(params, roles, strict=True) if role == _FIELD and p.kind is not p.VAR_KEYWORD]
    unresolved = [p.name for p in named if isinstance(p.annotation, str)]
    if unresolved:
        raise ConfigurationError(
            f"tool {tool!r}: the type hints of {', '.join(unresolved)} in {qualname} do not resolve; "
            "define the types they name at module level (not under `if TYPE_CHECKING:`)"
        )
    # Fields are p0, p1, ... aliased to the parameter names: a parameter may be called `json`,
    # `schema` or `model_name` without clashing with BaseModel's own attributes.
    fields: dict[str, Any] = {
        f"p{index}": (
            Any if p.annotation is inspect.Parameter.empty else p.annotation,
            Field(... if p.default is inspect.Parameter.empty else p.default, alias=p.name),
        )
        for index, p in enumerate(named)
    }
    config = ConfigDict(extra="allow" if var_keyword else "forbid", protected_namespaces=())
    try:
        model = create_model(f"{getattr(fn, '__name__', tool)}_arguments", __config__=config, **fields)
        schema = model.model_json_schema()
    except (PydanticSchemaGenerationError, PydanticUserError, TypeError) as exc:
        raise ConfigurationError(
            f"tool {tool!r}: no JSON schema for the parameters of {qualname} ({exc}); "
            "use JSON types and pydantic models, or give schema= and take one value (`def fn(args)`)"
        ) from exc
    # The generated titles ("Order", "lookup_order_arguments") say nothing the names do not.
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    layout = tuple(
        (p.name, role, p.kind is inspect.Parameter.POSITIONAL_ONLY)
        for p, role in zip(params, roles, strict=True)
        if p.kind is not inspect.Parameter.VAR_KEYWORD
    )
    return _Arguments(model=model, schema=schema, params=layout, var_keyword=var_keyword)
