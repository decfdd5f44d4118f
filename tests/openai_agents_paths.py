"""One rule on every path back to an OpenAI Agents SDK agent: what it receives live it receives again.

A probe agent (``Agent`` with one function tool, ``probe``, that takes any JSON object and returns a
drawn value) runs durably (``runledger.integrations.openai_agents.agent_spec``) on the SDK's own
``OpenAIResponsesModel`` and ``AsyncOpenAI`` client, which speak HTTP to a fake of the Responses API in
this process (an ``httpx.MockTransport``: the SDK's own parsing of the bodies) that answers each request
with a drawn body (tests/unit/test_replay_paths_openai_agents.py): a function call whose arguments are
a drawn object (unsorted, whole-number floats, names beyond U+FFFF), twice, then a message with drawn
text; its usage and a drawn field a compatible server adds. What the agent observed is the run's
result as the SDK hands it over: every input item of its conversation (the model's output items and
the tools' outputs, as the next request carries them), every raw response's output items, typed at
every node, and the final output.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import openai
from agents import Agent, FunctionTool, OpenAIProvider, RunConfig
from openai import AsyncOpenAI
from pydantic import BaseModel

from runledger import AgentSpec, DataPolicy
from runledger.integrations.openai_agents import OpenAIAgentsModel, agent_spec
from tests.openai_agents_shop import Killed
from tests.replay_paths import replay_observed, typed

if int(openai.__version__.split(".")[0]) >= 3:  # openai 3.x speaks HTTP through httpx2 (openai-agents 0.21 on)
    import httpx2 as httpx
else:
    import httpx

if TYPE_CHECKING:
    from runledger.log.client import LedgerClient
    from runledger.testing import ReplayResult

VALUES: dict[str, Any] = {}  # "answers": the output items of each request; "results": what each probe returns
STOP_AT: list[int] = []  # when set, the process dies as it sends that request (1-based)
OBSERVED: list[str] = []
CALLS: list[str] = []  # every request the fake answered: a resume makes none for a recorded step
REQUESTS = 3


def observed(value: Any) -> Any:
    """``typed`` at every node; an SDK object (any pydantic model) as its class, the fields it has set and
    its fields and extras in order (as tests/openai_paths.py observes the OpenAI SDK's)."""
    if isinstance(value, BaseModel):
        fields = {**value.__dict__, **(value.__pydantic_extra__ or {})}
        return {type(value).__name__: {"set": sorted(value.model_fields_set),
                                       "fields": [[k, observed(v)] for k, v in fields.items()]}}  # fmt: skip
    if type(value) is dict:
        return {"dict": [[observed(k), observed(v)] for k, v in value.items()]}
    if type(value) in (list, tuple):
        return {type(value).__name__: [observed(v) for v in value]}
    return typed(value)


def answer(request: httpx.Request) -> httpx.Response:
    """The drawn answer to the request: the n-th of the conversation (n: the tool outputs it carries)."""
    CALLS.append(request.url.path)
    items = json.loads(request.content or b"{}").get("input") or []
    n = sum(1 for i in items if isinstance(i, dict) and i.get("type") == "function_call_output")
    if STOP_AT and n + 1 == STOP_AT[0]:
        raise Killed(f"killed sending request {n + 1}")
    usage = {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens_details": {"reasoning_tokens": 0}}  # fmt: skip
    body = {"id": f"resp_{n}", "object": "response", "created_at": 1700000000, "model": "gpt-probe",
            "status": "completed", "output": VALUES["answers"][n], "parallel_tool_calls": True,
            "tool_choice": "auto", "tools": [], "provider": VALUES["extra"], "usage": usage}  # fmt: skip
    # ensure_ascii=False: names beyond U+FFFF travel as themselves; a float as Python writes it (210.0).
    return httpx.Response(
        200, content=json.dumps(body, ensure_ascii=False).encode(), headers={"content-type": "application/json"}
    )


def provider() -> OpenAIProvider:
    http = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    client = AsyncOpenAI(api_key="sk-probe", base_url="http://probe.invalid/v1", http_client=http, max_retries=0)
    return OpenAIProvider(openai_client=client)


async def _probe(ctx: Any, arguments: str) -> Any:
    """The drawn result of the call (``call_1``, ``call_2``: by the id the fake gave it)."""
    return VALUES["results"][int(str(ctx.tool_call_id).removeprefix("call_")) - 1]


def build() -> Agent[Any]:
    tool = FunctionTool(name="probe", description="Probe anything.", on_invoke_tool=_probe, strict_json_schema=False,
                        params_json_schema={"type": "object", "additionalProperties": True})  # fmt: skip
    return Agent(name="oa-agents-probe", instructions="Probe twice, then answer.", model="gpt-probe", tools=[tool])


def spec() -> AgentSpec:
    return agent_spec(
        build(), agent_version="oa-agents-probe-v1", model=OpenAIAgentsModel(provider, model="gpt-probe"),
        run_config=lambda run: RunConfig(tracing_disabled=True), data_policy=DataPolicy(capture="full"),
        result=_observation,
    )  # fmt: skip


def _observation(result: Any) -> dict[str, str]:
    seen = [
        ["items", [observed(i) for i in result.to_input_list()]],
        ["responses", [[observed(o) for o in r.output] for r in result.raw_responses]],
        ["usage", [observed(r.usage.input_tokens_details) for r in result.raw_responses]],
        ["final", observed(result.final_output)],
    ]
    text = json.dumps(seen, ensure_ascii=False)
    OBSERVED.append(text)
    return {"observed": text}


def reset(values: dict[str, Any]) -> None:
    VALUES.clear()
    VALUES.update(values)
    OBSERVED.clear()
    STOP_AT.clear()
    CALLS.clear()


# -- the paths ---------------------------------------------------------------------------------------------


async def live(client: LedgerClient, run_id: str, make: Callable[[], AgentSpec] = spec) -> str:
    """A recorded run, driven live: what the agent observed."""
    from runledger.sdk.lifecycle import start_run

    result = await start_run(client, make(), "probe", run_id=run_id)
    assert result.status == "completed", result
    return str(result.output["observed"])


async def resumed(client: LedgerClient, run_id: str, stop_at: int, make: Callable[[], AgentSpec] = spec) -> str:
    """A run killed as it sent request ``stop_at`` (the steps before it recorded), then resumed: what the
    resume observed, from its journal up to the kill and live after it. A recorded step calls no API."""
    from runledger.sdk.lifecycle import resume_run, start_run

    STOP_AT.append(stop_at)
    calls = len(CALLS)
    try:
        await start_run(client, make(), "probe", run_id=run_id)
    except Killed:
        pass
    else:
        raise AssertionError("the first drive was not killed")
    STOP_AT.clear()
    CALLS[calls:] = CALLS[calls:-1]  # the request the process died sending was never answered
    calls = len(CALLS)
    result = await resume_run(client, make(), run_id)
    assert result.status == "completed", result
    assert len(CALLS) - calls == REQUESTS - (stop_at - 1), f"the resume called the API for a recorded step: {CALLS}"
    return str(result.output["observed"])


async def replayed(client: LedgerClient, run_id: str, make: Callable[[], AgentSpec] = spec) -> tuple[ReplayResult, str]:
    """The recorded run exported and replayed in this process: the result and what the agent observed."""
    return await replay_observed(client, run_id, make(), OBSERVED, CALLS)
