"""An agent for the mode tests whose every call leaves a trace on the host.

The model, the read tool and the effect run on the host (the broker calls them) and count their
calls in ``CALLS``; the model answers each call differently ("answer N"), the tool says which of
its calls served a lookup, so a value served from the record can never pass for a live one.
``probe`` also reads the clock and draws a random number before and after the fork point (step 3):
step 0 clock, 1 random, 2 lookup, 3 model, 4 lookup, 5 clock, 6 random, 7 model, 8 charge (effect).
The model's messages never feed a later call's arguments, so a re-drive with a live model stays
answerable by the record.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from runledger import AgentSpec, ModelResponse, Run, tool

CALLS: Counter[str] = Counter()
MODEL_REQUESTS: list[list[dict[str, Any]]] = []
PROMPT = "Answer briefly."
# Set on the host to make the charge fail (its key stays free for a live re-run to act on).
CHARGE_DOWN = "TEST_MODES_CHARGE_DOWN"


def reset() -> None:
    CALLS.clear()
    MODEL_REQUESTS.clear()


class CountingModel:
    """A model that counts its calls and never gives the same answer twice."""

    name = "counting-1"
    retry = None

    async def complete(self, messages: list[dict[str, Any]], **params: Any) -> ModelResponse:
        CALLS["model"] += 1
        MODEL_REQUESTS.append(messages)
        system = " ".join(str(m["content"]) for m in messages if m.get("role") == "system")
        return ModelResponse(content=f"answer {CALLS['model']} [{system}] to {messages[-1]['content']}",
                             input_tokens=5, output_tokens=5)  # fmt: skip


@tool("lookup")
def lookup(args: dict[str, Any]) -> dict[str, Any]:
    CALLS["lookup"] += 1
    return {"q": args["q"], "served_by_call": CALLS["lookup"]}


def _charge(args: dict[str, Any]) -> dict[str, Any]:
    if os.environ.get(CHARGE_DOWN):
        raise ConnectionError("the charging service is down")
    CALLS["charge"] += 1
    return {"charged": args["amount"], "by_call": CALLS["charge"]}


charge = tool("charge", effect="irreversible", key=lambda a: f"charge:{a['order']}")(_charge)
TOOLS = [lookup, charge]


async def probe(run: Run) -> dict[str, Any]:
    t0 = (await run.now()).isoformat()
    r0 = await run.random()
    a = await run.tool("lookup", {"q": "a"})
    m1 = (await run.model([{"role": "system", "content": run.prompt}, {"role": "user", "content": "first"}])).content
    b = await run.tool("lookup", {"q": "b"})
    t1 = (await run.now()).isoformat()
    r1 = await run.random()
    m2 = (await run.model([{"role": "user", "content": "second"}])).content
    paid = await run.tool("charge", {"order": "o-1", "amount": 5})
    return {"code": "v1", "t0": t0, "r0": r0, "a": a, "m1": m1, "b": b, "t1": t1, "r1": r1, "m2": m2, "paid": paid}


def spec() -> AgentSpec:
    return AgentSpec("modes", probe, CountingModel(), tools=TOOLS, prompt=PROMPT)
