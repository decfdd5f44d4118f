"""``--set tools=MODULE:ATTR``: new descriptions and parameter schemas the model sees, the same
implementations (``runledger.sandbox.rerun.branch_spec``), put in the model's ``tools`` parameter from the
fork on (``runledger.sandbox.branch.with_tool_schemas``)."""

from __future__ import annotations

from typing import Any

import pytest

from runledger.sandbox.branch import with_tool_schemas
from runledger.sandbox.errors import Refusal, RerunRequestError, refusal_of
from runledger.sandbox.rerun import RerunRequest, branch_spec, candidate_tools, changed_schemas
from runledger.sdk.agent import CodeAllowList
from tests.sandbox_agents.counterfactual import agent as cf

CF = "tests.sandbox_agents.counterfactual.agent"
ALLOWED = CodeAllowList((".",))


def change(what: str, value: str) -> RerunRequest:
    return RerunRequest(parent_run_id="p", agent=f"{CF}:spec", mode="counterfactual", change={what: value})


def test_new_descriptions_and_schemas_change_the_tool_element_and_keep_the_implementations() -> None:
    host = cf.spec()
    for candidate in ("CLEARER_TOOLS", "REWORDED_TOOLS"):  # schema and description; the description alone
        spec, ref, field, before, after = branch_spec(host, change("tools", f"{CF}:{candidate}"), ALLOWED)
        assert (ref, field) == (f"{CF}:spec", "tool_schema_hashes") and before != after
        (tool,) = spec.tools
        assert tool.fn is cf.lookup.fn and tool.json_schema()["description"] == cf.NEW_DESCRIPTION
        v0, v1 = host.version(), spec.version()
        assert (v1.agent_version, v1.model, v1.prompt_hash) == (v0.agent_version, v0.model, v0.prompt_hash)
        assert changed_schemas(host, spec) == {"lookup": tool.json_schema()}


@pytest.mark.parametrize(
    ("what", "value", "refusal", "words"),
    [
        ("tools", f"{CF}:REIMPLEMENTED_TOOLS", Refusal.TOOL_CODE, "changes its fn"),
        ("tools", f"{CF}:TOOLS", Refusal.ELEMENT, "it changes nothing"),
        ("tools", f"{CF}:nothing_here", Refusal.CANDIDATE, "cannot load tools"),
        ("tools", "os:listdir", Refusal.NOT_ALLOWED, "allow-list"),
        # Before the fix, the only message: "must change exactly the agent_version element ... it changes
        # ['agent_version', 'tool_schema_hashes']", with no way to change the schemas at all.
        ("agent", "tests.sandbox_agents.counterfactual.reschemaed.agent:spec", Refusal.ELEMENT, "--set tools="),
    ],
)
def test_a_tools_change_that_is_not_only_what_the_model_sees_is_refused_with_its_class(
    what: str, value: str, refusal: Refusal, words: str
) -> None:
    with pytest.raises(Exception) as caught:
        branch_spec(cf.spec(), change(what, value), ALLOWED)
    assert refusal_of(caught.value) is refusal and words in str(caught.value)


def test_a_tool_added_or_removed_is_a_code_change() -> None:
    with pytest.raises(RerunRequestError, match="a tool added or removed is a code change") as caught:
        candidate_tools(cf.spec(), [*cf.CLEARER_TOOLS, cf.lookup_elsewhere], "x:y")
    assert refusal_of(caught.value) is Refusal.TOOL_CODE


SCHEMA = {"name": "lookup", "description": "new", "parameters": {"type": "object", "properties": {}}}


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        # OpenAI chat completions
        ({"type": "function", "function": {"name": "lookup", "description": "old", "parameters": {}}},
         {"type": "function", "function": SCHEMA}),
        # Tool.json_schema(), OpenAI responses (with its type kept)
        ({"name": "lookup", "description": "old", "parameters": {}}, SCHEMA),
        ({"type": "function", "name": "lookup", "parameters": {}, "strict": True},
         {"type": "function", **SCHEMA, "strict": True}),
        # Anthropic
        ({"name": "lookup", "description": "old", "input_schema": {}},
         {"name": "lookup", "description": "new", "input_schema": SCHEMA["parameters"]}),
        # another tool, and what is not a tool at all, pass as they are
        ({"type": "function", "function": {"name": "other", "parameters": {}}},
         {"type": "function", "function": {"name": "other", "parameters": {}}}),
        ("lookup", "lookup"),
    ],
)  # fmt: skip
def test_the_candidate_schemas_replace_the_changed_tools_in_every_layout(entry: Any, expected: Any) -> None:
    assert with_tool_schemas([entry], {"lookup": SCHEMA}) == [expected]
