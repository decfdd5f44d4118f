"""Agents used by the crash and resume tests (importable by subprocesses as tests.agents:NAME)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from runledger import AgentSpec, Budgets, ModelResponse, Run, ScriptedModel


def _count(name: str, value: Any) -> Any:
    """Append a call to the file named by $TEST_CALLS_LOG: the tests count real calls."""
    with open(os.environ["TEST_CALLS_LOG"], "a") as f:
        f.write(json.dumps({"call": name, "value": value}) + "\n")
    return {"done": value}


async def spender(run: Run) -> int:
    """Calls the model until its token budget stops it (each call costs 40 tokens)."""
    for i in range(20):
        await run.model([{"role": "user", "content": f"turn {i}"}])
    return 20


def spender_spec() -> AgentSpec:
    reply = ModelResponse(content="ok", input_tokens=30, output_tokens=10)
    return AgentSpec(
        "spender",
        spender,
        ScriptedModel(lambda m: reply, name="fixed-40"),
        agent_version="v1",
        budgets=Budgets(tokens=100),
    )


async def unreconciled(run: Run) -> Any:
    """An effect with no reconcile function: a crash inside it leaves it in doubt."""
    first = await run.tool("read", 1, fn=lambda a: a)
    charged = await run.effect("charge", {"amount": 5}, key="charge:inv-1", fn=lambda a: _count("charge", a))
    return {"first": first, "charged": charged}


def unreconciled_spec() -> AgentSpec:
    return AgentSpec("unreconciled", unreconciled, ScriptedModel([]), agent_version="v1")


def _unreachable(key: str) -> Any:
    raise ConnectionError("payments service unreachable")


async def unreachable(run: Run) -> Any:
    """An effect whose reconcile function cannot reach its service: a crash inside it stays in doubt."""
    charged = await run.effect(
        "charge", {"amount": 7}, key="charge:inv-2", fn=lambda a: _count("charge", a), reconcile=_unreachable
    )
    return {"charged": charged}


def unreachable_spec() -> AgentSpec:
    return AgentSpec("unreachable", unreachable, ScriptedModel([]), agent_version="v1")


def calls(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


# -- an ordinary agent: parallel tool calls, unsorted dicts, prompts built with json.dumps -----------------


def _lookup(args: dict[str, Any]) -> dict[str, Any]:
    """A read tool returning a dict in no sorted order (as most real tools do)."""
    delay = float(os.environ.get("TEST_TOOL_DELAY", "0"))
    if delay:
        import random
        import time

        time.sleep(random.uniform(0, delay))  # parallel calls finish in any order
    shard = args["shard"]
    return {"zeta": shard * 3, "order": args["order"], "alpha": {"y": 1.5, "b": [shard, "x"]}, "mid": None}


def _effect_counter(name: str) -> Any:
    def act(args: Any) -> Any:
        return _count(name, args)

    return act


def _keyed_service(name: str) -> tuple[Any, Any]:
    """An effect function that passes its idempotency key downstream (the service logs it and
    answers a repeated key with the first result), and the reconcile that asks the service."""
    from runledger import NOT_FOUND, EffectContext

    log = Path(os.environ["TEST_CALLS_LOG"])

    def act(args: Any) -> Any:
        key = EffectContext.current().key  # type: ignore[union-attr]
        for seen in calls(log):
            if seen.get("key") == key:
                return {"done": seen["value"]}
        with open(log, "a") as f:
            f.write(json.dumps({"call": name, "value": args, "key": key}) + "\n")
        return {"done": args}

    def reconcile(key: str) -> Any:
        for seen in calls(log):
            if seen.get("key") == key:
                return {"done": seen["value"]}
        return NOT_FOUND

    return act, reconcile


async def ordinary(run: Run) -> dict[str, Any]:
    """One model turn asks for 8 lookups at once; their results go back into the next prompt
    with ``json.dumps`` (no ``sort_keys``); then two effects run in parallel."""
    import asyncio

    order = run.input["order"]
    charge, charge_reconcile = _keyed_service("charge")
    notify, notify_reconcile = _keyed_service("notify")
    plan = await run.model([{"role": "user", "content": f"look up {order} on every shard"}])
    shards = json.loads(plan.content)["shards"]
    found = await asyncio.gather(*(run.tool("lookup", {"order": order, "shard": s}, fn=_lookup) for s in shards))
    decision = await run.model([{"role": "user", "content": "results: " + json.dumps(found)}])
    charged, told = await asyncio.gather(
        # Keys name the order and the run: the crash tests run the same order many times over.
        # A kill inside an effect leaves its claim in doubt: reconcile asks the service by key.
        run.effect("charge", {"order": order, "amount": 7}, key=f"charge:{order}:{run.run_id}",
                   fn=charge, reconcile=charge_reconcile),
        run.effect("notify", {"order": order, "text": decision.content}, key=f"notify:{order}:{run.run_id}",
                   fn=notify, reconcile=notify_reconcile),
    )  # fmt: skip
    return {"decision": decision.content, "charged": charged, "told": told, "found": found}


def _ordinary_model(messages: list[dict[str, Any]]) -> str:
    text = str(messages[-1]["content"])
    if text.startswith("look up"):
        return json.dumps({"shards": list(range(8))})
    # The reply depends on the exact prompt text: a prompt built differently after a resume
    # (another key order) would change it and be caught as a divergence.
    import hashlib

    return "approve:" + hashlib.sha256(text.encode()).hexdigest()[:12]


def ordinary_spec() -> AgentSpec:
    return AgentSpec("ordinary", ordinary, ScriptedModel(_ordinary_model, name="scripted-ordinary"), agent_version="v1")


# -- child runs: a parent that runs two children, the second in parallel with a tool call ------------------


def _work(args: dict[str, Any]) -> Any:
    """A child's read tool: counted (a completed child must never call it again), slow enough
    with $TEST_TOOL_DELAY for a random kill to land inside a child."""
    delay = float(os.environ.get("TEST_TOOL_DELAY", "0"))
    if delay:
        import time

        time.sleep(delay)
    return _count(f"work:{args['n']}", args)


async def kid(run: Run) -> dict[str, Any]:
    """A child run: two counted tool calls and one effect (exactly once, whatever the crashes)."""
    n = run.input["n"]
    parts = [await run.tool("work", {"n": n, "part": part}, fn=_work) for part in (1, 2)]
    charged = await run.effect("charge", {"n": n}, key=f"charge:{run.run_id}", fn=_effect_counter(f"charge:{n}"))
    return {"n": n, "parts": parts, "charged": charged}


def kid_spec() -> AgentSpec:
    return AgentSpec("kid", kid, ScriptedModel([]), agent_version="v1")


async def family(run: Run) -> dict[str, Any]:
    """Child 1, then child 2 and a tool call at once; the children's outputs are its step results."""
    import asyncio

    first = await run.child(kid_spec(), {"n": 1})
    second, side = await asyncio.gather(
        run.child(kid_spec(), {"n": 2}), run.tool("side", {"x": run.input["x"]}, fn=_effect_counter("side"))
    )
    return {"first": first, "second": second, "side": side}


def family_spec() -> AgentSpec:
    return AgentSpec("family", family, ScriptedModel([]), agent_version="v1")


def family_sandboxed_spec() -> AgentSpec:
    """``family`` versioned by its code hash: what a sandbox re-run checks the mounted code against."""
    return AgentSpec("family", family, ScriptedModel([]))


# -- output durability: steps acknowledged in windows, effects counted by the service ----------------------

WINDOW_EVENTS = 8


def _windowed_model(messages: list[dict[str, Any]]) -> Any:
    """Counted: a model call the kill made lost is made again on resume (its spend re-spent)."""
    from runledger import ModelResponse

    _count("model", messages[-1]["content"])
    return ModelResponse(content="ok", input_tokens=30, output_tokens=10)


def _charge_service() -> tuple[Any, Any]:
    """An effect that logs every call it gets with its key (a second call is a repeated effect),
    and the reconcile that asks the log."""
    from runledger import NOT_FOUND, EffectContext

    log = Path(os.environ["TEST_CALLS_LOG"])

    def act(args: Any) -> Any:
        key = EffectContext.current().key  # type: ignore[union-attr]
        with open(log, "a") as f:
            f.write(json.dumps({"call": "charge", "value": args, "key": key}) + "\n")
        return {"charged": args}

    def reconcile(key: str) -> Any:
        found = [c for c in calls(log) if c.get("key") == key]
        return {"charged": found[0]["value"]} if found else NOT_FOUND

    return act, reconcile


async def windowed(run: Run) -> list[Any]:
    """Rounds of 4 model calls and 4 read tools, then a charge (an effect): in output durability the
    model and tool steps of a round wait in the window until the charge commits them."""
    marker = os.environ.get("TEST_STARTED_MARKER")
    if marker:
        Path(marker).touch()
    act, reconcile = _charge_service()
    charged = []
    for r in range(run.input["rounds"]):
        for j in range(4):
            await run.model([{"role": "user", "content": f"{run.run_id}:round {r} turn {j}"}])
            await run.tool("lookup", {"order": r, "shard": j}, fn=_lookup)
        key = f"charge:{run.run_id}:{r}"
        charged.append(await run.effect("charge", {"round": r}, key=key, fn=act, reconcile=reconcile))
    if marker:
        Path(marker + ".end").touch()
    return charged


def windowed_spec() -> AgentSpec:
    return AgentSpec(
        "windowed", windowed, ScriptedModel(_windowed_model, name="scripted-windowed"), agent_version="v1",
        durability="output", window_events=WINDOW_EVENTS, window_ms=1000.0,
    )  # fmt: skip


# -- a model that is always rate limited: the run fails retryably ------------------------------------------


def _rate_limited(messages: list[dict[str, Any]]) -> Any:
    from runledger.errors import ModelError

    raise ModelError("429: rate limited", retryable=True, status=429)


async def asker(run: Run) -> str:
    return (await run.model([{"role": "user", "content": "hi"}])).content


def rate_limited_spec() -> AgentSpec:
    from runledger.sdk.retry import NO_RETRY

    return AgentSpec("asker", asker, ScriptedModel(_rate_limited, name="limited", retry=NO_RETRY), agent_version="v1")


# -- an effect under a business key: a second run for the same order is served from the first's record ------


async def refunder(run: Run) -> Any:
    return await run.effect("refund", {"order": "o-1"}, key="refund:o-1", fn=lambda a: _count("refund", a))


def refunder_spec() -> AgentSpec:
    return AgentSpec("refunder", refunder, ScriptedModel([]), agent_version="v1")


# -- an approval: the run waits for `runledger approve`, then `runledger resume` finishes it -------------------


async def approver(run: Run) -> str:
    await run.approval("go", {"what": "answer"})
    return (await run.model([{"role": "user", "content": "go"}])).content


def approver_spec() -> AgentSpec:
    return AgentSpec("approver", approver, ScriptedModel(["done"], name="fixed"), agent_version="v1")


def windowed_step_spec() -> AgentSpec:
    """``windowed`` in step durability: the same effects, every step acknowledged before it returns."""
    return AgentSpec("windowed", windowed, ScriptedModel(_windowed_model, name="scripted-windowed"), agent_version="v1")


class _SourceDown(AgentSpec):
    """A spec whose tools' source (an MCP server, say) cannot be listed: every live tool or effect call of
    a run it resumes is refused before anything of it is recorded (``AgentSpec.before_live``)."""

    async def before_live(self, tool: str, run_id: str, recorded: Any = None) -> None:
        from runledger.errors import ConfigurationError

        raise ConfigurationError(f"the source of tool {tool!r} is down (tests.agents:source_down_spec)")


def source_down_spec() -> AgentSpec:
    """``windowed`` in step durability, resumed while its tools' source is down: only what the record
    and the effects' keys already hold can be served."""
    spec = windowed_step_spec()
    return _SourceDown(spec.name, spec.fn, spec.model, agent_version=spec.agent_version)
