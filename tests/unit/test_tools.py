"""Tools as typed functions (runledger.sdk.tools): the schema derived from the signature, the
arguments validated before a call, the schema hash of the version tuple, the decorated function
still callable as itself, and sync tools off the event loop. No server: everything here is pure."""

from __future__ import annotations

import asyncio
import inspect
import pickle
import threading
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field

from runledger import AgentSpec, ScriptedModel, Tool, tool
from runledger.errors import ConfigurationError, ToolArgumentsError
from runledger.sdk.context import EffectContext, bound
from runledger.sdk.deferred_tools import DeferredTools


class Item(BaseModel):
    sku: str
    qty: int = 1


@tool
def lookup_order(order: str, include_items: bool = False) -> dict[str, Any]:
    """Look up an order by its number."""
    return {"order": order, "items": ["blender"] if include_items else []}


@tool("restock", effect="write", key=lambda a: f"restock:{a['warehouse']}")
async def restock(warehouse: str, items: list[Item], note: str | None = None) -> dict[str, Any]:
    return {"warehouse": warehouse, "skus": [i.sku for i in items], "units": sum(i.qty for i in items), "note": note}


@tool("legacy")
def legacy(args: dict[str, Any]) -> Any:
    return args


# -- the schema -----------------------------------------------------------------------------------------------


def test_the_schema_is_derived_from_the_type_hints_with_defaults() -> None:
    assert lookup_order.takes_keywords
    assert lookup_order.parameters == {
        "type": "object",
        "properties": {"order": {"type": "string"}, "include_items": {"type": "boolean", "default": False}},
        "required": ["order"],
        "additionalProperties": False,
    }


def test_optional_parameters_lists_and_nested_models_are_in_the_schema() -> None:
    schema = restock.parameters
    assert schema["required"] == ["warehouse", "items"]
    assert schema["properties"]["items"] == {"type": "array", "items": {"$ref": "#/$defs/Item"}}
    assert schema["properties"]["note"] == {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}
    assert schema["$defs"]["Item"]["required"] == ["sku"]
    assert schema["$defs"]["Item"]["properties"]["qty"]["default"] == 1


def test_field_descriptions_and_awkward_names_pass_through() -> None:
    def search(json: Annotated[str, Field(description="the query")], model_name: str = "m") -> str:
        return json + model_name

    schema = Tool("search", search).parameters
    assert schema["properties"]["json"] == {"type": "string", "description": "the query"}
    assert set(schema["properties"]) == {"json", "model_name"}


def test_json_schema_is_an_openai_style_function_description() -> None:
    assert lookup_order.json_schema() == {
        "name": "lookup_order",
        "description": "Look up an order by its number.",
        "parameters": lookup_order.parameters,
    }
    described = tool("t", description="Say it.")(lambda a: a)
    assert described.json_schema() == {
        "name": "t",
        "description": "Say it.",
        "parameters": {"type": "object", "properties": {}},
    }


def test_an_explicit_schema_wins_over_the_signature() -> None:
    given = {"type": "object", "properties": {"order": {"type": "string", "pattern": "^order-"}}}
    explicit = tool("lookup_order", schema=given)(lookup_order.fn)
    assert explicit.parameters == given
    assert explicit.json_schema()["parameters"] == given
    assert explicit.schema_hash != lookup_order.schema_hash
    # The signature still validates the call.
    assert "include_items" in str(explicit.argument_error({"order": "order-1", "include_items": "maybe"}))


def test_the_schema_hash_changes_when_a_parameter_type_changes() -> None:
    def v1(order: str, amount: float) -> None: ...

    def v2(order: str, amount: int) -> None: ...

    def v1_again(order: str, amount: float) -> None: ...

    first, second, same = Tool("refund", v1), Tool("refund", v2), Tool("refund", v1_again)
    assert first.schema_hash != second.schema_hash
    assert first.schema_hash == same.schema_hash
    tuple_1 = AgentSpec("a", _agent, ScriptedModel([]), tools=[first], agent_version="x").version()
    tuple_2 = AgentSpec("a", _agent, ScriptedModel([]), tools=[second], agent_version="x").version()
    assert tuple_1.tool_schema_hashes["refund"] != tuple_2.tool_schema_hashes["refund"]


def test_value_tools_keep_the_schema_hash_they_always_had() -> None:
    from runledger.record.canonical import digest

    # What runledger recorded for tools before typed tools existed: the given schema, or {}.
    assert legacy.schema_hash == digest({"name": "legacy", "effect_class": "read", "schema": {}})
    given = {"type": "object", "properties": {"order": {"type": "string"}}}
    old_style = tool("lookup_order", schema=given)(legacy.fn)
    assert old_style.schema_hash == digest({"name": "lookup_order", "effect_class": "read", "schema": given})
    assert not legacy.takes_keywords and legacy.parameters == {}


@pytest.mark.parametrize(
    "fn",
    [lambda a: a, len, lambda a=None: a],
    ids=["lambda", "builtin", "default"],
)
def test_one_positional_value_parameter_takes_the_value_as_it_is(fn: Any) -> None:
    assert not Tool("t", fn).takes_keywords


def test_other_signatures_take_keywords() -> None:
    def typed_one(order: str) -> str:
        return order

    def none() -> str:
        return "now"

    def mapping_and_more(args: dict[str, Any], n: int) -> None: ...

    assert all(Tool("t", f).takes_keywords for f in (typed_one, none, mapping_and_more))


def test_signatures_without_a_json_schema_are_refused_clearly() -> None:
    def star(*names: str) -> None: ...

    def opaque(lock: threading.Lock) -> None: ...

    with pytest.raises(ConfigurationError, match=r"tool 'star'.*\*names"):
        _ = Tool("star", star).parameters
    with pytest.raises(ConfigurationError, match="tool 'opaque': no JSON schema"):
        _ = Tool("opaque", opaque).parameters


# -- validation -----------------------------------------------------------------------------------------------


def test_validation_errors_name_the_tool_and_each_field_never_the_value() -> None:
    error = lookup_order.argument_error({"order": "order-1", "include_items": "maybe-SECRET", "colour": "red"})
    assert isinstance(error, ToolArgumentsError)
    message = str(error)
    assert message.startswith("invalid arguments for tool 'lookup_order': ")
    assert "include_items: Input should be a valid boolean" in message
    assert "colour: Extra inputs are not permitted" in message
    assert "SECRET" not in message
    assert "order: Field required" in str(lookup_order.argument_error({}))


def test_nested_fields_are_named_by_their_path() -> None:
    error = restock.argument_error({"warehouse": "w1", "items": [{"sku": "a"}, {"qty": "two"}]})
    assert error is not None
    assert "items.1.sku: Field required" in str(error)
    assert "items.1.qty: Input should be a valid integer" in str(error)


def test_keyword_tools_take_a_json_object() -> None:
    assert "must be a JSON object" in str(lookup_order.argument_error(["order-1"]))
    assert lookup_order.argument_error({"order": "order-1"}) is None
    assert legacy.argument_error(["anything", 1]) is None  # value tools are not validated


def test_the_error_survives_pickling() -> None:
    error = ToolArgumentsError("t", "x: Field required")
    assert str(pickle.loads(pickle.dumps(error))) == str(error)


# -- calling --------------------------------------------------------------------------------------------------


async def test_call_validates_then_calls_with_keywords_and_models() -> None:
    assert await lookup_order.call({"order": "order-1", "include_items": "true"}) == {
        "order": "order-1",
        "items": ["blender"],
    }
    got = await restock.call({"warehouse": "w1", "items": [{"sku": "a", "qty": 2}, {"sku": "b"}]})
    assert got == {"warehouse": "w1", "skus": ["a", "b"], "units": 3, "note": None}
    assert await legacy.call({"any": "thing"}) == {"any": "thing"}


async def test_a_bad_argument_never_calls_the_function() -> None:
    calls: list[Any] = []

    def record(order: str) -> None:
        calls.append(order)

    with pytest.raises(ToolArgumentsError, match="order: Input should be a valid string"):
        await Tool("record", record).call({"order": 7})
    assert calls == []


async def test_positional_only_and_var_keyword_parameters() -> None:
    def fn(a: int, /, b: int = 2, **rest: Any) -> list[Any]:
        return [a, b, rest]

    assert await Tool("fn", fn).call({"a": "1", "c": 3}) == [1, 2, {"c": 3}]


def test_the_decorated_function_is_still_callable_as_itself() -> None:
    assert lookup_order("order-9", include_items=True) == {"order": "order-9", "items": ["blender"]}
    assert legacy({"x": 1}) == {"x": 1}
    assert lookup_order.__name__ == "lookup_order" and lookup_order.__doc__ == "Look up an order by its number."
    assert str(inspect.signature(lookup_order)) == "(order: 'str', include_items: 'bool' = False) -> 'dict[str, Any]'"
    assert asyncio.run(restock("w", [Item(sku="s")])) == {"warehouse": "w", "skus": ["s"], "units": 1, "note": None}


async def test_a_sync_tool_runs_in_a_worker_thread_and_an_async_one_on_the_loop() -> None:
    loop_thread = threading.get_ident()
    seen: dict[str, int] = {}

    def sync_tool(name: str) -> None:
        seen[name] = threading.get_ident()

    async def async_tool(name: str) -> None:
        seen[name] = threading.get_ident()

    await Tool("s", sync_tool).call({"name": "sync"})
    await Tool("a", async_tool).call({"name": "async"})
    await Tool("v", lambda a: seen.__setitem__("value", threading.get_ident())).call(None)
    assert seen["sync"] != loop_thread and seen["value"] != loop_thread
    assert seen["async"] == loop_thread


async def test_sync_tools_called_together_run_at_the_same_time() -> None:
    barrier = threading.Barrier(2, timeout=5)  # both must be in their threads at once

    def wait(n: int) -> int:
        barrier.wait()
        return n

    assert await asyncio.gather(Tool("w", wait).call({"n": 1}), Tool("w", wait).call({"n": 2})) == [1, 2]


def test_a_lambda_with_a_bound_default_is_still_a_value_tool() -> None:
    planted = "p"
    value_tool = Tool("t", lambda a, p=planted: [a, p])
    assert not value_tool.takes_keywords
    assert asyncio.run(value_tool.call({"x": 1})) == [{"x": 1}, "p"]


# -- the effect's context -------------------------------------------------------------------------------------


def _value_with_context(args: dict[str, Any], ctx: runledger.EffectContext | None) -> Any:  # noqa: F821
    # (the hint names a module this file does not import: it stays as written, and still counts)
    return [args, ctx]


async def test_a_context_parameter_is_no_argument_and_receives_the_effect_context() -> None:
    def refund(order: str, amount: float, ctx: EffectContext | None = None) -> Any:
        return [order, amount, ctx]

    typed = Tool("refund", refund, "write", key=lambda a: a["order"])
    assert set(typed.parameters["properties"]) == {"order", "amount"}
    assert "ctx: Extra inputs" in str(typed.argument_error({"order": "o", "amount": 1, "ctx": {}}))
    value = Tool("value", _value_with_context)
    assert not value.takes_keywords
    ctx = EffectContext(key="refund:o", run_id="r", step=3, attempt=1, fencing_token=7)
    with bound(ctx):
        assert await typed.call({"order": "o", "amount": 2}) == ["o", 2.0, ctx]
        assert await value.call({"x": 1}) == [{"x": 1}, ctx]
    assert await typed.call({"order": "o", "amount": 2}) == ["o", 2.0, None]  # outside an effect


async def _agent(run: Any) -> None:
    return None


class Listed(DeferredTools):
    """Tools listed from outside the code, counting how often they were listed."""

    def __init__(self, *names: str) -> None:
        self.names, self.listings = names, 0

    def declare(self) -> list[Tool]:
        self.listings += 1
        return [Tool(name, lambda args: args) for name in self.names]


async def nothing(run: Any) -> None:
    return None


def test_deferred_tools_are_listed_once_when_the_spec_first_needs_them() -> None:
    listed = Listed("lookup", "note")
    spec = AgentSpec("deferred", nothing, ScriptedModel(["unused"]), tools=listed)
    assert listed.listings == 0 and not listed.is_declared  # building the spec lists nothing
    assert sorted(spec.version().tool_schema_hashes) == ["lookup", "note"]
    assert list(spec.tool_map) == ["lookup", "note"] and listed.listings == 1
    # ``server.tools(...) + [tool]`` concatenates as the list it used to be.
    assert [t.name for t in Listed("a") + [lookup_order]] == ["a", "lookup_order"]  # noqa: RUF005
    assert [t.name for t in [lookup_order] + Listed("a")] == ["lookup_order", "a"]  # noqa: RUF005


def test_duplicate_deferred_tool_names_are_refused_where_the_tools_are_first_needed() -> None:
    spec = AgentSpec("deferred", nothing, ScriptedModel(["unused"]), tools=Listed("a", "a"))
    with pytest.raises(ConfigurationError, match="duplicate tool names"):
        spec.version()
