"""One rule on every path back to an agent: what it receives live is what it receives on replay.

A *probe* agent receives arbitrary JSON-like values (drawn by the tests: dicts in any key order,
integral and non-integral floats, ``-0.0``, large integers, names beyond U+FFFF, tuples, empty
containers) through every kind of call that hands a value back:

- a model reply whose adapter's response type carries a framework object (``ProbeResponse.payload``,
  as an integration's subclass carries the framework's own response), and whose tool call's
  arguments are a dict;
- a read tool's result, an effect's result;

and, as agent code does, serialises what it received into its next request (``json.dumps`` without
``sort_keys``), so a value that differs in key order or number type makes the next request's digest
differ. Its output is what it observed, *typed* (``typed``: every node tagged with its Python type,
dict keys in the order the agent saw them), as a JSON string, which every path carries unchanged
(a container's output included); ``OBSERVED`` keeps the same in this process. The output also holds
``made``, a value the agent itself built (not received), which the record keeps canonically and a
replay must judge in the run's chain format.

The raw values live in ``VALUES`` (this process only): the model and the tools read them there, as a
real model and real tools produce values the SDK never saw before. A test sets them, drives the agent
live, then through a path back (a resume after a kill at a random call, ``SyncRun``, the in-process
replayer, a sandbox re-drive) and compares the observations.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runledger import AgentSpec, DataPolicy, ModelResponse, Run, SyncRun, tool
from runledger.sdk.sync import sync_agent
from tests.killed import killed

if TYPE_CHECKING:
    from runledger.log.client import LedgerClient
    from runledger.testing import ReplayResult

AGENT = "probe"
VERSION = "probe-v1"

VALUES: dict[str, Any] = {}  # "reply", "args", "result", "effect", "made": set by the test
OBSERVED: list[str] = []  # the typed observations of each drive in this process, in order
ACTED: list[Any] = []  # every real execution of the effect's function
STOP_AFTER: list[int] = []  # when set, the agent dies (an uncaught BaseException) after that many values


class Killed(BaseException):
    """The process dying between two steps: nothing records an outcome."""


def typed(value: Any) -> Any:
    """``value`` with its type at every node and its dicts' keys in their order: two values are the
    same observation exactly when their ``typed`` forms are equal (``1`` is not ``1.0``, ``(1,)`` is not
    ``[1]``, ``{"a":1,"b":2}`` is not ``{"b":2,"a":1}``, ``-0.0`` is not ``0.0``)."""
    kind = type(value)
    if kind is dict:
        return {"dict": [[typed(k), typed(v)] for k, v in value.items()]}
    if kind is list or kind is tuple:
        return {kind.__name__: [typed(v) for v in value]}
    if kind is float:
        return {"float": repr(value)}
    if kind is int:
        return {"int": str(value)}
    if value is None or kind is bool or kind is str:
        return {kind.__name__: value}
    return {kind.__name__: repr(value)}


class ProbeResponse(ModelResponse):
    """A response type that carries a framework's own object (as Pydantic AI's and OpenAI's do)."""

    payload: Any = None


class ProbeModel:
    """Answers every request with ``VALUES["reply"]`` as the framework object and one tool call whose
    arguments are ``VALUES["args"]`` (a dict, in the key order the test drew)."""

    name = "probe-model"
    response_type = ProbeResponse

    async def complete(self, messages: list[dict[str, Any]], **params: Any) -> ModelResponse:
        call = {"id": f"call-{len(messages)}", "type": "function",
                "function": {"name": "probe", "arguments": VALUES["args"]}}  # fmt: skip
        return ProbeResponse(content=f"turn {len(messages)}", tool_calls=[call], payload=VALUES["reply"])


@tool(inline=True)
def probe(value: Any) -> Any:
    """A keyword read tool: its result is ``VALUES["result"]`` whatever it is given."""
    return VALUES["result"]


def _store(args: dict[str, Any]) -> Any:
    ACTED.append(args)
    return VALUES["effect"]


store = tool("store", effect="write", key=lambda a: f"store:{a['order']}", inline=True)(_store)


def _saw(seen: list[Any], kind: str, value: Any) -> None:
    seen.append([kind, typed(value)])
    if STOP_AFTER and len(seen) >= STOP_AFTER[0]:
        raise Killed(f"killed after {len(seen)} values")


def _finish(seen: list[Any]) -> dict[str, Any]:
    text = json.dumps(seen, ensure_ascii=False)
    OBSERVED.append(text)
    return {"observed": text, "made": VALUES.get("made")}  # none in a container (this process only)


async def prober(run: Run) -> Any:
    seen: list[Any] = []
    reply = await run.model([{"role": "user", "content": "probe"}])
    assert isinstance(reply, ProbeResponse), type(reply)
    arguments = reply.tool_calls[0]["function"]["arguments"]
    _saw(seen, "reply", reply.payload)
    _saw(seen, "args", arguments)
    result = await run.tool(probe, {"value": arguments})
    _saw(seen, "result", result)
    done = await run.tool(store, {"order": run.input["order"], "value": result})
    _saw(seen, "effect", done)
    # What it received goes into its next request as agent code writes it: no sort_keys.
    history = [json.dumps(x, ensure_ascii=False) for x in (reply.payload, arguments, result, done)]
    final = await run.model([{"role": "user", "content": "probe"}, *({"role": "tool", "content": h} for h in history)])
    assert isinstance(final, ProbeResponse), type(final)
    _saw(seen, "final", final.payload)
    return _finish(seen)


def sync_prober(run: SyncRun) -> Any:
    """``prober`` on the blocking facade."""
    seen: list[Any] = []
    reply = run.model([{"role": "user", "content": "probe"}])
    assert isinstance(reply, ProbeResponse), type(reply)
    arguments = reply.tool_calls[0]["function"]["arguments"]
    _saw(seen, "reply", reply.payload)
    _saw(seen, "args", arguments)
    result = run.tool(probe, {"value": arguments})
    _saw(seen, "result", result)
    done = run.tool(store, {"order": run.input["order"], "value": result})
    _saw(seen, "effect", done)
    history = [json.dumps(x, ensure_ascii=False) for x in (reply.payload, arguments, result, done)]
    final = run.model([{"role": "user", "content": "probe"}, *({"role": "tool", "content": h} for h in history)])
    assert isinstance(final, ProbeResponse), type(final)
    _saw(seen, "final", final.payload)
    return _finish(seen)


# Recorded in full: redaction (which a value drawn at random may trip, a long digit string) is a
# deliberate difference between live and replay, not the one under test.
POLICY = DataPolicy(capture="full")


def spec() -> AgentSpec:
    return AgentSpec(
        AGENT, prober, ProbeModel(), agent_version=VERSION, tools=[probe, store], data_policy=POLICY
    )  # fmt: skip


def sync_spec() -> AgentSpec:
    return AgentSpec(
        AGENT, sync_agent(sync_prober), ProbeModel(), agent_version=VERSION, tools=[probe, store], data_policy=POLICY
    )  # fmt: skip


def reset(values: dict[str, Any]) -> None:
    VALUES.clear()
    VALUES.update(values)
    OBSERVED.clear()
    ACTED.clear()
    STOP_AFTER.clear()


def differences(live: str, replayed: str) -> str:
    """The first observation that differs, for an assertion's message."""
    a, b = json.loads(live), json.loads(replayed)
    for x, y in zip(a, b, strict=False):
        if x != y:
            return f"{x[0]}: live {json.dumps(x[1])[:400]}\n   replay {json.dumps(y[1])[:400]}"
    return f"{len(a)} observations live, {len(b)} on replay"


# -- the paths, shared by the in-memory (tests/unit) and the real-server suites (tests/integration) -----


async def live(client: LedgerClient, run_id: str, make: Callable[[], AgentSpec] = spec) -> str:
    """A recorded run, driven live: what the agent observed."""
    from runledger.sdk.lifecycle import start_run

    result = await start_run(client, make(), {"order": run_id}, run_id=run_id)
    assert result.status == "completed", result
    return str(result.output["observed"])


async def resumed(client: LedgerClient, run_id: str, stop_after: int, make: Callable[[], AgentSpec] = spec) -> str:
    """A run killed after ``stop_after`` values (no outcome recorded), then resumed: what the resume
    observed, from its journal up to the kill and live after it."""
    from runledger.sdk.lifecycle import resume_run, start_run

    STOP_AFTER.append(stop_after)
    await killed(start_run(client, make(), {"order": run_id}, run_id=run_id), Killed)
    STOP_AFTER.clear()
    result = await resume_run(client, make(), run_id)
    assert result.status == "completed", result
    return str(result.output["observed"])


async def replay_observed(
    client: LedgerClient, run_id: str, agent: AgentSpec, observed: list[str], calls: list[str] | None = None
) -> tuple[ReplayResult, str]:
    """The recorded run exported and replayed in this process with ``agent``: the result and what the agent
    observed (the entry it added to ``observed``, "" if none). With ``calls`` (a probe's log of the requests
    its fake answered), the replayer must have made none. Every probe's ``replayed`` is this."""
    from runledger.testing import Replayer
    from runledger.testing.export import read_recording

    recording = await read_recording(client, run_id)
    before, made = len(observed), len(calls or ())
    result = await Replayer(agent).replay(recording)
    assert len(calls or ()) == made, "the replayer called the API"
    return result, observed[-1] if len(observed) > before else ""


async def replayed(client: LedgerClient, run_id: str) -> tuple[ReplayResult, str]:
    """The recorded run exported and replayed in this process: the result and what the agent observed."""
    return await replay_observed(client, run_id, spec(), OBSERVED)


async def redriven(client: LedgerClient, run_id: str, fork_step: int, pool: Any) -> str:
    """A re-drive of the recorded run from ``fork_step`` through ``Rerunner.rerun``: the agent on the
    guest's ``RemoteRun`` (in-process, or in a container), the host's ``BranchRun`` answering."""
    from runledger.sandbox.rerun import Rerunner, RerunRequest
    from runledger.sdk.agent import CodeAllowList

    request = RerunRequest(parent_run_id=run_id, agent="tests.replay_paths:spec", mode="redrive", fork_step=fork_step)
    result = await Rerunner(client, pool, allowed=CodeAllowList((".", "tests"))).rerun(request)
    for sandbox in getattr(pool, "sandboxes", []):
        await sandbox.close()
    assert result.status == "completed", result
    return str(result.output["observed"])
